"""Per-partition state and the backpressure rule (invariant 3): hysteresis, holds, reasons."""

from __future__ import annotations

from fakes import TP0, assign, make

from runtime.supervisor.flowcontrol import wants_flow_pause
from runtime.supervisor.partitions import PauseReason


def test_pause_at_the_share_and_resume_below_its_low_watermark() -> None:
    # share 1000 bytes; pause_above 0.8 / resume_below 0.4: resume below 500
    assert not wants_flow_pause(False, 999, 1000, 0.8, 0.4)
    assert wants_flow_pause(False, 1000, 1000, 0.8, 0.4)
    assert wants_flow_pause(True, 600, 1000, 0.8, 0.4), "hysteresis: stays paused between the watermarks"
    assert not wants_flow_pause(True, 500, 1000, 0.8, 0.4)


def test_holds_pause_until_released_or_expired_and_say_why() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    sup.flow.hold(p, PauseReason.OPERATOR, "maintenance")
    sup.flow.hold(p, PauseReason.BACKOFF, "downstream", until=clock.now + 5)
    assert p.held and p.pause_reasons() == [PauseReason.OPERATOR, PauseReason.BACKOFF]
    assert TP0 in consumer.paused, "a hold stops fetching at once, not at the next reconcile"
    clock.now += 4.9
    sup.flow.reconcile()
    assert PauseReason.BACKOFF in p.pause.holds
    clock.now += 0.1
    sup.flow.reconcile()
    assert list(p.pause.holds) == [PauseReason.OPERATOR]
    assert sup.flow.release(p, PauseReason.OPERATOR) and not sup.flow.release(p, PauseReason.OPERATOR)
    assert not p.held


def test_a_hold_renewed_keeps_its_first_since() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    sup.flow.hold(p, PauseReason.OPERATOR, "a")
    first = clock.now
    clock.now += 4
    sup.flow.hold(p, PauseReason.OPERATOR, "b")
    hold = p.pause.holds[PauseReason.OPERATOR]
    assert hold.since == first and hold.detail == "b"


def test_pause_reasons_list_backpressure_first_then_holds() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    sup.flow.hold(p, PauseReason.DELIVERY, "broker away")
    p.pause.flow_paused = p.pause.ahead = True  # flow control's own decisions (it owns them)
    assert p.pause_reasons() == [PauseReason.FLOW, PauseReason.AHEAD, PauseReason.DELIVERY]
    assert [str(r) for r in p.pause_reasons()] == ["flow", "uncommitted", "delivery"]
