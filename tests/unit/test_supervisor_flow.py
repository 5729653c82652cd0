"""The supervisor's rooms with fakes: invariants 1, 3, 4, 5 and the failure model's holds.
The consumer fake, like librdkafka, starts every new assignment fetching and can lose a
resume; rings have the fill a test gives them."""

from __future__ import annotations

from typing import Any

from fakes import TP0, TP1, assign, make, msgs

from runtime.flow import BACKOFF, BLOCKED, DELIVERY, OPERATOR, Batch
from runtime.frames import BLOCKED as R_BLOCKED
from runtime.frames import DEFERRED, DONE, FENCED, Result
from runtime.kafka import Fetched


def test_assignment_to_a_full_ring_is_paused_at_once() -> None:
    sup, consumer, _, _ = make(fill=0.95)
    assign(sup, consumer, [TP0, TP1])
    assert consumer.paused == {TP0, TP1}
    assert all(f.paused for f in sup.flows.values())


def test_incremental_assignment_keeps_existing_pauses_and_pauses_the_new() -> None:
    sup, consumer, clock, _pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    consumer.paused.clear()  # the client forgot the pause across the rebalance
    assign(sup, consumer, [TP1])
    assert TP1 in consumer.paused
    clock.now += 1.5
    sup.flow_control.reconcile()
    assert consumer.paused == {TP0, TP1}, "the periodic reconcile re-applies forgotten pauses"


def test_resume_on_drain_with_hysteresis() -> None:
    sup, consumer, _clock, pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    pool.handles[0].ring.fill_value = 0.5
    sup.flow_control.reconcile()
    assert TP0 in consumer.paused, "between the watermarks: still paused"
    pool.handles[0].ring.fill_value = 0.1
    sup.flow_control.reconcile()
    assert TP0 not in consumer.paused


def test_frames_waiting_for_a_ring_count_towards_its_fill() -> None:
    """Invariant 3: the pending backlog is bounded because it counts as ring fill; a small
    overflow (a frame that did not fit yet) pauses nothing, since a pause makes librdkafka
    drop and later refetch what it had prefetched."""
    sup, consumer, _clock, pool = make(fill=0.5)
    assign(sup, consumer, [TP0, TP1])
    lane = sup.flows[TP0].lanes.setdefault(0, __import__("collections").deque())
    lane.append(Batch(1, TP0, 0, 1, 0, 9, 10, b"f" * 100, 0))  # 0.5 + 0.1 of the ring
    sup.flow_control.reconcile()
    assert not consumer.paused, "below pause_above with the backlog: keep fetching"
    lane.append(Batch(2, TP0, 0, 1, 10, 19, 10, b"f" * 250, 0))  # 0.85 with the backlog
    sup.flow_control.reconcile()
    assert consumer.paused == {TP0, TP1}, "the worker's backlog is over pause_above: all its partitions"
    pool.handles[0].ring.fill_value = 0.1
    sup.flow_control.reconcile()
    assert consumer.paused == {TP0, TP1}, "0.1 + 0.35 pending is still above resume_below"
    pool.handles[0].ring.fill_value = 0.0
    sup.flow_control.reconcile()
    assert not consumer.paused, "0.35 with the backlog: below resume_below, resumed"


def test_a_fetch_asks_for_no_more_than_the_rings_can_take() -> None:
    sup, consumer, _clock, pool = make(fill=0.5)
    assign(sup, consumer, [TP0, TP1])
    assert sup.intake.records_wanted() == 1000, "nothing learnt yet: a batch per partition"
    sup.intake.bytes_per_record = 2.0  # room: (0.8 - 0.5) * 1000 bytes = 150 records of 2 bytes
    assert sup.intake.records_wanted() == 150
    pool.handles[0].ring.fill_value = 0.95
    assert sup.intake.records_wanted() == 100, "full rings: still a minimal fetch, never zero"


def _in_flight(sup: Any, tp: Any, bid: int, first: int, last: int, worker: int = 0) -> Batch:
    flow = sup.flows[tp]
    flow.tracker.register(bid, first, last)
    b = Batch(bid, tp, flow.slot, flow.epoch, first, last, last - first + 1, b"", worker)
    sup.in_flight.add(worker, b)
    return b


