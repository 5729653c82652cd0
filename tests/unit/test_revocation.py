"""Revocation through the real rooms (invariants 1 and 5): ``Rebalance.release`` fences the
partition in the epoch table, waits only for the batch in progress (read from the worker's
board), commits what is done and forgets the partition. The worker is a RingWorker: its
real fence check reads the epoch table the supervisor writes, so a queued frame of a revoked
partition runs only if the fence did not happen."""

from __future__ import annotations

import fakes
import pytest
from fakes import TP0, TP1, RingWorker, assign_in_consume, feed, lose, make, msgs, pending, revoke, start

from runtime.kafka.consumer import Fetched
from runtime.ops.metrics import RuntimeMetrics
from runtime.supervisor.partition.partition import PauseReason


def test_revocation_waits_for_the_batch_in_progress_only_commits_it_and_fences_the_rest() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    slot, epoch = p.slot, p.epoch
    feed(sup, consumer, TP0, msgs(TP0, *range(40)))
    worker = RingWorker(pool, 0)
    worker.step()  # the worker begins the first batch; more are queued behind it
    (first,) = worker.ran
    queued = len(pool.handles[0].ring.frames)
    assert queued >= 1 and pending(sup, TP0) >= 1, "frames in the ring and batches in the lane"
    started = clock.now
    clock.step = 0.01
    revoke(sup, [TP0])
    clock.step = 0.0
    assert worker.ran == [first], "no queued frame of the revoked partition ran"
    assert len(worker.fenced) == queued, "the worker skipped every queued frame"
    assert pool.epochs.get(slot) != epoch, "the partition's slot has a new epoch"
    assert consumer.commits[-1] == {TP0: 10}, "the batch in progress was waited for and committed"
    assert consumer.acknowledged == {TP0: 10}, "synchronously"
    assert clock.now - started < 1.0, "it waited for one batch, not for the rings"
    assert TP0 not in sup.partitions and not sup.scheduler.has_out(TP0) and pending(sup, TP0) == 0
    assert pool.killed == []


def test_a_revocation_waits_for_a_batch_whose_outputs_are_in_flight_while_another_runs() -> None:
    """Pipelined delivery (issue 41): the worker handed over a batch of the revoked partition
    (its outputs in flight, not yet acknowledged) and runs one of another partition. The
    revocation waits for both a worker may have begun: the handed-over batch is reported
    only when the next finishes, and it is committed with the revocation."""
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0, TP1])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    worker = RingWorker(pool, 0, busy_for=3, pipelined=True)
    worker.step()  # begins TP0's batch
    feed(sup, consumer, TP1, msgs(TP1, *range(10)))
    for _ in range(3):
        worker.step()  # TP0's batch is handed over, TP1's begins
    assert pool.handles[0].board.delivering and worker.current is not None
    assert worker.current.partition == TP1[1] and not worker.messages
    clock.step = 0.01
    sup.rebalance.on_revoke([TP0])
    clock.step = 0.0
    assert consumer.commits[-1] == {TP0: 10}, "the batch in flight was waited for and committed"


def test_a_batch_finished_before_the_revocation_whose_result_is_unread_is_committed() -> None:
    # A worker sends its result, then marks its board idle: the revocation sees nothing in
    # progress, and the result is still in the pipe. Its outputs are written: left out of the
    # commit, the next owner would write them again (CI, KIP-848, two members).
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    worker = RingWorker(pool, 0)
    worker.step()  # begins the batch
    worker.step()  # finishes it: DONE in the pipe, the board idle
    assert worker.messages and pool.handles[0].board.current[1] == -1
    revoke(sup, [TP0])
    assert consumer.commits and consumer.commits[-1] == {TP0: 10}, "the finished batch, committed"


def test_a_lost_partition_is_fenced_at_once_its_stuck_batch_neither_waited_for_nor_killed() -> None:
    """Issue 40: behind a frozen group coordinator a member's session times out while its
    batches wait on the same frozen node; waiting revoke_timeout_s and killing the workers
    put new ones in a start-up stuck behind that node after it woke."""
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(20)))
    worker = RingWorker(pool, 0, busy_for=10**9)  # stuck on the broker, as long as the fault lasts
    worker.step()
    clock.step = 0.5
    lose(sup, [TP0])
    clock.step = 0.0
    assert pool.killed == [], "not killed"
    assert sup.rebalance.revocations[-1]["ms"] < sup.rebalance.revoke_timeout_s * 1000 / 2, "not waited for"
    assert consumer.commits == [], "a lost partition is someone else's: no commit"
    assert TP0 not in sup.partitions


