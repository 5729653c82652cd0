"""The supervisor's rooms with fakes, driven through their real entry points (the rebalance
callbacks, consume(), the result pipes, the loop's steps): invariants 1, 3, 4, 5 and the
failure model's holds. The consumer fake, like librdkafka, starts every new assignment
fetching and can lose a resume; rings record the frames written to them; results come back
on fake pipes."""

from __future__ import annotations

from typing import Any

import fakes
from fakes import TP0, TP1, assign, assign_in_consume, make, msgs, pending, redeliver, report, revoke, status

from runtime.kafka.consumer import Fetched
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.partition.partition import PauseReason
from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.workers.workforce import State
from runtime.transport.frames import (
    BLOCKED,
    DEFERRED,
    DONE,
    EXHAUSTED,
    FENCED,
    Columns,
    Result,
    decode_frame,
    encode_batch,
)

TP2 = ("t", 2)


def frame(bid: int, slot: int, epoch: int, tp: Any, first: int, last: int, size: int) -> bytes:
    """A real batch frame of records first..last, padded to exactly `size` bytes."""
    n = last - first + 1

    def encode(pad: int) -> bytes:
        values = [b"v" * (1 + pad)] + [b"v"] * (n - 1)
        return encode_batch(bid, slot, epoch, tp[0], tp[1], Columns(first, None, [None] * n, values, None, 1,
                                                                    [0] * n))
    pad = size - len(encode(0))
    while len(encode(pad)) > size:  # the length prefix of the padded value grows with it
        pad -= 1
    data = encode(pad)
    assert len(data) == size, (len(data), size)
    return data


def enqueue(sup: Any, tp: Any, bid: int, first: int, last: int, size: int = 100,
            bucket: int | None = None) -> Batch:
    """A batch cut from tp (registered in its tracker, as intake does) waiting for a ring."""
    p = sup.partitions[tp]
    p.tracker.register(bid, first, last)
    data = frame(bid, p.slot, p.epoch, tp, first, last, size)
    b = Batch(bid, tp, p.slot, p.epoch, first, last, last - first + 1, data, bucket)
    sup.scheduler.enqueue([b])
    return b


def out(sup: Any, tp: Any, bid: int, first: int, last: int, worker: int = 0) -> Batch:
    """A batch written to a worker's ring."""
    b = enqueue(sup, tp, bid, first, last)
    sup.scheduler.dispatch(sup.capacity())
    assert sup.scheduler.out_on(worker, bid), f"batch {bid} went to another worker"
    return b


def done(pool: Any, worker: int, b: Batch, **kw: Any) -> None:
    report(pool, worker, Result(DONE, b.batch_id, b.slot, b.epoch, processed=b.count, **kw))


def fetch(sup: Any, consumer: Any, fetched: Fetched) -> None:
    consumer.next_fetch = lambda n, t: fetched
    fakes.fetch(sup)


# ---------------------------------------------------------------------- backpressure (invariant 3)
def test_a_partition_over_its_share_of_the_backlog_pauses_and_resumes_with_hysteresis() -> None:
    """Budget: pause_above (0.8) of the rings (1 × 1000 bytes). One partition with a backlog
    has it all; it pauses at 800 bytes and resumes below 400 (resume_below / pause_above)."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    pool.handles[0].ring.accept = False  # nothing leaves for the ring: it all waits in the lane
    for i in range(8):
        enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9)
    sup.flow.reconcile()
    assert TP0 in consumer.paused and sup.partitions[TP0].pause_reasons() == [PauseReason.FLOW]
    pool.handles[0].ring.accept = True
    # Two batches leave for the ring: still counted (in a ring, not done).
    sup.scheduler.dispatch(sup.capacity())
    sup.flow.reconcile()
    assert TP0 in consumer.paused, "800 bytes out or waiting: still paused"
    for b in pool.handles[0].ring.take():
        frame = decode_frame(b)
        assert frame is not None
        report(pool, 0, Result(DONE, frame.batch_id, frame.slot, frame.epoch, processed=10))
    sup.applier.collect()
    sup.scheduler.dispatch(sup.capacity())
    sup.flow.reconcile()
    assert TP0 in consumer.paused, "600 bytes: between the watermarks, stays paused"
    for _ in range(2):
        for b in pool.handles[0].ring.take():
            frame = decode_frame(b)
            assert frame is not None
            report(pool, 0, Result(DONE, frame.batch_id, frame.slot, frame.epoch, processed=10))
        sup.applier.collect()
        sup.scheduler.dispatch(sup.capacity())
    sup.flow.reconcile()
    assert TP0 not in consumer.paused, "200 bytes: below resume_below, fetching again"


def test_a_partition_far_behind_does_not_take_the_others_share() -> None:
    """Shares, not one pool: with two partitions that have a backlog, each has half the
    budget; the one far behind pauses and the other keeps fetching."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0, TP1])
    pool.handles[0].ring.accept = False
    for i in range(5):
        enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9)
    enqueue(sup, TP1, 9, 0, 9)
    sup.flow.reconcile()
    assert TP0 in consumer.paused and TP1 not in consumer.paused


