"""Per-partition state: the backpressure rule (invariant 3) with hysteresis, holds, lanes."""

from __future__ import annotations

from collections import deque

from runtime.flow import AHEAD, BACKOFF, FLOW, OPERATOR, Batch, InFlight, PartitionFlow, wants_flow_pause


def flow() -> PartitionFlow:
    return PartitionFlow(("t", 0), 0, 1, 0)


def test_pause_above_high_watermark_and_resume_below_low() -> None:
    assert not wants_flow_pause(False, 0.5, 0.8, 0.4)
    assert wants_flow_pause(False, 0.85, 0.8, 0.4)
    assert wants_flow_pause(True, 0.6, 0.8, 0.4), "hysteresis: stays paused between the watermarks"
    assert not wants_flow_pause(True, 0.3, 0.8, 0.4)


def test_pending_frames_are_counted_per_lane_in_bytes() -> None:
    f = flow()
    f.lanes[0] = deque([Batch(1, ("t", 0), 0, 1, 0, 0, 1, b"x" * 300, 0)])
    f.lanes[1] = deque([Batch(2, ("t", 0), 0, 1, 1, 1, 1, b"y" * 50, 1)])
    assert f.pending_bytes_by_lane() == {0: 300, 1: 50} and f.pending() == 2 and not f.idle


def test_holds_pause_until_released_or_expired_and_say_why() -> None:
    f = flow()
    f.hold(OPERATOR, "maintenance", now=10.0)
    f.hold(BACKOFF, "downstream", now=10.0, until=15.0)
    f.flow_paused = True
    f.ahead = True
    assert f.wants_pause() and f.pause_reasons() == [FLOW, AHEAD, OPERATOR, BACKOFF]
    assert [h.reason for h in f.expire_holds(14.9)] == []
    assert [h.reason for h in f.expire_holds(15.0)] == [BACKOFF]
    assert f.release(OPERATOR) and not f.release(OPERATOR)
    f.flow_paused = f.ahead = False
    assert not f.wants_pause()


def test_a_hold_renewed_keeps_its_first_since() -> None:
    f = flow()
    f.hold(OPERATOR, "a", now=1.0)
    f.hold(OPERATOR, "b", now=5.0)
    assert f.holds[OPERATOR].since == 1.0 and f.holds[OPERATOR].detail == "b"


def test_in_flight_batches_are_per_worker_and_dropped_per_partition() -> None:
    t = InFlight(2)
    a = Batch(1, ("t", 0), 0, 1, 0, 9, 10, b"", 0)
    b = Batch(2, ("t", 1), 1, 1, 0, 9, 10, b"", 0)
    c = Batch(3, ("t", 0), 0, 1, 10, 19, 10, b"", 1)
    for w, x in ((0, a), (0, b), (1, c)):
        t.add(w, x)
    assert t.has(("t", 0)) and t.has(("t", 1)) and t.contains(1, 3)
    t.drop_partition(("t", 0))
    assert not t.has(("t", 0)) and t.count(0) == 1 and t.take_all(0) == [b] and t.count(0) == 0