def test_a_lost_partitions_queued_batches_are_fenced_and_a_late_result_counts_for_nothing() -> None:
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(20)))
    worker = RingWorker(pool, 0)
    worker.step()  # begins the first batch; the second waits in the ring
    lose(sup, [TP0])
    worker.step()  # the first finishes: a zombie's result
    worker.step()  # the second is skipped: fenced
    sup.applier.collect()
    assert len(worker.ran) == 1 and worker.fenced, "fenced as a revocation is"
    assert consumer.commits == [] and TP0 not in sup.partitions


def test_only_the_revoked_partitions_are_fenced() -> None:
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0, TP1])
    kept = sup.partitions[TP1]
    epoch = kept.epoch
    feed(sup, consumer, TP1, msgs(TP1, *range(10)))
    revoke(sup, [TP0])
    assert kept.epoch == epoch == pool.epochs.get(kept.slot)
    worker = RingWorker(pool, 0)
    worker.step()
    assert worker.ran and not worker.fenced, "the partition kept runs on"


def test_a_worker_that_does_not_let_go_is_killed_after_revoke_timeout() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    worker = RingWorker(pool, 0, busy_for=10**9)  # never finishes
    worker.step()
    clock.step = 0.5
    revoke(sup, [TP0])
    clock.step = 0.0
    assert pool.killed == [0] and "revoke_timeout" in (sup.workforce.lives[0].kill or "")
    assert consumer.commits == [], "nothing of the unfinished batch is committed"


def test_a_released_partition_is_logged_as_revoked_or_lost_whatever_became_of_its_worker(
        caplog: pytest.LogCaptureFixture) -> None:
    """The fault matrix and the operators read "partitions revoked" and "partitions lost" (CI:
    a kill's reason once replaced that line when the release's own wording was shadowed). A
    revocation kills a worker that will not let go; a loss leaves it be (issue 40)."""
    for release, line, killed in ((revoke, "partitions revoked", [0]), (lose, "partitions lost", [])):
        sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
        start(sup, consumer, [TP0])
        feed(sup, consumer, TP0, msgs(TP0, *range(10)))
        RingWorker(pool, 0, busy_for=10**9).step()  # never finishes
        clock.step = 0.5
        caplog.clear()
        with caplog.at_level("INFO", logger="ringmaster.rebalance"):
            release(sup, [TP0])
        clock.step = 0.0
        assert pool.killed == killed
        lines = [r.getMessage() for r in caplog.records if r.name == "ringmaster.rebalance"]
        assert line in lines, lines


def test_a_revoked_partition_assigned_again_starts_at_its_commit_with_a_new_epoch() -> None:
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    old = sup.partitions[TP0].epoch
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    worker = RingWorker(pool, 0)
    worker.step()
    revoke(sup, [TP0])
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    assert p.epoch > old and not p.pause.holds
    assert consumer.started[-1] == [TP0], "read from its committed offset"


def test_a_rewind_fences_like_a_revocation_but_keeps_the_partition() -> None:
    """The same fence serves a rewind (an outage, a Backoff, an operator pause): queued frames
    are skipped, the batch in progress finishes, then the partition reads again from its
    lowest unhandled offset."""
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, msgs(TP0, *range(40)))
    worker = RingWorker(pool, 0)
    worker.step()
    p.rewind(PauseReason.OPERATOR, "maintenance", None)
    sup.starts.read_again()
    assert consumer.seeks == [], "the batch in progress is still out"
    sup.applier.collect()  # it finishes; the queued frame is skipped
    sup.applier.collect()
    sup.starts.read_again()
    assert worker.fenced and len(worker.ran) == 1
    assert consumer.seeks == [(TP0, 10)] and p.tracker.committable == 10
    assert TP0 in sup.partitions and PauseReason.OPERATOR in p.pause.holds


def test_every_rebalance_callback_is_counted() -> None:
    """Status shows the count; test_pause_survives_a_rebalance waits on it."""
    sup, consumer, _clock, _pool = make()
    start(sup, consumer, [TP0, TP1])
    revoke(sup, [TP0])
    lose(sup, [TP1])
    assert sup.rebalance.rebalances == 3
    assert [r["committed"] for r in sup.rebalance.revocations] == [True, False]