def test_a_fetch_asks_for_no_more_than_the_budget_can_take() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0, TP1])
    assert sup.flow.records_wanted() == 1000, "nothing learnt yet: a batch per partition"
    sup.intake.bytes_per_record = 2.0  # room: 0.8 * 1000 bytes = 400 records of 2 bytes
    assert sup.flow.records_wanted() == 400
    pool.handles[0].ring.accept = False
    for i in range(8):
        enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9)
    assert sup.flow.records_wanted() == 100, "no room: still a minimal fetch, never zero"


# ---------------------------------------------------------------------- pause state (invariant 4)
def test_an_operator_paused_partition_is_paused_at_assignment_before_it_fetches() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "maintenance")
    revoke(sup, [TP0])

    class Pauses:
        def pause_for(self, tp: Any) -> Any:
            return type("P", (), {"describe": lambda self: "paused by ops"})()

    sup.operator.pauses = Pauses()  # type: ignore[assignment]
    assign(sup, consumer, [TP0, TP1])
    assert consumer.paused == {TP0, TP1}, "librdkafka started them fetching; the runtime paused them at once"
    assert all(PauseReason.OPERATOR in p.pause.holds for p in sup.partitions.values())


def test_incremental_assignment_keeps_existing_pauses_and_reconcile_repairs_forgotten_ones() -> None:
    sup, consumer, clock, _pool = make()
    assign(sup, consumer, [TP0])
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "maintenance")
    consumer.paused.clear()  # the client forgot the pause across the rebalance
    assign(sup, consumer, [TP1])
    assert TP1 not in consumer.paused
    clock.now += 1.5
    sup.flow.reconcile()
    assert consumer.paused == {TP0}, "the periodic reconcile re-applies forgotten pauses"


def test_a_lost_resume_is_repaired_within_a_second() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "x")
    sup.flow.reconcile()
    assert sup.partitions[TP0].release(PauseReason.OPERATOR)
    consumer.ignore_next_resume = True
    sup.flow.reconcile()
    assert TP0 in consumer.paused, "the fake client lost the resume"
    clock.now += 1.0
    sup.flow.reconcile()
    assert TP0 not in consumer.paused, "a runnable partition is fetching again within 1 s"


def test_an_idle_partition_at_its_end_is_not_poked() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetch(sup, consumer, Fetched(eof={TP0: 10}))
    consumer.calls.clear()
    clock.now += 5
    sup.flow.reconcile()
    assert ("resume", [TP0]) not in consumer.calls


def test_holds_are_never_resumed_by_flow_control_and_timed_ones_expire() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "maintenance")
    sup.partitions[TP1].hold(PauseReason.BACKOFF, "downstream", until=clock.now + 3)
    for _ in range(5):
        clock.now += 1.0
        sup.flow.reconcile()
        assert TP0 in consumer.paused, "an operator pause outlives any reconcile"
    assert TP1 not in consumer.paused, "the back-off ended after 3 s and the partition resumed"


