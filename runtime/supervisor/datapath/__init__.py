"""The data path: a record's way through the supervisor, from the fetch to its committable
offset, and the state each partition holds on the way.

    assignment.py       the partitions held: slots and epochs (fencing), rewinds, seeks
    intake.py           fetch, cut each partition's run into batches (per lane); records set
                        aside (no ring fits, unreadable): under exactly-once a letter batch
    flowcontrol.py      holds, backpressure, every pause/resume sent to the client
    results.py          what workers report, redelivery of a dead worker's batches, dead letters
    isolation.py        what becomes of a batch that crashed its worker (pure); under
                        exactly-once its record's letter as a batch for a worker's transaction
    deadletter_desk.py  dead letters the supervisor writes itself (asynchronous, acked)

Runs in: supervisor. May import: the partitions' parts (partition/), the scheduler
(scheduling/), the workers' rooms (results tells the workforce what each worker reported,
and redelivers the batches of the deaths it names) and the seams; never the group's rooms,
the operator's or the wiring above them.
"""
