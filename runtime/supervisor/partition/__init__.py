"""What the supervisor holds for each assigned partition.

    partition.py         the partition's parts, each with one writer
    offsets.py           completion tracking → committable offset (the one rule)
    acknowledgements.py  a share group's tracker: each record accepted or released

Runs in: supervisor. May import: the scheduling rooms, the workers' rooms and the seams;
never the data path's rooms, the group's, the operator's or the wiring above them.
"""