# ---------------------------------------------------------------------- revocation (invariants 1, 5)
def test_the_batch_a_revocation_waits_for_is_committed_with_it() -> None:
    """The fence bumps the epoch before waiting for the batch in progress; that batch's DONE
    comes back with the old epoch and must still count, or the revocation commits nothing of
    what it waited for."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    b = out(sup, TP0, 7, 0, 9)
    h = pool.handles[0]
    h.alive = True
    h.board.begin(7, p.slot)  # the worker is running it
    done(pool, 0, b)  # ... and finishes it while the revocation waits
    revoke(sup, [TP0])
    assert consumer.commits[-1] == {TP0: 10}, "the batch in progress at the fence is committed"
    assert TP0 not in sup.partitions and not sup.scheduler.has_out(TP0)
    assert sup.rebalance.revocations[-1]["partitions"] == ["t[0]"]


def test_a_late_result_of_a_released_partition_completes_nothing() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    b = out(sup, TP0, 7, 0, 9)
    revoke(sup, [TP0])
    assign(sup, consumer, [TP0])
    done(pool, 0, b)
    sup.applier.collect()
    assert sup.partitions[TP0].tracker.committable is None, "a batch that is not out completes nothing"


def test_a_revocation_kills_a_worker_that_will_not_let_go_in_time() -> None:
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    out(sup, TP0, 7, 0, 9)
    h = pool.handles[0]
    h.alive = True
    h.board.begin(7, p.slot)  # running, and never reporting
    clock.step = 0.5  # time passes while the revocation waits
    revoke(sup, [TP0])
    clock.step = 0.0
    assert pool.killed == [0], "killed after revoke_timeout_s"
    assert "revoke_timeout" in (sup.workforce.lives[0].kill or "")
    assert consumer.commits == [], "nothing of the unfinished batch is committed"


def test_a_refused_asynchronous_commit_is_sent_again_even_without_progress() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    done(pool, 0, out(sup, TP0, 1, 0, 9))
    sup.applier.collect()
    sup.commits.commit(list(sup.partitions.values()), asynchronous=True)
    assert consumer.commits == [{TP0: 10}]
    consumer.refused = {TP0: 10}  # e.g. REBALANCE_IN_PROGRESS, reported by on_commit
    sup.commits.commit(list(sup.partitions.values()), asynchronous=True)
    assert consumer.commits[-1] == {TP0: 10}, "the refused offset is committed again"
    sup.commits.commit(list(sup.partitions.values()), asynchronous=True)
    assert len(consumer.commits) == 2, "and only until it is accepted"


# ---------------------------------------------------------------------- intake and rebalances
def test_rows_and_eof_in_the_same_consume_mean_caught_up() -> None:
    """One consume() may return a partition's last records and its EOF event together."""
    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])
    fetch(sup, consumer, Fetched(runs={TP0: msgs(TP0, 0, 1)}, eof={TP0: 2}, count=2))
    assert sup.partitions[TP0].intake.eof_at == 2
    fetch(sup, consumer, Fetched(runs={TP0: msgs(TP0, 2)}, eof={TP0: 2}, count=1))
    assert sup.partitions[TP0].intake.eof_at is None, "an EOF older than the newest record does not count"


def test_records_straddling_a_rebalance_are_dropped_and_the_partition_restarts_at_its_commit() -> None:
    """confluent-kafka-python#1013: one consume() returns records fetched before a revoke +
    assign of the same partition (past the commit) and records restarting at the commit."""
    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])

    def consume_with_rebalance(n: int, t: float) -> Fetched:
        sup.rebalance.on_revoke([TP0])
        assign_in_consume(sup, consumer, [TP0])
        stale, fresh = msgs(TP0, 500, 501), msgs(TP0, 200)
        return Fetched(runs={TP0: stale + fresh, TP1: msgs(TP1, 7)}, count=4)

    consumer.next_fetch = consume_with_rebalance
    sup.partitions[TP0].register([(1, 0, 9)], 0.0)
    consumer.started.clear()
    fakes.fetch(sup)  # must not raise "goes backwards"
    assert sup.partitions[TP0].intake.open_msgs == [], "nothing of the straddling call is kept"
    assert consumer.started == [[TP0]], "the partition restarts at its committed offset"


