"""The supervisor side: the one process that is a member of the consumer group.

Runs in: the supervisor process, on one thread (rebalance callbacks run inside ``consume()``
on that same thread; the admin server reads published snapshots from its own thread).

Split by job, each folder importing only the ones below it (pyproject.toml's contracts):

    loop.py       the Supervisor: the loop that tells the story, delegating to rooms
    daemon.py     ``run_daemon``: owns shared memory, workers, the consumer; releases them
    members.py    ``ringmaster run --members N``: the parent of N daemons of the group
    report.py     the status snapshot, built from what each room holds
    group/        the consumer group's story: rebalances, commits, when a batch run is done
    control/      what an operator asks: signals, the control socket, reload/resize, pauses
    datapath/     a record's way from the fetch to its committable offset, and the state each
                  partition holds on the way
    workers/      the worker processes' lives: the workforce's policy, the pool, code snapshots
    seams.py      what the rooms call on the consumer, the pool and its handles (Protocols
                  the real ones and the tests' fakes both fit)

May import: runtime.worker (what a worker runs, to start it), runtime.execution (the dead
letters' format), runtime.ops, runtime.kafka, runtime.transport, runtime.plugin,
runtime.config, runtime.errors. Never runtime.cli, runtime.spark or runtime.redrive.
"""