def test_the_batch_a_revocation_waits_for_is_committed_with_it() -> None:
    """Invariants 1 and 5: the fence bumps the epoch before waiting for the batch in
    progress; that batch's DONE comes back with the old epoch and must still count, or the
    revocation commits nothing of what it waited for (and a result of a partition already
    released must count for nothing)."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    flow = sup.flows[TP0]
    old_epoch = flow.epoch
    _in_flight(sup, TP0, 7, 0, 9)
    flow.epoch = sup.assignment.slots.fence(flow.slot)  # what release() does first
    sup._on_result(pool.handles[0], Result(DONE, 7, flow.slot, old_epoch, processed=10))
    assert flow.tracker.committable == 10, "the batch in progress at the fence is committed"
    flow.tracker.register(8, 10, 14)
    sup._on_result(pool.handles[0], Result(DONE, 8, flow.slot, old_epoch, processed=5))
    assert flow.tracker.committable == 10, "a batch that is not in flight completes nothing"


def test_a_lost_resume_is_repaired_within_a_second() -> None:
    sup, consumer, clock, pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    pool.handles[0].ring.fill_value = 0.0
    consumer.ignore_next_resume = True
    sup.flow_control.reconcile()
    assert TP0 in consumer.paused, "the fake client lost the resume"
    clock.now += 1.0
    sup.flow_control.reconcile()
    assert TP0 not in consumer.paused, "a runnable partition is fetching again within 1 s"


def test_an_idle_partition_at_its_end_is_not_poked() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.flows[TP0].eof_at = 10
    consumer.calls.clear()
    clock.now += 5
    sup.flow_control.reconcile()
    assert ("resume", [TP0]) not in consumer.calls


def test_a_refused_asynchronous_commit_is_sent_again_even_without_progress() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    tracker = sup.flows[TP0].tracker
    tracker.register(1, 0, 9)
    tracker.complete(1)
    sup.commits.commit(list(sup.flows.values()), asynchronous=True)
    assert consumer.commits == [{TP0: 10}]
    consumer.refused = {TP0: 10}  # e.g. REBALANCE_IN_PROGRESS, reported by on_commit
    sup.commits.commit(list(sup.flows.values()), asynchronous=True)
    assert consumer.commits[-1] == {TP0: 10}, "the refused offset is committed again"
    sup.commits.commit(list(sup.flows.values()), asynchronous=True)
    assert len(consumer.commits) == 2, "and only until it is accepted"


def test_rows_and_eof_in_the_same_consume_mean_caught_up() -> None:
    """One consume() may return a partition's last records and its EOF event together."""
    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])
    sup.assignment.touched.clear()
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 0, 1)}, eof={TP0: 2}, count=2)
    sup.fetch()
    assert sup.flows[TP0].eof_at == 2
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 2)}, eof={TP0: 2}, count=1)
    sup.fetch()
    assert sup.flows[TP0].eof_at is None, "an EOF older than the newest record does not count"


def test_records_straddling_a_rebalance_are_dropped_and_the_partition_restarts_at_its_commit() -> None:
    """confluent-kafka-python#1013: one consume() returns records fetched before a revoke +
    assign of the same partition (past the commit) and records restarting at the commit."""
    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])
    sup.assignment.touched.clear()

    def consume_with_rebalance(n: int, t: float) -> Fetched:
        sup.assignment.on_revoke([TP0])
        consumer.assign([TP0])
        sup.assignment.on_assign([TP0])
        stale, fresh = msgs(TP0, 500, 501), msgs(TP0, 200)
        return Fetched(runs={TP0: stale + fresh, TP1: msgs(TP1, 7)}, count=4)

    consumer.next_fetch = consume_with_rebalance
    sup.flows[TP0].tracker.register(1, 0, 9)
    sup.fetch()  # must not raise "goes backwards"
    assert sup.flows[TP0].open_msgs == [], "nothing of the straddling call is kept"
    assert consumer.started == [[TP0]], "the partition restarts at its committed offset"


