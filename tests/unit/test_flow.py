"""Per-partition state and the backpressure rule (invariant 3): hysteresis, holds, reasons."""

from __future__ import annotations

from fakes import TP0, assign, make

from runtime.supervisor.datapath.flowcontrol import wants_flow_pause
from runtime.supervisor.partition.partition import PauseReason


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
    p.hold(PauseReason.OPERATOR, "maintenance")
    p.hold(PauseReason.BACKOFF, "downstream", until=clock.now + 5)
    assert p.held and p.pause_reasons() == [PauseReason.OPERATOR, PauseReason.BACKOFF]
    sup.flow.pause_held()  # as the loop asks after an operator's pause: not at the next reconcile
    assert TP0 in consumer.paused
    clock.now += 4.9
    sup.flow.reconcile()
    assert PauseReason.BACKOFF in p.pause.holds
    clock.now += 0.1
    sup.flow.reconcile()
    assert list(p.pause.holds) == [PauseReason.OPERATOR]
    assert p.release(PauseReason.OPERATOR) and not p.release(PauseReason.OPERATOR)
    assert not p.held


def test_a_hold_renewed_keeps_its_first_since() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.hold(PauseReason.OPERATOR, "a")
    first = clock.now
    clock.now += 4
    p.hold(PauseReason.OPERATOR, "b")
    hold = p.pause.holds[PauseReason.OPERATOR]
    assert hold.since == first and hold.detail == "b"


def test_pause_reasons_list_backpressure_first_then_holds() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.hold(PauseReason.DELIVERY, "broker away")
    p.pause.flow_paused = p.pause.ahead = True  # flow control's own decisions (it owns them)
    assert p.pause_reasons() == [PauseReason.FLOW, PauseReason.AHEAD, PauseReason.DELIVERY]
    assert [str(r) for r in p.pause_reasons()] == ["flow", "uncommitted", "delivery"]


# ---------------------------------------------------------------------- found by mutation testing
def test_a_resize_moves_the_budget_with_the_workers() -> None:
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0])
    before = sup.flow.budget  # pause_above of one ring
    sup.flow.resize(4)
    assert sup.flow.budget == before * 4
    sup.flow.resize(2)
    assert sup.flow.budget == before * 2


def test_records_not_cut_yet_count_against_the_room_a_fetch_asks_for() -> None:
    from fakes import msgs

    sup, consumer, _clock, _pool = make(batch_max_records=1000, batch_max_wait_ms=10_000)
    assign(sup, consumer, [TP0])
    sup.intake.bytes_per_record = 2.0  # room: 0.8 * 1000 bytes = 400 records of 2 bytes
    assert sup.flow.records_wanted() == 400
    sup.partitions[TP0].intake.open_msgs.extend(msgs(TP0, *range(150)))  # 300 bytes waiting to be cut
    assert sup.flow.records_wanted() == 250


def test_a_quiet_runnable_partition_is_resumed_again_once_a_second_not_more() -> None:
    """librdkafka#5591: a resume can be lost; a partition that should fetch and shows no
    activity is resumed again every second, and only then."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.flow.reconcile()
    consumer.calls.clear()
    p = sup.partitions[TP0]
    p.intake.last_activity = p.pause.last_resume = clock.now
    clock.now += 0.5
    sup.flow.reconcile()
    assert ("resume", [TP0]) not in consumer.calls, "half a second: not yet"
    clock.now += 0.6
    sup.flow.reconcile()
    assert ("resume", [TP0]) in consumer.calls
    consumer.calls.clear()
    clock.now += 0.5
    sup.flow.reconcile()
    assert ("resume", [TP0]) not in consumer.calls, "resumed just now: not again within the second"


def test_a_partition_resumed_by_flow_control_remembers_when() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.hold(PauseReason.BACKOFF, "x", until=clock.now + 1)
    clock.now += 1.0
    sup.flow.reconcile()
    assert not p.pause.paused and p.pause.last_resume == clock.now and TP0 not in consumer.paused


def test_a_paused_partition_is_paused_again_once_a_second_and_its_state_is_a_bool() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.hold(PauseReason.OPERATOR, "x")
    sup.flow.reconcile()
    assert p.pause.paused is True
    consumer.calls.clear()
    clock.now += 0.5
    sup.flow.reconcile()
    assert ("pause", [TP0]) not in consumer.calls, "not every tick"
    clock.now += 0.5
    sup.flow.reconcile()
    assert ("pause", [TP0]) in consumer.calls, "re-applied within the second (a lost pause)"
    p.release(PauseReason.OPERATOR)
    sup.flow.reconcile()
    assert p.pause.paused is False


def test_a_partition_with_recent_activity_is_not_resumed_again() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.flow.reconcile()
    p = sup.partitions[TP0]
    p.pause.last_resume = clock.now - 5
    p.intake.last_activity = clock.now - 0.5
    consumer.calls.clear()
    clock.now += 1.0  # a reconcile is due; the partition fetched half a second ago
    p.intake.last_activity = clock.now - 0.5
    sup.flow.reconcile()
    assert ("resume", [TP0]) not in consumer.calls


def test_before_any_assignment_a_fetch_asks_for_one_batch() -> None:
    sup, _consumer, _clock, _pool = make(batch_max_records=300)
    assert sup.flow.records_wanted() == 300


def test_a_partition_resumed_just_now_is_not_resumed_again_by_the_next_second_s_repair() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    sup.flow.reconcile()  # the once-a-second repair ran now
    p.intake.last_activity = clock.now - 10  # no record for a long while
    p.hold(PauseReason.BACKOFF, "x")
    sup.flow.reconcile()  # paused
    clock.now += 0.9
    p.release(PauseReason.BACKOFF)
    sup.flow.reconcile()  # resumed: last_resume is now
    consumer.calls.clear()
    clock.now += 0.1  # the repair is due again, a tenth of a second after the resume
    sup.flow.reconcile()
    assert ("resume", [TP0]) not in consumer.calls
