"""The data path: a record's way through the supervisor, from the fetch to its committable
offset, and the state each partition holds on the way.

    intake.py           what consume() returned, handed to each partition and cut into batches
                        (per lane); records set aside (no ring fits, unreadable): under
                        exactly-once a letter batch
    starts.py           where each partition is read from: its start, a rewind read again
    flowcontrol.py      backpressure; every pause/resume sent to the client
    results.py          what a report, a death or a delivered dead letter means, as effects
    effects.py          those effects, as values (Complete, Rewind, Block, Isolate, Letter, ...)
    applier.py          the one place effects are applied; the result pipes read
    release.py          what a release asks of the data path: fence, join, terminate, forget
    isolation.py        what becomes of a batch that crashed its worker (pure); under
                        exactly-once its record's letter as a batch for a worker's transaction
    deadletter_desk.py  dead letters the supervisor writes itself (asynchronous, acked)

Runs in: supervisor. May import: the partitions' parts (partition/), the scheduler
(scheduling/), the workers' rooms (results tells the workforce what each worker reported,
and redelivers the batches of the deaths it names) and the seams; never the group's rooms,
the operator's or the wiring above them.
"""