def test_a_committed_offset_the_broker_does_not_give_holds_the_partition_and_is_tried_again() -> None:
    sup, consumer, clock, _ = make()
    consumer.seek_fails = {TP0}
    assign_in_consume(sup, consumer, [TP0])
    fetch(sup, consumer, Fetched())  # the assignment touched TP0: its start offset is looked up, and fails
    p = sup.partitions[TP0]
    sup.flow.reconcile()  # the tick's flow control: it does not fetch
    assert PauseReason.SEEKING in p.pause.holds and TP0 in consumer.paused
    fetch(sup, consumer, Fetched(runs={TP0: msgs(TP0, 0, 1)}, count=2))
    assert p.intake.open_msgs == [], "records from an unknown position are not processed"
    consumer.seek_fails.clear()
    fetch(sup, consumer, Fetched())
    assert PauseReason.SEEKING in p.pause.holds, \
        "not tried again on every turn of the loop: each try reads the coordinator's offsets"
    clock.now += 2.0  # past the back-off's longest wait
    fetch(sup, consumer, Fetched())
    assert PauseReason.SEEKING not in p.pause.holds, "tried again, and released once it worked"


def test_lag_before_the_first_batch_is_done_counts_from_where_reading_started() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    consumer.high[TP0] = 1000
    fetch(sup, consumer, Fetched(runs={TP0: msgs(TP0, 900, 901)}, count=2))
    (part,) = status(sup).partitions
    assert part.lag == 100


# ---------------------------------------------------------------------- the failure model's holds
def test_a_deferred_batch_is_read_again_from_its_first_record_once_its_batches_are_back() -> None:
    """An output outage is not the records' fault: no crash count, no dead letter, nothing
    committed past the batch; the partition waits, then reads it again."""
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    b1, b2, b3 = (enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9) for i in range(3))
    sup.scheduler.dispatch(sup.capacity())
    assert sup.scheduler.count(0) == 2, "one running, one queued: the third waits in its lane"
    done(pool, 0, b1)
    report(pool, 0, Result(DEFERRED, 2, b2.slot, b2.epoch, detail="broker away", cause="delivery"))
    sup.applier.collect()
    assert PauseReason.DELIVERY in p.pause.holds and p.rewinding
    assert TP0 not in sup.scheduler.snapshot().pending, "the batch waiting in its lane was dropped"
    sup.flow.reconcile()  # later in the tick, before the next fetch
    assert TP0 in consumer.paused
    assert b3.batch_id not in {decode_frame(f).batch_id for f in pool.handles[0].ring.frames}  # type: ignore[union-attr]
    sup.starts.read_again()
    assert consumer.seeks == [(TP0, 10)], "nothing is out any more: read again from the deferred batch"
    assert p.tracker.committable == 10 and not p.rewinding
    clock.now += 0.5
    sup.flow.reconcile()
    assert TP0 in consumer.paused, "still backing off"
    clock.now += 1.0
    sup.flow.reconcile()
    assert TP0 not in consumer.paused, "back-off over: fetching again"
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)
    assert consumer.commits[-1] == {TP0: 10}, "nothing past the deferred batch is committed"


def test_a_rewind_waits_for_every_batch_out_in_a_ring() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    b1, b2 = (enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9) for i in range(2))
    sup.scheduler.dispatch(sup.capacity())
    report(pool, 0, Result(DEFERRED, 1, b1.slot, b1.epoch, detail="x", cause="backoff", delay_ms=100))
    sup.applier.collect()
    sup.starts.read_again()
    assert consumer.seeks == [], "batch 2 is still out in the ring: no seek yet"
    report(pool, 0, Result(FENCED, 2, b2.slot, b2.epoch))  # the worker skipped it
    sup.applier.collect()
    sup.starts.read_again()
    assert consumer.seeks == [(TP0, 0)] and not p.rewinding


def test_a_backoff_for_every_partition_holds_them_all() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0, TP1])
    b = out(sup, TP0, 1, 0, 9)
    report(pool, 0, Result(DEFERRED, 1, b.slot, b.epoch, detail="x", cause="backoff", delay_ms=2000,
                           scope="all"))
    sup.applier.collect()
    assert all(PauseReason.BACKOFF in p.pause.holds for p in sup.partitions.values())
    sup.flow.reconcile()
    assert consumer.paused == {TP0, TP1}


