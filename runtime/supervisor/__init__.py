"""The supervisor side: the one process that is a member of the consumer group.

Runs in: the supervisor process, on one thread (rebalance callbacks run inside ``consume()``
on that same thread; the admin server reads published snapshots from its own thread).

Split by job into folders, each importing only the ones below it (pyproject.toml's contracts):

    daemon/       the supervisor process: the loop that tells the story (loop.py), its start
                  and stop (run.py), the parent of N daemons (members.py), the status (report.py)
    group/        the consumer group's story: rebalances, commits, when a batch run is done
    control/      what an operator asks: signals, the control socket, reload/resize, pauses
    datapath/     a record's way from the fetch to its committable offset
    partition/    what is held per partition on the way: its parts, its offset tracker
    scheduling/   which worker runs each batch; the Batch, the unit it schedules
    workers/      the worker processes' lives: the workforce's policy, the pool, code snapshots
    seams/        what the rooms call on the consumer, the pool and its handles (Protocols
                  the real ones and the tests' fakes both fit)

May import: runtime.worker (what a worker runs, to start it), runtime.execution (the dead
letters' format), runtime.ops, runtime.kafka, runtime.transport, runtime.plugin,
runtime.config, runtime.errors. Never runtime.cli, runtime.spark or runtime.redrive.
"""
