"""What the supervisor holds for each assigned partition.

    partition.py         one partition and its life: its parts, changed by its own methods
    table.py             the partitions held, their slots, those held over capacity
    offsets.py           completion tracking → committable offset (the one rule)
    acknowledgements.py  a share group's tracker: each record accepted or released

Runs in: supervisor. May import: the scheduling rooms, the workers' rooms and the seams;
never the data path's rooms, the group's, the operator's or the wiring above them.
"""
