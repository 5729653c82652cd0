"""Small tables in shared memory that the supervisor reads without asking a worker.

* :class:`Board` – one per worker: what it is doing now (batch, since when), its
  heartbeat and counters. Written by the worker, read by the supervisor.
* :class:`EpochTable` – one per run: the current epoch of each partition slot. Written by
  the supervisor (fencing on revoke), read by workers before they start a batch.

All fields are native 8-byte words, written with single aligned stores. A word that tells the
reader the others are valid (the batch in progress, the phase) is written last with release
and read first with acquire ordering (ordered.py); the fence's words are also under BoardLock.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from runtime.transport.ordered import ordered_access

BOARD_BYTES = 128
# Word 2 is free (it held a batch's start, which nobody read: a phase's start serves).
(_CURRENT_BATCH, _CURRENT_SLOT, _FREE, _HEARTBEAT_NS, _BATCHES, _RECORDS, _READY, _PHASE,
 _PHASE_NS, _DELIVERING_BATCH, _DELIVERING_SLOT) = range(11)
# What a worker is doing: only time spent in the plugin (CALL) counts towards a batch's
# deadline; waiting for the broker (DELIVER), for a retry (WAIT) or for its transaction's
# commit (COMMIT, exactly-once), for the partition's committed offset before the batch
# (OFFSETS) or for a new producer's transactions to start (FENCE: its init_transactions, which
# fences what the transactional id left open) does not: each has its own bound (workforce.py).
# SETTLE: waiting for the broker to acknowledge the outputs of the batch handed over
# (``hand_over``), whose the time is then, whatever batch is in progress.
(PHASE_IDLE, PHASE_CALL, PHASE_DELIVER, PHASE_WAIT, PHASE_COMMIT, PHASE_SETTLE, PHASE_OFFSETS,
 PHASE_FENCE) = range(8)
# What a worker is doing in each phase of a batch (for the log, the kill's reason and the dead
# letter of a worker that died in it). A batch begins in PHASE_CALL (its frame is decoded there
# too) and ends idle while its result is sent.
DOING = {PHASE_CALL: "reading the batch or running the plugin",
         PHASE_DELIVER: "delivering outputs or dead letters", PHASE_WAIT: "waiting to retry",
         PHASE_COMMIT: "committing its transaction",
         PHASE_OFFSETS: "reading its partition's committed offset", PHASE_FENCE: "starting its transactions",
         PHASE_SETTLE: "waiting for the broker to acknowledge its outputs", PHASE_IDLE: "reporting the batch"}


class Board:
    def __init__(self, region: memoryview) -> None:
        self._w = region[:BOARD_BYTES].cast("q")
        self._acquire, self._publish = ordered_access(self._w)

    # worker side
    def begin(self, batch_id: int, slot: int) -> None:
        self._w[_PHASE_NS] = time.monotonic_ns()
        self._w[_PHASE] = PHASE_CALL
        self._w[_CURRENT_SLOT] = slot
        self._publish(_CURRENT_BATCH, batch_id)  # the batch's other words are seen with it

    def set_phase(self, phase: int) -> None:
        # The time is stored before the phase: a reader that sees the new phase sees its time.
        self._w[_PHASE_NS] = time.monotonic_ns()
        self._publish(_PHASE, phase)

    def end(self, records: int) -> None:
        self._w[_CURRENT_BATCH] = 0
        self._w[_CURRENT_SLOT] = -1
        self._w[_PHASE] = 0
        self._w[_BATCHES] += 1
        self._w[_RECORDS] += records

    def hand_over(self) -> None:
        """The batch in progress is done with the plugin and its outputs are in flight
        (pipelined delivery, runtime/worker/batch_runner.py): it stays on the board as the one
        delivering, while the worker begins another. RACE: written before the batch in
        progress is cleared, and read after it (``in_progress``), so that a reader sees the
        batch in one of the two."""
        self._w[_DELIVERING_SLOT] = self._w[_CURRENT_SLOT]
        self._publish(_DELIVERING_BATCH, self._w[_CURRENT_BATCH])
        self._w[_PHASE] = 0
        self._w[_CURRENT_SLOT] = -1
        self._publish(_CURRENT_BATCH, 0)

    def delivered(self, records: int) -> None:
        """The batch handed over is settled: reported, its outputs acknowledged or not."""
        self._w[_DELIVERING_BATCH] = 0
        self._w[_DELIVERING_SLOT] = -1
        self._w[_BATCHES] += 1
        self._w[_RECORDS] += records

    def beat(self) -> None:
        self._w[_HEARTBEAT_NS] = time.monotonic_ns()

    def set_ready(self) -> None:
        self._w[_READY] = 1

    # supervisor side
    def reset(self) -> None:
        for i in range(len(self._w)):
            self._w[i] = 0
        self._w[_CURRENT_SLOT] = -1
        self._w[_DELIVERING_SLOT] = -1
        self._w[_HEARTBEAT_NS] = time.monotonic_ns()  # a new incarnation starts with a fresh beat

    @property
    def current(self) -> tuple[int, int]:
        """(batch_id, slot) in progress; batch_id 0 when idle."""
        batch = self._acquire(_CURRENT_BATCH)
        return batch, self._w[_CURRENT_SLOT]

    def in_progress(self) -> list[tuple[int, int]]:
        """(batch_id, slot) of every batch the worker has begun and not reported: the one in
        progress and the one whose outputs are in flight (``hand_over``), as far as they are."""
        out = []
        batch = self._acquire(_CURRENT_BATCH)
        if batch:
            out.append((batch, self._w[_CURRENT_SLOT]))
        delivering = self._acquire(_DELIVERING_BATCH)
        if delivering:
            out.append((delivering, self._w[_DELIVERING_SLOT]))
        return out

    def in_phase_for_s(self, phase: int) -> float:
        """How long the worker has been in ``phase`` of its current batch (0 if it is not)."""
        if self._acquire(_CURRENT_BATCH) == 0 or self._acquire(_PHASE) != phase:
            return 0.0
        return max(0.0, (time.monotonic_ns() - self._w[_PHASE_NS]) / 1e9)

    @property
    def phase(self) -> int:
        return self._acquire(_PHASE) if self._acquire(_CURRENT_BATCH) else 0

    @property
    def settling(self) -> int:
        """The batch handed over whose acknowledgements the worker is waiting for now (0: none)."""
        delivering = self._acquire(_DELIVERING_BATCH)
        return delivering if delivering and self._acquire(_PHASE) == PHASE_SETTLE else 0

    @property
    def delivering(self) -> int:
        """The batch handed over, its outputs in flight (0: none)."""
        return self._acquire(_DELIVERING_BATCH)

    @property
    def heartbeat_age_s(self) -> float:
        return (time.monotonic_ns() - self._w[_HEARTBEAT_NS]) / 1e9

    @property
    def batches(self) -> int:
        return self._w[_BATCHES]

    @property
    def records(self) -> int:
        return self._w[_RECORDS]

    @property
    def ready(self) -> bool:
        return self._w[_READY] == 1

    def release(self) -> None:
        self._w.release()


class EpochTable:
    def __init__(self, region: memoryview) -> None:
        self._e = region.cast("q")
        self.slots = len(self._e)

    def get(self, slot: int) -> int:
        return self._e[slot]

    def set(self, slot: int, epoch: int) -> None:
        self._e[slot] = epoch

    def release(self) -> None:
        self._e.release()


class BoardLock:
    """Mutual exclusion between a worker and the supervisor for "check the epoch, mark the
    batch in progress" / "bump the epoch, read the batch in progress" (see runtime/worker/fence.py).

    An fcntl record lock on the first byte of the worker's segment file: the kernel
    releases it when its holder dies, so a worker SIGKILLed inside the critical section
    cannot wedge the supervisor, and no named object is left in /dev/shm. The syscalls
    also order memory between the two processes. Record locks belong to a process and
    file: the segment's other descriptors are closed right after mapping, never later.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(Path(path), os.O_RDWR)

    def acquire(self, timeout: float | None = None) -> bool:
        if timeout is None:
            fcntl.lockf(self._fd, fcntl.LOCK_EX, 1, 0)
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
                return True
            except (BlockingIOError, PermissionError):
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.0005)

    def release(self) -> None:
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, 0)

    def __enter__(self) -> BoardLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def close(self) -> None:
        os.close(self._fd)
