"""The pause rule (invariant 3) with hysteresis, over a worker's backlog: the bytes in its
ring plus the frames waiting for room in it."""

from __future__ import annotations

from runtime.flow import Batch, PartitionFlow, wants_pause


def flow(**kw: object) -> PartitionFlow:
    return PartitionFlow(("t", 0), 0, 1, 0, **kw)  # type: ignore[arg-type]


def test_pause_above_high_watermark_and_resume_below_low() -> None:
    f = flow()
    assert not wants_pause(f, 0.5, 0.8, 0.4)
    assert wants_pause(f, 0.85, 0.8, 0.4)
    f.paused = True
    assert wants_pause(f, 0.6, 0.8, 0.4), "hysteresis: stays paused between the watermarks"
    assert not wants_pause(f, 0.3, 0.8, 0.4)


def test_pending_frames_are_counted_in_bytes() -> None:
    f = flow()
    f.pending.extend([Batch(1, ("t", 0), 0, 1, 0, 0, 1, b"x" * 300),
                      Batch(2, ("t", 0), 0, 1, 1, 1, 1, b"y" * 50)])
    assert f.pending_bytes == 350 and not f.idle


def test_blocked_partition_stays_paused() -> None:
    f = flow(blocked="offset 3: boom")
    assert wants_pause(f, 0.0, 0.8, 0.4)
