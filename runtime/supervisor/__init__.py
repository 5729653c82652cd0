"""The supervisor side: the one process that is a member of the consumer group.

Runs in: the supervisor process, on one thread (rebalance callbacks run inside ``consume()``
on that same thread; the admin server reads published snapshots from its own thread).

    loop.py            the Supervisor: the loop that tells the story, delegating to rooms
    daemon.py          ``run_daemon``: owns shared memory, workers, the consumer; releases them
    intake.py          room: fetch, cut batches into frames per lane, dispatch into rings
    assignment.py      room: rebalances, fencing (epochs), releases and rewinds
    workforce.py       room: worker start-up, deaths, restarts, deadlines, recycling
    rollout.py         room: reload (new plugin code, canary, one worker at a time) and resize
    commands.py        room: the control socket's requests and SIGHUP/SIGTTIN/SIGTTOU, one at a time
    flowcontrol.py     room: backpressure, and every pause/resume sent to the client
    commits.py         room: offsets to the group
    deadletter_desk.py room: dead letters the supervisor writes itself (asynchronous, acked)
    isolation.py       what becomes of a batch that crashed its worker (pure)
    partitions.py      per-partition state, the pause rule, the in-flight table
    offsets.py         completion tracking → committable offset (the one rule)
    pool.py            the only module that starts processes
    seams.py           what the rooms call on the consumer, the pool and its handles (Protocols
                       the real ones and the tests' fakes both fit)

May import: runtime.worker (what a worker runs, to start it), runtime.ops, runtime.kafka,
runtime.transport, runtime.plugin, runtime.config, runtime.errors. Never runtime.cli or
runtime.spark.
"""
