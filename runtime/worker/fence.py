"""The worker's fence check: whether the frame at the head of its ring may run (invariant 5).
Runs in: a worker, once per frame, before it decodes the frame.

A frame carries the epoch its partition had when it was cut. The supervisor fences a
partition (revocation, loss, a rewind) by writing a new epoch for its slot in the epoch
table; a frame of an older epoch is skipped. A worker also holds back the rest of a
partition's frames itself once one of its batches was deferred or blocked: the supervisor
will fence that epoch and read the partition again, so later frames must not run meanwhile.
"""

from __future__ import annotations

from typing import Protocol

from runtime.transport.board import Board, EpochTable


class ScopedLock(Protocol):
    """The worker's lock (runtime.transport.board.BoardLock), shared with the supervisor, as the
    worker takes it: for the length of a ``with`` block."""

    def __enter__(self) -> object: ...
    def __exit__(self, *exc: object) -> None: ...


class FenceCheck:
    def __init__(self, epochs: EpochTable, board: Board, lock: ScopedLock) -> None:
        self._epochs = epochs
        self._board = board
        self._lock = lock
        self._held: dict[int, int] = {}  # slot -> the epoch whose later frames must not run

    def admit(self, batch_id: int, slot: int, epoch: int) -> bool:
        """True: the frame is live and now marked in progress on the board (run it). False:
        it is fenced (skip it and report FENCED)."""
        # RACE: revocation bumps the epoch and then reads the batch in progress under this
        # same lock. Either we see the new epoch here and skip the frame, or the supervisor
        # sees the batch we begin here and waits for it: never both missed (invariant 5).
        with self._lock:
            live = self._epochs.get(slot) == epoch and self._held.get(slot) != epoch
            if live:
                self._board.begin(batch_id, slot)
        return live

    def hold(self, slot: int, epoch: int) -> None:
        """A batch of this epoch was deferred or blocked: skip its partition's later frames
        until the supervisor fences it (a new epoch) and cuts them again."""
        self._held[slot] = epoch