def test_each_release_time_reaches_the_revocation_histogram_once_with_the_next_status() -> None:
    """The rebalance room knows no metrics: it keeps each release's time until the loop takes
    it, when it builds a status snapshot (the histograms are rendered per snapshot)."""
    metrics = RuntimeMetrics(lambda: None, group="g")
    sup, consumer, clock, _pool = make(histograms=metrics.histograms)
    start(sup, consumer, [TP0, TP1])

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(f"ringmaster_revocation_seconds_{name}", {"group": "g"})
    clock.step = 0.25
    revoke(sup, [TP0])
    lose(sup, [TP1])
    clock.step = 0.0
    assert sample("count") == 0, "recorded when the loop hands it on"
    sup.report_if_due(force=True)
    took = [r["ms"] / 1000 for r in sup.rebalance.revocations]
    assert sample("count") == 2 and min(took) > 0 and sample("sum") == pytest.approx(sum(took))
    sup.report_if_due(force=True)
    assert sample("count") == 2, "each release is recorded once"


# ---------------------------------------------------------------------- found by mutation testing
def test_a_partition_whose_batches_are_back_is_rewound_whatever_the_others_wait_for() -> None:
    sup, consumer, _clock, _pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0, TP1])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))  # out in the ring: TP0 must wait for it
    for tp in (TP0, TP1):
        sup.partitions[tp].rewind(PauseReason.OPERATOR, "maintenance", None)
    sup.starts.read_again()
    assert not sup.partitions[TP1].rewinding and sup.partitions[TP0].rewinding


def test_a_rewind_before_anything_was_cut_reads_again_from_the_first_record_dropped() -> None:
    sup, consumer, _clock, _pool = make(batch_max_records=100, batch_max_wait_ms=10_000)
    start(sup, consumer, [TP0])
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 40, 41, 42)}, count=3)
    fakes.fetch(sup)  # fetched, not cut (the batch is not full and not old)
    sup.partitions[TP0].rewind(PauseReason.OPERATOR, "maintenance", None)
    sup.starts.read_again()
    assert consumer.seeks == [(TP0, 40)]


def test_an_end_of_partition_fetched_across_a_rebalance_is_dropped_with_its_records() -> None:
    sup, consumer, _clock, _pool = make()
    start(sup, consumer, [TP0])

    def consume_with_rebalance(n: int, t: float) -> Fetched:
        sup.rebalance.on_revoke([TP0])
        assign_in_consume(sup, consumer, [TP0])
        return Fetched(runs={TP0: msgs(TP0, 5)}, eof={TP0: 6}, count=1)

    consumer.next_fetch = consume_with_rebalance
    fakes.fetch(sup)
    assert sup.partitions[TP0].intake.eof_at is None, "an EOF from before the rebalance says nothing now"


def test_a_rewind_whose_seek_fails_waits_without_holding_up_the_others() -> None:
    sup, consumer, _clock, _pool = make()
    start(sup, consumer, [TP0, TP1])
    for tp in (TP0, TP1):
        sup.partitions[tp].rewind(PauseReason.OPERATOR, "maintenance", None)
        sup.partitions[tp].tracker.register(tp[1] + 1, 0, 9)
    consumer.seek_fails = {TP0}
    sup.starts.read_again()
    assert sup.partitions[TP0].rewinding, "tried again next tick"
    assert consumer.seeks == [(TP1, 0)] and not sup.partitions[TP1].rewinding
    consumer.seek_fails = set()
    sup.starts.read_again()
    assert consumer.seeks[-1] == (TP0, 0) and sup.partitions[TP0].rewinding is False


def test_records_of_other_partitions_in_a_consume_that_straddles_a_rebalance_are_kept_and_counted() -> None:
    sup, consumer, _clock, _pool = make(batch_max_records=100, batch_max_wait_ms=10_000)
    start(sup, consumer, [TP0, TP1])

    def consume_with_rebalance(n: int, t: float) -> Fetched:
        sup.rebalance.on_revoke([TP0])
        assign_in_consume(sup, consumer, [TP0])
        return Fetched(runs={TP0: msgs(TP0, 500), TP1: msgs(TP1, 7, 8)}, count=3)

    consumer.next_fetch = consume_with_rebalance
    fakes.fetch(sup)
    assert [m.offset() for m in sup.partitions[TP1].intake.open_msgs] == [7, 8]
    assert sup.intake.consumed == 2, "what was dropped is not counted as consumed"


def test_a_revocation_that_killed_its_worker_leaves_no_batch_out_for_the_next_assignment() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    worker = RingWorker(pool, 0, busy_for=10**9)
    worker.step()
    clock.step = 0.5
    revoke(sup, [TP0])
    clock.step = 0.0
    assert not sup.scheduler.has_out(TP0) and pending(sup, TP0) == 0
    start(sup, consumer, [TP0])
    assert not sup.scheduler.has_out(TP0), "the new assignment's lane is free"