def test_a_blocked_partition_drops_its_waiting_batches_so_they_do_not_hold_back_others() -> None:
    """A blocked partition's waiting batches kept counting towards the backlog, so healthy
    partitions could stay paused forever."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0, TP1])
    b = out(sup, TP0, 1, 0, 9)
    pool.handles[0].ring.accept = False
    for i in range(6):
        enqueue(sup, TP0, i + 2, 10 + i * 10, 19 + i * 10)
    report(pool, 0, Result(BLOCKED, 1, b.slot, b.epoch, detail="offset 3: boom"))
    sup.applier.collect()
    p = sup.partitions[TP0]
    assert p.blocked == "offset 3: boom" and TP0 not in sup.scheduler.snapshot().pending
    sup.flow.reconcile()
    assert TP1 not in consumer.paused, "the healthy partition keeps going"
    assert TP0 in consumer.paused


def test_a_slot_freed_by_a_blocked_partition_does_not_block_the_next_one() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    b = out(sup, TP0, 1, 0, 9)
    slot = sup.partitions[TP0].slot
    report(pool, 0, Result(BLOCKED, 1, slot, b.epoch, detail="offset 0: boom"))
    sup.applier.collect()
    revoke(sup, [TP0])
    assign(sup, consumer, [TP1])
    new = sup.partitions[TP1]
    assert new.slot == slot, "the slot is reused (newest first)"
    assert new.blocked is None and not new.pause.holds and new.epoch != b.epoch


def test_a_dead_workers_batches_go_back_in_order_and_the_partition_may_move() -> None:
    """A worker dies with two batches of a partition in its ring: both run again, in order,
    on the other worker; the one it was running counts a crash."""
    sup, consumer, _clock, pool = make(workers=2)
    assign(sup, consumer, [TP0])
    b1, b2 = (enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9) for i in range(2))
    sup.scheduler.dispatch(sup.capacity())
    (worker,) = [w for w in (0, 1) if sup.scheduler.count(w)]
    assert sup.scheduler.count(worker) == 2, "a partition's batches are on one worker at a time"
    pool.handles[worker].ring.take()
    from runtime.supervisor.workers.workforce import Death

    redeliver(sup, Death(worker, b1.batch_id, "killed by SIGKILL"))
    assert b1.crashes == 1 and b2.crashes == 0
    sup.workforce.lives[worker].kill = "dead"  # not accepting until it is restarted
    sup.scheduler.dispatch(sup.capacity())
    other = 1 - worker
    frames = [decode_frame(f) for f in pool.handles[other].ring.frames]
    assert [f.batch_id for f in frames if f is not None] == [1, 2], "in their original order"


# ---------------------------------------------------------------------- key ordering
def test_key_ordering_spreads_a_partition_over_workers_by_key_and_keeps_one_span() -> None:
    # Batches of 40: each bucket's ~20 records are worth a frame of their own (intake._groups).
    sup, consumer, _clock, pool = make(workers=2, ordering="key", batch_max_wait_ms=0, batch_max_records=40)
    assign(sup, consumer, [TP0])
    run = []
    for o in range(40):
        run += msgs(TP0, o, key=f"k{o % 8}".encode())
    fetch(sup, consumer, Fetched(runs={TP0: run}, count=40))
    fakes.cut(sup)
    sup.scheduler.dispatch(sup.capacity())
    frames = [[decode_frame(f) for f in h.ring.frames] for h in pool.handles]
    assert all(frames), f"both workers got batches of the one partition: {[len(f) for f in frames]}"
    p = sup.partitions[TP0]
    # Completing one worker's batches is not enough to commit: the other holds offsets below.
    for raw in pool.handles[0].ring.take():
        f = decode_frame(raw)
        assert f is not None
        report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns)))
    sup.applier.collect()
    assert p.tracker.committable is None
    while any(h.ring.frames for h in pool.handles) or pending(sup, TP0):
        for i, h in enumerate(pool.handles):
            for raw in h.ring.take():
                f = decode_frame(raw)
                assert f is not None
                report(pool, i, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns)))
        sup.applier.collect()
        sup.scheduler.dispatch(sup.capacity())
    assert p.tracker.committable == 40


def test_key_ordering_puts_a_small_cut_in_one_frame_of_several_buckets_in_offset_order() -> None:
    """A dozen records per bucket frame filled the supervisor with per-frame work (issue 24):
    a cut too small for a worthwhile frame per bucket is one frame, in offset order (so each
    key's records are too), in every bucket's lane."""
    sup, consumer, _clock, pool = make(workers=2, ordering="key", batch_max_wait_ms=0)
    assign(sup, consumer, [TP0])
    run = []
    for o in range(40):
        run += msgs(TP0, o, key=f"k{o % 8}".encode())
    fetch(sup, consumer, Fetched(runs={TP0: run}, count=40))
    batches = sup.intake.cut(fakes.room(), drained=True).batches
    assert len(batches) == 1 and batches[0].buckets is not None and len(batches[0].buckets) == 2
    sup.scheduler.enqueue(batches)
    sup.scheduler.dispatch(sup.capacity())
    frames = [decode_frame(f) for h in pool.handles for f in h.ring.frames]
    assert len(frames) == 1 and frames[0] is not None
    assert list(frames[0].columns.offset_list()) == list(range(40))
    f = frames[0]
    report(pool, next(i for i, h in enumerate(pool.handles) if h.ring.frames),
           Result(DONE, f.batch_id, f.slot, f.epoch, processed=40))
    sup.applier.collect()
    assert sup.partitions[TP0].tracker.committable == 40


def test_key_ordering_pauses_a_partition_that_runs_too_far_ahead_of_its_commit() -> None:
    sup, consumer, _clock, _pool = make(workers=2, ordering="key", max_uncommitted_records=10)
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.tracker.register_span(0, 11, [(1, 0, 11)], 12)
    sup.flow.reconcile()
    assert p.pause.ahead and TP0 in consumer.paused, "12 records past the commit, bound 10: paused"
    p.tracker.complete(1)
    sup.flow.reconcile()
    assert not p.pause.ahead and TP0 not in consumer.paused


def test_a_hot_key_that_serialises_a_partition_is_reported() -> None:
    """Key ordering spreads a partition only as far as its keys allow: one key with most of
    the records stays in one lane, and status says so instead of hiding it."""
    sup, consumer, _clock, _pool = make(workers=2, ordering="key", batch_max_wait_ms=0)
    assign(sup, consumer, [TP0])
    run = []
    for o in range(300):
        run += msgs(TP0, o, key=b"hot" if o % 10 else f"k{o}".encode())
    fetch(sup, consumer, Fetched(runs={TP0: run}, count=300))
    fakes.cut(sup)
    (part,) = status(sup).partitions
    assert part.hot_key is not None and "b'hot'" in part.hot_key and "90%" in part.hot_key
    spread = []
    for o in range(300, 600):
        spread += msgs(TP0, o, key=f"k{o}".encode())
    fetch(sup, consumer, Fetched(runs={TP0: spread}, count=300))
    fakes.cut(sup)
    assert status(sup).partitions[0].hot_key is None, "keys spread again"


# ---------------------------------------------------------------------- batch-level scheduling (issue 16)
def test_three_partitions_keep_two_workers_busy_by_moving_between_batches() -> None:
    """A partition bound to a worker for life leaves one worker with two of three partitions;
    moving partitions between batches keeps both busy and each partition on one at a time."""
    sup, consumer, _clock, pool = make(workers=2)
    assign(sup, consumer, [TP0, TP1, TP2])
    bid = 0
    for tp in (TP0, TP1, TP2):
        for i in range(20):
            bid += 1
            enqueue(sup, tp, bid, i * 10, i * 10 + 9)
    busy = [0, 0]
    where: dict[Any, set[int]] = {TP0: set(), TP1: set(), TP2: set()}
    for _ in range(60):
        sup.scheduler.dispatch(sup.capacity())
        for w, h in enumerate(pool.handles):
            running = h.ring.frames[:1]  # the worker finishes the first batch of its ring
            if not running:
                continue
            busy[w] += 1
            h.ring.frames = h.ring.frames[1:]
            f = decode_frame(running[0])
            assert f is not None
            where[(f.topic, f.partition)].add(w)
            report(pool, w, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns)))
        sup.applier.collect()
        for tp in where:
            on = {w for w in (0, 1) if any((lambda x: x is not None and (x.topic, x.partition) == tp)(
                decode_frame(fr)) for fr in pool.handles[w].ring.frames)}
            assert len(on) <= 1, f"{tp} is in two rings at once"
    assert sum(busy) == 60, "every batch ran"
    assert min(busy) >= 25, f"both workers kept busy: {busy}"
    assert any(len(ws) == 2 for ws in where.values()), "a partition moved between workers"
    for tp in (TP0, TP1, TP2):
        assert sup.partitions[tp].tracker.committable == 200


def test_a_partial_batch_is_cut_early_for_an_idle_worker_only_when_the_client_had_nothing_more() -> None:
    """Adaptive batching: small batches only when they cost nothing. Behind a backlog (a
    fetch that came back full), what arrived waits to fill a batch even though a worker has
    room; once the client's queue is drained, a worker with room gets it at once."""
    sup, consumer, _clock, _pool = make(batch_max_records=100, batch_max_wait_ms=1000)
    assign(sup, consumer, [TP0])
    sup.intake.take(Fetched(runs={TP0: msgs(TP0, *range(10))}, count=10))
    # The client had as much as was asked for: behind.
    assert sup.intake.cut(fakes.room(), drained=False).batches == [], "10 of 100: waits for more"
    # Nothing more queued.
    assert [b.count for b in sup.intake.cut(fakes.room(), drained=True).batches] == [10], "cut at once"


# ---------------------------------------------------------------------- the tick's capacity (issue 42)
def test_a_worker_that_reports_in_a_tick_gets_the_batch_waiting_for_it_in_that_tick() -> None:
    """Results are read just before placing, and placing asks the workers' room anew: a worker
    whose ring was full as the tick began, and that reported a batch done during it, is not
    left idle until the next tick (issue 24: placing by what the tick began with)."""
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    b1, _b2, b3 = (enqueue(sup, TP0, i + 1, i * 10, i * 10 + 9) for i in range(3))
    sup.scheduler.dispatch(sup.capacity())
    assert sup.scheduler.count(0) == 2 and not sup.scheduler.out_on(0, b3.batch_id), "the ring is full"
    done(pool, 0, b1)
    sup.tick()
    assert sup.scheduler.out_on(0, b3.batch_id), "placed in the tick that read the result"


def test_a_worker_that_reports_running_out_in_a_tick_is_given_nothing_more_in_it() -> None:
    """A worker that ran out of a resource says so and exits next; nothing more goes to its
    ring, also not the batches cut in the tick that read its report."""
    sup, consumer, _clock, pool = make(batch_max_wait_ms=0)
    assign(sup, consumer, [TP0])
    sup.workforce.lives[0].state = State.READY
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 0, 1, 2)}, count=3)
    report(pool, 0, Result(EXHAUSTED, 9, 0, 0, detail="memory (MemoryError)", cause="worn"))
    sup.tick()
    assert fakes.pending(sup, TP0) == 1 and pool.handles[0].ring.frames == [], "cut, and not placed"


