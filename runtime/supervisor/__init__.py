"""The supervisor side: the one process that is a member of the consumer group.

Runs in: the supervisor process, on one thread (rebalance callbacks run inside ``consume()``
on that same thread; the admin server reads published snapshots from its own thread).

    loop.py            the Supervisor: the loop that tells the story, delegating to rooms
    daemon.py          ``run_daemon``: owns shared memory, workers, the consumer; releases them
    signals.py         what each signal asks for (an intent the loop hands on); handlers only enqueue
    intake.py          room: fetch, cut each partition's run into batches (per lane)
    scheduler.py       room: which worker runs each batch; the only writer of rings
    results.py         room: what workers report, redelivery of a dead worker's batches, dead letters
    rebalance.py       the rebalance story: assign, revoke (fence, collect, commit, forget), lose
    assignment.py      room: the partitions held, fencing (epochs), rewinds
    operator.py        operator pauses (the control topic) applied to this member's partitions
    caught_up.py       ``--until-caught-up``: when a batch run stops and whether it may exit 0
    report.py          the status snapshot, built from what each room holds
    workforce.py       room: worker start-up, deaths, restarts, deadlines, recycling
    rollout.py         room: reload (new plugin code, canary, one worker at a time) and resize
    commands.py        room: the control socket's requests and SIGHUP/SIGTTIN/SIGTTOU, one at a time
    flowcontrol.py     room: backpressure, and every pause/resume sent to the client
    commits.py         room: offsets to the group
    deadletter_desk.py room: dead letters the supervisor writes itself (asynchronous, acked)
    isolation.py       what becomes of a batch that crashed its worker (pure)
    partitions.py      what is held per partition, in parts with one writer each
    batches.py         the Batch: one frame cut from one lane of a partition
    offsets.py         completion tracking → committable offset (the one rule)
    pool.py            the only module that starts processes
    seams.py           what the rooms call on the consumer, the pool and its handles (Protocols
                       the real ones and the tests' fakes both fit)

May import: runtime.worker (what a worker runs, to start it), runtime.ops, runtime.kafka,
runtime.transport, runtime.plugin, runtime.config, runtime.errors. Never runtime.cli or
runtime.spark.
"""
