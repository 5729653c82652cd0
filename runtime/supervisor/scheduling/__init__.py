"""Which worker runs each batch: the unit of work and the room that schedules it.

    scheduler.py   lanes, round robin, work left per worker; the only writer of rings
    batches.py     the Batch: one frame cut from one lane of a partition
    capacity.py    Capacity: what the workers can take, a value the loop passes on

Runs in: supervisor. May import: the seams; nothing of the partitions, the data path or the
rooms above them.
"""