# ---------------------------------------------------------------------- the wait when nothing is under way
def test_the_loop_waits_longer_for_records_only_while_nothing_is_under_way() -> None:
    """An idle daemon turned every 20 ms (2.4 % of a core in its supervisor); with nothing in
    a ring, owed to the group or being started, no result can come and the client's wait ends
    at the first record, so the tick waits 100 ms (waits.py). Anything under way keeps the
    short wait: a batch out, an offset not committed yet, a partition waiting for its start."""
    sup, consumer, clock, pool = make()
    waited: list[float] = []

    def consume(n: int, timeout_s: float) -> Fetched:
        waited.append(timeout_s)
        return Fetched()

    assign(sup, consumer, [TP0])
    consumer.next_fetch = consume
    fakes.fetch(sup)
    assert waited[-1] == 0.1, "an assigned partition and nothing to do"

    b = out(sup, TP0, 1, 0, 9)
    fakes.fetch(sup)
    assert waited[-1] == 0.02, "a batch in a ring: its result is awaited"

    done(pool, 0, b)
    sup.applier.collect()
    fakes.fetch(sup)
    assert waited[-1] == 0.02, "its offset is owed to the group until committed"

    clock.now += 1.0  # commit_interval_ms
    sup.commits.commit_if_due()
    assert consumer.commits[-1] == {TP0: 10}
    fakes.fetch(sup)
    assert waited[-1] == 0.1

    consumer.seek_fails = {TP1}
    assign(sup, consumer, [TP1])
    fakes.fetch(sup)
    assert sup.partitions[TP1].seeking and waited[-1] == 0.02, "a start tried again"


