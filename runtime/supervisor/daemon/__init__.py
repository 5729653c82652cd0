"""The supervisor process as a whole: the loop that tells the story, its wiring, its start
and stop.

    loop.py      the Supervisor: the loop that tells the story, delegating to rooms
    run.py       ``run_daemon``: owns shared memory, workers, the consumer; releases them
    members.py   ``ringmaster run --members N``: the parent of N daemons of the group
    report.py    the status snapshot, built from each room's own snapshot
    waits.py     how long a tick waits, and for what: a worker's result or death, then records

Runs in: the supervisor process (members.py: the parent of N of them). May import every
folder of the supervisor below it.
"""
