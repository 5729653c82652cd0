"""runtime.worker.fence.FenceCheck, the worker's side of invariant 5, against the real
epoch table and board in memory, and against the supervisor's side of the race (what
rebalance.py reads under the same lock): a frame of an old epoch never runs, a frame that
runs is on the board before the lock is let go, and a partition whose batch was deferred
or blocked runs nothing more of that epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.supervisor.datapath.release import _batches_in_progress
from runtime.transport.board import BOARD_BYTES, Board, BoardLock, EpochTable
from runtime.worker.fence import FenceCheck


class WatchedLock:
    """A lock that remembers whether it is held, so a test can see what ran inside it."""

    def __init__(self) -> None:
        self.held = False
        self.entered = 0

    def __enter__(self) -> WatchedLock:
        assert not self.held, "not re-entrant"
        self.held = True
        self.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.held = False


class WatchedEpochs(EpochTable):
    def __init__(self, lock: WatchedLock, slots: int = 8) -> None:
        super().__init__(memoryview(bytearray(8 * slots)))
        self.lock = lock
        self.reads_outside_lock = 0

    def get(self, slot: int) -> int:
        self.reads_outside_lock += not self.lock.held
        return super().get(slot)


class WatchedBoard(Board):
    def __init__(self, lock: WatchedLock) -> None:
        super().__init__(memoryview(bytearray(BOARD_BYTES)))
        self.lock = lock
        self.begun_outside_lock = 0

    def begin(self, batch_id: int, slot: int) -> None:
        self.begun_outside_lock += not self.lock.held
        super().begin(batch_id, slot)


def fence_check() -> tuple[FenceCheck, WatchedEpochs, WatchedBoard, WatchedLock]:
    lock = WatchedLock()
    epochs, board = WatchedEpochs(lock), WatchedBoard(lock)
    board.reset()
    return FenceCheck(epochs, board, lock), epochs, board, lock


def test_a_frame_of_the_current_epoch_runs_and_is_on_the_board() -> None:
    fence, epochs, board, _ = fence_check()
    epochs.set(3, 7)
    assert fence.admit(41, 3, 7)
    assert board.current == (41, 3), "the supervisor sees the batch in progress"


@pytest.mark.parametrize("frame_epoch", [6, 8, 0])
def test_a_frame_of_any_other_epoch_is_skipped_and_the_board_stays_idle(frame_epoch: int) -> None:
    fence, epochs, board, _ = fence_check()
    epochs.set(3, 7)
    assert not fence.admit(41, 3, frame_epoch)
    assert board.current == (0, -1), "a skipped frame is never marked in progress"


def test_the_epoch_is_read_and_the_batch_marked_under_the_lock() -> None:
    """The race is decided by the lock: reading the epoch or marking the batch outside it
    lets a revocation bump the epoch in between and miss the batch."""
    fence, epochs, board, lock = fence_check()
    epochs.set(1, 5)
    assert fence.admit(9, 1, 5)
    assert not fence.admit(10, 1, 4)
    assert lock.entered == 2
    assert epochs.reads_outside_lock == 0 and board.begun_outside_lock == 0


def test_a_fence_between_two_frames_stops_the_second() -> None:
    fence, epochs, board, _ = fence_check()
    epochs.set(2, 1)
    assert fence.admit(1, 2, 1)
    board.end(10)
    epochs.set(2, 2)  # the supervisor fences the partition (revocation, rewind)
    assert not fence.admit(2, 2, 1), "a queued frame of the old epoch"
    assert fence.admit(3, 2, 2), "a frame cut after the fence"


def test_after_a_deferred_or_blocked_batch_the_rest_of_its_epoch_is_held_until_fenced() -> None:
    fence, epochs, _board, _ = fence_check()
    epochs.set(4, 11)
    epochs.set(5, 11)
    assert fence.admit(1, 4, 11)
    fence.hold(4, 11)  # batch 1 was deferred: the supervisor will rewind the partition
    assert not fence.admit(2, 4, 11), "the next frame of that partition waits for the rewind"
    assert fence.admit(3, 5, 11), "another partition's frames go on"
    epochs.set(4, 12)
    assert fence.admit(4, 4, 12), "once fenced and cut again, the partition runs"


def test_either_the_worker_skips_the_frame_or_the_supervisor_sees_it_running(tmp_path: Path) -> None:
    """Both sides of the race with the real lock: the supervisor's reading of the batch in
    progress (rebalance._batches_in_progress) after its fence, and the worker's check."""
    seg = tmp_path / "worker.seg"
    seg.write_bytes(bytes(BOARD_BYTES))
    epochs = EpochTable(memoryview(bytearray(8 * 4)))
    board = Board(memoryview(bytearray(BOARD_BYTES)))
    board.reset()
    worker_lock, supervisor_lock = BoardLock(seg), BoardLock(seg)
    fence = FenceCheck(epochs, board, worker_lock)

    class Handle:
        pass

    h = Handle()
    h.lock, h.board = supervisor_lock, board  # type: ignore[attr-defined]
    try:
        epochs.set(0, 1)
        # The worker checks first: it runs, and the fence that follows sees it.
        assert fence.admit(7, 0, 1)
        epochs.set(0, 2)
        assert _batches_in_progress(h) == [(7, 0)]  # type: ignore[arg-type]
        board.end(1)
        # The fence first: the worker's check skips the next frame of epoch 1.
        epochs.set(0, 3)
        assert not fence.admit(8, 0, 2)
        assert _batches_in_progress(h) == []  # type: ignore[arg-type]
        # Pipelined delivery: a batch handed over, its outputs in flight, while the next runs:
        # the supervisor sees both (issue 41).
        epochs.set(1, 1)
        assert fence.admit(9, 1, 1)
        board.hand_over()
        assert fence.admit(10, 0, 3)
        assert sorted(_batches_in_progress(h)) == [(9, 1), (10, 0)]  # type: ignore[arg-type]
    finally:
        worker_lock.close()
        supervisor_lock.close()
