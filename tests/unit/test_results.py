"""The results room (runtime/supervisor/datapath/results.py) through the supervisor's fakes: what a
DONE adds to the run's totals and to its partition's, how long a deferred partition waits and
how that grows, and what becomes of a dead worker's batches when the one it crashed on is not
the first, or when one of them was fenced meanwhile. Found by mutation testing (scripts/mutate):
these went unchecked."""

from __future__ import annotations

from fakes import TP0, TP1, feed, make, msgs, redeliver, report, start

from runtime.supervisor.partition.partition import PauseReason
from runtime.supervisor.workers.workforce import Death
from runtime.transport.frames import DEFERRED, DONE, Result, decode_frame


def test_each_done_batch_adds_to_the_run_and_to_its_partition() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(20)))
    frames = [decode_frame(f) for f in pool.handles[0].ring.take()]
    assert len(frames) == 2
    for f, (outputs, dead, discarded, busy) in zip(frames, [(7, 2, 1, 30.0), (10, 0, 0, 20.0)], strict=True):
        assert f is not None
        report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=10, outputs=outputs,
                               dead_letters=dead, discarded=discarded, busy_ms=busy))
    clock.now += 2.0
    sup.applier.collect()
    t = sup.results.totals
    assert (t.batches, t.records, t.outputs, t.dead_letters, t.discarded) == (2, 20, 17, 2, 1)
    assert sup.results.per_worker_records[0] == 20 and sup.results.per_worker_busy_ms[0] == 50.0
    st = sup.partitions[TP0].stats
    assert (st.records_done, st.outputs, st.dead_letters, st.discarded) == (20, 17, 2, 1)
    assert st.done_at == clock.now


def test_a_deferred_partition_waits_what_the_plugin_asked_then_twice_as_long() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0, TP1])
    p = sup.partitions[TP0]
    for attempt, wait_s in enumerate((1.5, 3.0)):
        feed(sup, consumer, TP0, msgs(TP0, *range(attempt * 100, attempt * 100 + 10)))
        f = decode_frame(pool.handles[0].ring.take()[0])
        assert f is not None
        report(pool, 0, Result(DEFERRED, f.batch_id, f.slot, f.epoch, detail="downstream", cause="backoff",
                               delay_ms=1500))
        sup.applier.collect()
        hold = p.holding(PauseReason.BACKOFF)
        assert hold is not None and hold.until == clock.now + wait_s, (attempt, hold)
        assert f"retrying in {wait_s:.1f} s" in hold.detail
        sup.starts.read_again()
        clock.now += wait_s
        sup.flow.reconcile()
        assert PauseReason.BACKOFF not in p.pause.holds
    assert sup.results.totals.deferred == 2 and p.stats.deferrals == 2
    assert PauseReason.BACKOFF not in sup.partitions[TP1].pause.holds, "scope partition: only its own"


def test_a_delivery_outage_waits_the_outputs_back_off_doubling() -> None:
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    base = sup.s.output.retry_backoff_s
    for attempt in range(2):
        feed(sup, consumer, TP0, msgs(TP0, *range(attempt * 100, attempt * 100 + 10)))
        f = decode_frame(pool.handles[0].ring.take()[0])
        assert f is not None
        report(pool, 0, Result(DEFERRED, f.batch_id, f.slot, f.epoch, detail="broker away", cause="delivery"))
        sup.applier.collect()
        hold = p.holding(PauseReason.DELIVERY)
        assert hold is not None and hold.until == clock.now + base * 2 ** attempt
        sup.starts.read_again()
        clock.now += base * 2 ** attempt
        sup.flow.reconcile()


def test_a_dead_worker_that_crashed_on_its_second_batch_gives_both_back() -> None:
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(20)))
    b1, b2 = [decode_frame(f) for f in pool.handles[0].ring.take()]
    assert b1 is not None and b2 is not None
    redeliver(sup, Death(0, b2.batch_id, "killed by SIGKILL"))
    sup.scheduler.dispatch(sup.capacity())
    again = [decode_frame(f) for f in pool.handles[0].ring.frames]
    assert [f.batch_id for f in again if f is not None] == [b1.batch_id, b2.batch_id], "both, in order"


def test_a_dead_workers_batch_of_a_fenced_partition_is_not_given_back() -> None:
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0, TP1])
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    feed(sup, consumer, TP1, msgs(TP1, *range(10)))
    stale, fresh = [decode_frame(f) for f in pool.handles[0].ring.take()]
    assert stale is not None and fresh is not None and (stale.topic, stale.partition) == TP0
    sup.partitions[TP0].rewind(PauseReason.OPERATOR, "maintenance", None)  # a new epoch
    redeliver(sup, Death(0, fresh.batch_id, "killed by SIGKILL"))
    sup.scheduler.dispatch(sup.capacity())
    again = [decode_frame(f) for f in pool.handles[0].ring.frames]
    assert [f.batch_id for f in again if f is not None] == [fresh.batch_id], \
        "the fenced batch is not run again; the other one is"