def test_a_batch_run_never_takes_the_long_wait() -> None:
    """--until-caught-up judges its end every turn: a longer wait would be a longer run."""
    s = fakes.settings()
    s = s.model_copy(update={"supervisor": s.supervisor.model_copy(update={"stop_when_caught_up": True})})
    pool, consumer = fakes.FakePool(1), fakes.FakeConsumer()
    sup = Supervisor(s, consumer, pool, pool.epochs, clock=fakes.Clock())
    sup.workforce.start_all()
    assign(sup, consumer, [TP0])
    waited: list[float] = []
    consumer.next_fetch = lambda n, timeout_s: waited.append(timeout_s) or Fetched()
    fakes.fetch(sup)
    assert waited == [0.02]


def test_a_dead_letter_not_yet_acknowledged_keeps_the_short_wait() -> None:
    """Its delivery report is served each turn (deliver_dead_letters): the record's offset
    moves on only once it is acknowledged."""
    clock = fakes.Clock()
    desk, producer = fakes.make_desk(clock)
    sup, consumer, _clock, _pool = make(desk=desk)
    assign(sup, consumer, [TP0])
    waited: list[float] = []
    consumer.next_fetch = lambda n, timeout_s: waited.append(timeout_s) or Fetched()
    fakes.fetch(sup)
    assert waited[-1] == 0.1
    desk.submit(TP0, 1, (0, None, b"poison", []), "ValueError", "bad record")
    fakes.fetch(sup)
    assert waited[-1] == 0.02, "a letter in flight"
    sup.deliver_dead_letters()  # sent
    producer.deliver_next()  # acknowledged
    sup.deliver_dead_letters()
    fakes.fetch(sup)
    assert waited[-1] == 0.1


