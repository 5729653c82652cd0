"""The supervisor's own dead letters, end to end through its rooms (invariants 1 and 8):
records cut by intake, run by a fake worker, a worker death isolated by results.py, the
letter written by the real dead-letter desk and acknowledged by a fake broker, the tracker
and the commit moving only then. Nothing here completes a batch by hand: if the
acknowledgement stops reaching the tracker, or reaches it too early, a test fails."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, Message
from fakes import (
    TP0,
    TP1,
    FakePool,
    FakeProducer,
    feed,
    make,
    make_desk,
    msgs,
    redeliver,
    report,
    revoke,
    start,
)

from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.workers.workforce import Death
from runtime.transport.frames import DONE, Result, decode_frame


def supervisor(**w: Any) -> tuple[Supervisor, Any, Any, FakePool, FakeProducer]:
    """One worker, one-record batches cut at once, a dead-letter topic, isolation at the
    first crash."""
    clock_box: list[Any] = []
    desk, producer = make_desk(lambda: clock_box[0]())
    sup, consumer, clock, pool = make(desk=desk, dead_letter={"topic": "dlq", "max_crashes": 1},
                                      batch_max_records=1, batch_max_wait_ms=0, **w)
    clock_box.append(clock)
    return sup, consumer, clock, pool, producer


def worker_runs(sup: Supervisor, pool: FakePool, crash_on: int | None = None) -> None:
    """Worker 0 takes what is in its ring, in order: DONE for each batch, or it dies running
    the batch of offset ``crash_on`` (its later frames are lost with it)."""
    while pool.handles[0].ring.frames:
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            if f.columns.first == crash_on:
                sup.applier.collect()  # what it reported before it died is read first (workforce.manage)
                redeliver(sup, Death(0, f.batch_id, "killed by SIGKILL", version="1.4"))
                crash_on = None
                break
            report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns)))
        sup.applier.collect()
        sup.scheduler.dispatch(sup.capacity())


def test_a_crashing_record_is_committed_past_only_once_its_dead_letter_is_acknowledged() -> None:
    sup, consumer, _clock, pool, producer = supervisor()
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, msgs(TP0, 0, 1, 2))
    worker_runs(sup, pool, crash_on=1)
    assert p.tracker.committable == 1, "offsets 0 and 2 done, 1 isolated: the commit stops at 1"
    sup.deliver_dead_letters()
    (letter,) = producer.sent
    h = letter["headers"]
    assert h["ringmaster.error.type"] == b"WorkerCrashed" and h["ringmaster.source.offset"] == b"1"
    assert h["ringmaster.attempts"] == b"1", "the crashes it took (max_crashes 1)"
    assert h["ringmaster.plugin.version"] == b"1.4", "the version the worker that died ran"
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)
    assert consumer.commits[-1] == {TP0: 1}, "sent, not acknowledged: nothing past the record"
    producer.deliver_next(None)  # the broker has it
    sup.deliver_dead_letters()
    assert p.tracker.committable == 3 and p.stats.dead_letters == 1 and sup.results.totals.dead_letters == 1
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)
    assert consumer.commits[-1] == {TP0: 3}


def test_a_record_too_large_for_a_ring_waits_for_its_dead_letter_too() -> None:
    sup, consumer, _clock, pool, producer = supervisor()
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    big = Message(topic=TP0[0], partition=TP0[1], offset=1, key=b"k", value=b"x" * 20_000, timestamp=(1, 0))
    feed(sup, consumer, TP0, [*msgs(TP0, 0), big, *msgs(TP0, 2)])
    worker_runs(sup, pool)
    assert p.tracker.committable == 1
    sup.deliver_dead_letters()
    h = producer.sent[0]["headers"]
    assert h["ringmaster.error.type"] == b"RecordTooLarge" and h["ringmaster.attempts"] == b"1"
    assert "ringmaster.plugin.version" not in h, "no plugin ran it"
    assert p.tracker.committable == 1
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert p.tracker.committable == 3


def test_an_outage_keeps_the_commit_at_the_record_until_a_later_attempt_is_acknowledged() -> None:
    sup, consumer, clock, pool, producer = supervisor()
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, msgs(TP0, 0, 1))
    worker_runs(sup, pool, crash_on=0)
    sup.deliver_dead_letters()
    producer.deliver_next(KafkaError(KafkaError._MSG_TIMED_OUT))  # not delivered: an outage
    sup.deliver_dead_letters()
    assert p.tracker.committable is None and len(producer.sent) == 1, "waits for its back-off"
    clock.now += 1.0
    sup.deliver_dead_letters()
    assert len(producer.sent) == 2, "sent again after the back-off"
    assert p.tracker.committable is None
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert p.tracker.committable == 2


def test_the_report_of_a_letter_whose_partition_was_released_meanwhile_completes_nothing() -> None:
    """RACE: the letter is in flight when its partition is revoked (the desk forgets it: the
    record is the next owner's). Its delivery report arrives after the partition came back
    to this member under a new tracker: it must neither raise in the loop nor count."""
    sup, consumer, _clock, pool, producer = supervisor()
    start(sup, consumer, [TP0, TP1])
    feed(sup, consumer, TP0, msgs(TP0, 0, 1))
    worker_runs(sup, pool, crash_on=0)
    sup.deliver_dead_letters()
    assert producer.pending, "the letter is in flight"
    revoke(sup, [TP0])
    assert all(TP0 not in c for c in consumer.commits), "nothing of partition 0 was committable"
    start(sup, consumer, [TP0])
    producer.deliver_next(None)  # the late report of the released letter
    sup.deliver_dead_letters()
    assert sup.partitions[TP0].tracker.committable is None
    assert sup.results.totals.dead_letters == 0 and sup.dead_letters is not None
    assert sup.dead_letters.pending() == 0


def test_a_rewound_partition_reads_the_dead_lettered_record_again_until_its_letter_is_acknowledged() -> None:
    """An operator pause (a rewind) while a letter is on its way: the tracker forgets the
    unfinished batch, so the acknowledgement that follows completes nothing, and the
    partition restarts at or before the record."""
    from runtime.supervisor.partition.partition import PauseReason

    sup, consumer, _clock, pool, producer = supervisor()
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, msgs(TP0, 0, 1, 2))
    worker_runs(sup, pool, crash_on=1)
    sup.deliver_dead_letters()
    p.rewind(PauseReason.OPERATOR, "maintenance", None)
    sup.starts.read_again()
    assert consumer.seeks == [(TP0, 1)], "read again from the record whose letter is not acknowledged"
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert p.tracker.committable == 1, "a letter acknowledged after the rewind moves nothing"


def test_every_acknowledged_dead_letter_is_counted() -> None:
    sup, consumer, _clock, pool, producer = supervisor()
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, 0, 1, 2))
    worker_runs(sup, pool, crash_on=0)
    feed(sup, consumer, TP0, msgs(TP0, 3, 4))
    worker_runs(sup, pool, crash_on=3)
    sup.deliver_dead_letters()
    producer.deliver_next(None)
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert sup.results.totals.dead_letters == 2 and sup.partitions[TP0].stats.dead_letters == 2
    assert sup.partitions[TP0].tracker.committable == 5
