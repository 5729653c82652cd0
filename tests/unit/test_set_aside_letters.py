"""Under exactly-once, a record set aside at intake (too large for every ring, or unreadable by
the client) is dead-lettered by a worker's transaction in its lane position, not by the
supervisor's desk (runtime/supervisor/datapath/intake.py, ``_in_lane``). Written by the desk,
the letter was not ordered against the lane: the next batch's transaction could commit past
the record before the broker had the letter, and a supervisor SIGKILLed then lost it. Through
the supervisor's rooms with fakes; the real broker's story is in
tests/integration/test_exactly_once_kafka.py."""

from __future__ import annotations

from typing import Any

import fakes
import pytest
from confluent_kafka import Message
from fakes import TP0, Clock, FakeConsumer, FakePool, FakeProducer, feed, make, make_desk, msgs, report, start

from runtime.config import Settings
from runtime.kafka.consumer import Fetched
from runtime.supervisor.daemon.loop import Supervisor
from runtime.transport import speedups
from runtime.transport.frames import DONE, BatchFrame, Result, decode_frame

BIG = 20_000  # larger than the fake pool's rings take


def exactly_once(producer_max: int = 1_000_000, **w: Any) -> tuple[Supervisor, Any, FakePool, FakeProducer]:
    clock = Clock()
    desk, producer = make_desk(clock, producer_max)
    s = Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1, "batch_max_records": 1,
                    "batch_max_wait_ms": 0, **w},
        "output": {"topic": "out", "guarantee": "exactly-once"},
        "dead_letter": {"topic": "dlq", "max_crashes": 1}})
    pool = FakePool(1)
    consumer = FakeConsumer()
    sup = Supervisor(s, consumer, pool, pool.epochs, clock=clock, dead_letters=desk)
    sup.workforce.start_all()
    start(sup, consumer, [TP0])
    return sup, consumer, pool, producer


def run_in_order(sup: Supervisor, pool: FakePool) -> list[BatchFrame]:
    """Worker 0 runs what reaches its ring, in order, each batch DONE (its transaction
    committed); returns the frames it ran."""
    ran: list[BatchFrame] = []
    sup.scheduler.dispatch(sup.capacity())
    while pool.handles[0].ring.frames:
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            ran.append(f)
            report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns),
                                   dead_letters=len(f.columns) * f.letters))
        sup.applier.collect()
        sup.deliver_dead_letters()
        sup.scheduler.dispatch(sup.capacity())
    return ran


def big(offset: int) -> Message:
    return Message(topic=TP0[0], partition=TP0[1], offset=offset, key=b"k", value=b"x" * BIG,
                   headers=[("trace", b"t")], timestamp=(1, 0))


def test_a_record_too_large_for_every_ring_is_a_letter_batch_in_its_lane_position() -> None:
    sup, consumer, pool, producer = exactly_once()
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, [*msgs(TP0, 0), big(1), *msgs(TP0, 2, 3)])
    assert sup.dead_letters is not None
    assert sup.dead_letters.pending() == 0, "nothing for the supervisor's desk"
    ran = run_in_order(sup, pool)
    assert [(f.columns.first, f.letters) for f in ran] == [(0, False), (1, True), (2, False), (3, False)]
    assert producer.sent == [], "the supervisor wrote a letter outside any transaction"
    letter = ran[1]
    h = dict(letter.columns.headers[0] or ())
    assert h["ringmaster.error.type"] == b"RecordTooLarge" and h["ringmaster.source.offset"] == b"1"
    assert h["trace"] == b"t", "the record's own headers kept"
    # The letter must fit a frame: the value is cut, and says how large it was.
    assert h["ringmaster.value.truncated"] == str(BIG).encode()
    assert 0 < len(letter.columns.values[0] or b"") < BIG
    assert p.tracker.committable == 4 and sup.results.totals.dead_letters == 1


def test_the_letter_batch_waits_its_turn_and_the_batch_after_it_waits_for_it() -> None:
    """INVARIANT: the letter's transaction commits the offset past the record, so it runs only
    after the batch before it reported committed; the batch after it runs after it (one lane,
    in order), so no transaction commits past the record before its letter is written."""
    sup, consumer, pool, _producer = exactly_once()
    p = sup.partitions[TP0]
    feed(sup, consumer, TP0, [*msgs(TP0, 0), big(1), *msgs(TP0, 2)])
    order = [decode_frame(raw) for raw in pool.handles[0].ring.take()]
    assert [(f.columns.first, f.letters) for f in order if f is not None] == [(0, False), (1, True)], \
        "one worker's ring: the letter after the batch before it, the batch after it waits in the lane"
    assert p.tracker.committable is None


def test_a_record_whose_headers_alone_exceed_a_frame_still_gets_a_letter_that_fits_one() -> None:
    sup, consumer, pool, producer = exactly_once()
    huge = Message(topic=TP0[0], partition=TP0[1], offset=0, key=b"k", value=b"v",
                   headers=[(f"h{i}", b"y" * 1000) for i in range(40)], timestamp=(1, 0))
    feed(sup, consumer, TP0, [huge])
    (f,) = run_in_order(sup, pool)
    assert f.letters and producer.sent == []
    h = dict(f.columns.headers[0] or ())
    assert h["ringmaster.error.type"] == b"RecordTooLarge" and h["ringmaster.source.offset"] == b"0"
    assert int(h["ringmaster.headers.dropped"]) > 0


@pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")
def test_an_unreadable_record_is_a_letter_batch_in_its_lane_position() -> None:
    from mockwire import consumed
    from wire import RawRecord

    from runtime.kafka.messages import bind_packer

    bind_packer()
    sup, consumer, pool, producer = exactly_once()
    run = consumed([RawRecord(f"v{i}".encode(), f"k{i}".encode(),
                              [(b"good", b"1"), (b"\xff\xfebad", b"2")] if i == 1 else [(b"h", b"x")],
                              1000 + i) for i in range(3)])
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: run}, count=len(run))
    fakes.fetch(sup)
    consumer.next_fetch = lambda n, t: Fetched()
    fakes.cut(sup)
    assert sup.dead_letters is not None and sup.dead_letters.pending() == 0
    ran = run_in_order(sup, pool)
    assert [(f.columns.first, f.letters) for f in ran] == [(0, False), (1, True), (2, False)]
    assert producer.sent == []
    h = dict(ran[1].columns.headers[0] or ())
    assert h["ringmaster.error.type"] == b"UnreadableRecord" and h["good"] == b"1"
    assert ran[1].columns.values == [b"v1"]
    assert sup.partitions[TP0].tracker.committable == 3


def test_at_least_once_still_hands_the_record_to_the_supervisors_desk() -> None:
    clock = Clock()
    desk, producer = make_desk(clock)
    sup, consumer, _clock, pool = make(desk=desk, dead_letter={"topic": "dlq"}, batch_max_records=1,
                                       batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, [*msgs(TP0, 0), big(1)])
    ran = run_in_order(sup, pool)
    assert [f.letters for f in ran] == [False]
    assert producer.sent[0]["headers"]["ringmaster.error.type"] == b"RecordTooLarge"