def test_a_committed_offset_the_broker_does_not_give_holds_the_partition_and_is_tried_again() -> None:
    """Issue: committed() timing out during the straddle repair raised out of the loop."""
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    consumer.seek_fails = {TP0}
    consumer.next_fetch = lambda n, t: Fetched()
    sup.fetch()  # the assignment touched TP0: its start offset is looked up, and fails
    flow = sup.flows[TP0]
    assert "seeking" in flow.holds and flow.wants_pause()
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 0, 1)}, count=2)
    sup.fetch()
    assert flow.open_msgs == [], "records from an unknown position are not processed"
    consumer.seek_fails.clear()
    consumer.next_fetch = lambda n, t: Fetched()
    sup.fetch()
    assert "seeking" not in flow.holds, "tried again, and released once it worked"


def test_holds_are_never_resumed_by_flow_control_and_timed_ones_expire() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    sup.flows[TP0].hold(OPERATOR, "maintenance", clock.now)
    sup.flows[TP1].hold(BACKOFF, "downstream", clock.now, until=clock.now + 3)
    for _ in range(5):
        clock.now += 1.0
        sup.flow_control.reconcile()
        assert TP0 in consumer.paused, "an operator pause outlives any reconcile"
    assert TP1 not in consumer.paused, "the back-off ended after 3 s and the partition resumed"


def test_a_deferred_batch_is_read_again_from_its_first_record_once_its_batches_are_back() -> None:
    """Issue 9.3: an output outage is not the records' fault: no crash count, no dead
    letter, nothing committed past the batch; the partition waits, then reads it again."""
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    flow = sup.flows[TP0]
    _in_flight(sup, TP0, 1, 0, 9)
    b2 = _in_flight(sup, TP0, 2, 10, 19)
    _in_flight(sup, TP0, 3, 20, 29)
    h = pool.handles[0]
    sup._on_result(h, Result(DONE, 1, flow.slot, flow.epoch, processed=10))
    sup._on_result(h, Result(DEFERRED, 2, flow.slot, b2.epoch, detail="broker away", cause="delivery"))
    assert DELIVERY in flow.holds and flow.rewinding and TP0 in consumer.paused
    sup.assignment.advance_rewinds()
    assert consumer.seeks == [], "batch 3 is still out in the ring: no seek yet"
    sup._on_result(h, Result(FENCED, 3, flow.slot, b2.epoch))  # the worker skipped it
    sup.assignment.advance_rewinds()
    assert consumer.seeks == [(TP0, 10)], "read again from the deferred batch's first record"
    assert flow.tracker.committable == 10 and not flow.rewinding
    clock.now += 0.5
    sup.flow_control.reconcile()
    assert TP0 in consumer.paused, "still backing off"
    clock.now += 1.0
    sup.flow_control.reconcile()
    assert TP0 not in consumer.paused, "back-off over: fetching again"
    sup.commits.commit(list(sup.flows.values()), asynchronous=False)
    assert consumer.commits[-1] == {TP0: 10}, "nothing past the deferred batch is committed"


def test_a_backoff_for_every_partition_holds_them_all() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0, TP1])
    b = _in_flight(sup, TP0, 1, 0, 9)
    sup._on_result(pool.handles[0], Result(DEFERRED, 1, b.slot, b.epoch, detail="x", cause="backoff",
                                           delay_ms=2000, scope="all"))
    assert all(BACKOFF in f.holds for f in sup.flows.values())
    assert consumer.paused == {TP0, TP1}


def test_a_blocked_partition_drops_its_queued_frames_so_they_do_not_pause_its_worker() -> None:
    """Issue 9.6: a blocked partition's pending frames kept counting towards its worker's
    fill, so healthy partitions of that worker could stay paused forever."""
    import collections

    sup, consumer, _clock, pool = make(fill=0.5)
    assign(sup, consumer, [TP0, TP1])
    flow = sup.flows[TP0]
    b = _in_flight(sup, TP0, 1, 0, 9)
    flow.lanes.setdefault(0, collections.deque()).append(Batch(2, TP0, flow.slot, flow.epoch, 10, 19, 10,
                                                               b"f" * 400, 0))
    sup._on_result(pool.handles[0], Result(R_BLOCKED, 1, b.slot, b.epoch, detail="offset 3: boom"))
    assert flow.blocked == "offset 3: boom" and not flow.pending()
    sup.flow_control.reconcile()
    assert TP1 not in consumer.paused, "the healthy partition of the same worker keeps going"
    assert TP0 in consumer.paused


