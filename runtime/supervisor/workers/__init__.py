"""The worker processes' lives, as the supervisor runs them.

    workforce.py   the policy: start-up, deaths, restarts, deadlines, heartbeats, recycling
    pool.py        the only module that starts processes: spawn, reap, kill, stop
    snapshots.py   a copy of the plugin's source per code generation (a rollback holds)

Runs in: supervisor. May import: the seams, and runtime.worker (what a worker runs, to start
it); nothing of the data path, the group or the operator's rooms.
"""
