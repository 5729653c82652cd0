"""The pause rule (invariant 3) with hysteresis."""

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


def test_pending_batches_keep_the_partition_paused() -> None:
    f = flow()
    f.pending.append(Batch(1, ("t", 0), 0, 1, 0, 0, 1, b""))
    assert wants_pause(f, 0.0, 0.8, 0.4)


def test_blocked_partition_stays_paused() -> None:
    f = flow(blocked="offset 3: boom")
    assert wants_pause(f, 0.0, 0.8, 0.4)
