"""The shared-memory transport between the supervisor and its workers. Knows nothing of
Kafka: the packer works on whatever message type the adapter binds (packing.bind).

    shm.py        segment lifetime: create 0600, unlink, reclaim after a dead supervisor
    ring.py       the SPSC byte ring, its doorbell (a pipe) and the result-message pipe
    board.py      per-worker status and the partition epoch table in shared memory
    ordered.py    the shared words read in the order they were written (acquire/release in C)
    frames.py     msgpack batch frames (columnar) and result messages
    packing.py    consumed messages → frames (runs, key split, columns)
    speedups.py   the switch between the C speedups (_speedups.c) and their Python twins
    groupmeta.py  the group's metadata (KIP-447), written by the supervisor, read by the workers

Runs in: both sides (the supervisor writes rings and reads results; workers the reverse).
May import: runtime.errors only.
"""