def test_a_batch_waiting_for_a_worker_keeps_the_short_wait() -> None:
    """A batch cut and waiting for room (here its only worker is dead and restarting, so no
    ring holds it): a worker's report or its start is what lets it go, not a record. The
    turn waits on the workers then, not on the client. The loop's quiet and waits.plan each
    keep the wait short on their own: the test fails only with both conditions dropped."""
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0])
    waited: list[tuple[str, float]] = []
    consumer.next_fetch = lambda n, timeout_s: waited.append(("client", timeout_s)) or Fetched()
    sup._wait_for_workers = lambda timeout_s: waited.append(("workers", timeout_s))  # type: ignore[method-assign]
    fakes.fetch(sup)
    assert waited == [("client", 0.1)]
    sup.workforce.lives[0].state = State.RESTARTING
    enqueue(sup, TP0, 1, 0, 9)
    sup.scheduler.dispatch(sup.capacity())
    assert sup.scheduler.waiting_for_room() and not any(sup.scheduler.counts())
    waited.clear()
    fakes.fetch(sup)
    assert waited == [("workers", 0.02), ("client", 0.0)]


def test_a_command_in_progress_keeps_the_short_wait() -> None:
    """A scale asked for (SIGTTIN) is taken and moved on by the loop's turns (commands.py), and
    answered when the new worker is up: a long wait would answer it later."""
    from runtime.supervisor.control.signals import Asked, Intent

    sup, consumer, _clock, _pool = make(max_processes=2)
    assign(sup, consumer, [TP0])
    waited: list[float] = []
    consumer.next_fetch = lambda n, timeout_s: waited.append(timeout_s) or Fetched()
    fakes.fetch(sup)
    assert waited[-1] == 0.1
    sup.workforce.started_once = True  # a worker was ready once: a resize may begin
    sup.commands.on_signal(Asked(Intent.GROW, "SIGTTIN"))
    fakes.fetch(sup)
    assert waited[-1] == 0.02, "queued"
    sup.commands.step()
    assert not sup.commands.idle
    fakes.fetch(sup)
    assert waited[-1] == 0.02, "in progress"