def test_a_slot_freed_by_a_blocked_partition_does_not_block_the_next_one() -> None:
    """Issue 9.5: blocked state outlived its partition and the next partition on the slot
    was reported blocked although nothing failed."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    b = _in_flight(sup, TP0, 1, 0, 9)
    slot = sup.flows[TP0].slot
    sup._on_result(pool.handles[0], Result(R_BLOCKED, 1, slot, b.epoch, detail="offset 0: boom"))
    sup.assignment.on_revoke([TP0])
    assign(sup, consumer, [TP1])
    new = sup.flows[TP1]
    assert new.slot == slot, "the slot is reused (newest first)"
    assert new.blocked is None and BLOCKED not in new.holds and new.epoch != b.epoch


def test_lag_before_the_first_batch_is_done_counts_from_where_reading_started() -> None:
    """Issue 9.14: lag was the whole log (high watermark - 0) until a batch completed."""
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.assignment.touched.clear()
    consumer.high[TP0] = 1000
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 900, 901)}, count=2)
    sup.fetch()
    (part,) = sup.status().partitions
    assert part.lag == 100


def test_key_ordering_spreads_a_partition_over_workers_by_key_and_keeps_one_span() -> None:
    sup, consumer, _clock, pool = make(workers=2, ordering="key", batch_max_wait_ms=0)
    assign(sup, consumer, [TP0])
    sup.assignment.touched.clear()
    run = []
    for o in range(40):
        run += msgs(TP0, o, key=f"k{o % 8}".encode())
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: run}, count=40)
    sup.fetch()
    sup.intake.cut_batches()
    sup.intake.dispatch()
    frames = [len(h.ring.frames) for h in pool.handles]
    assert all(frames), f"both workers got frames of the one partition: {frames}"
    flow = sup.flows[TP0]
    assert flow.tracker.unfinished == sum(frames)
    # Completing one lane's batches is not enough to commit: the other lane holds offsets below.
    h0 = pool.handles[0]
    for bid in [b for b in list(sup.in_flight._by_worker[0])]:
        sup._on_result(h0, Result(DONE, bid, flow.slot, flow.epoch, processed=1))
    assert flow.tracker.committable is None
    for bid in [b for b in list(sup.in_flight._by_worker[1])]:
        sup._on_result(pool.handles[1], Result(DONE, bid, flow.slot, flow.epoch, processed=1))
    assert flow.tracker.committable == 40


def test_key_ordering_pauses_a_partition_that_runs_too_far_ahead_of_its_commit() -> None:
    sup, consumer, _clock, _pool = make(workers=2, ordering="key", max_uncommitted_records=10)
    assign(sup, consumer, [TP0])
    flow = sup.flows[TP0]
    flow.tracker.register_span(0, 11, [(1, 0, 11)], 12)
    sup.flow_control.reconcile()
    assert flow.ahead and TP0 in consumer.paused, "12 records past the commit, bound 10: paused"
    flow.tracker.complete(1)
    sup.flow_control.reconcile()
    assert not flow.ahead and TP0 not in consumer.paused


def test_a_hot_key_that_serialises_a_partition_is_reported() -> None:
    """Key ordering spreads a partition only as far as its keys allow: one key with most of
    the records stays on one worker, and status says so instead of hiding it."""
    sup, consumer, _clock, _pool = make(workers=2, ordering="key", batch_max_wait_ms=0)
    assign(sup, consumer, [TP0])
    sup.assignment.touched.clear()
    run = []
    for o in range(300):
        run += msgs(TP0, o, key=b"hot" if o % 10 else f"k{o}".encode())
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: run}, count=300)
    sup.fetch()
    sup.intake.cut_batches()
    (part,) = sup.status().partitions
    assert part.hot_key is not None and "b'hot'" in part.hot_key and "90%" in part.hot_key
    spread = []
    for o in range(300, 600):
        spread += msgs(TP0, o, key=f"k{o}".encode())
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: spread}, count=300)
    sup.fetch()
    sup.intake.cut_batches()
    assert sup.status().partitions[0].hot_key is None, "keys spread again: no report"
