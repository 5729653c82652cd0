"""Crash isolation (runtime/supervisor/datapath/isolation.py, applied by results.py): a batch that
keeps crashing workers is bisected down to the record at fault, which is dead-lettered; no
record is ever dropped, and the commit never passes the poison record before the broker
acknowledged its dead letter (invariants 1 and 8). The pure decision is tested on its own;
the story through the supervisor's rooms and the real dead-letter desk at the end."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from fakes import feed, make, make_desk, msgs, redeliver, report, start

from runtime.supervisor.datapath.isolation import isolate
from runtime.supervisor.partition.offsets import OffsetTracker
from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.workers.workforce import Death
from runtime.transport.frames import DONE, Columns, Result, decode_frame, encode_batch

TP = ("in", 4)


def columns(offsets: list[int]) -> Columns:
    n = len(offsets)
    contiguous = offsets[-1] - offsets[0] + 1 == n
    return Columns(offsets[0], None if contiguous else offsets, [f"k{o}".encode() for o in offsets],
                   [f"v{o}".encode() for o in offsets],
                   [[("h", f"{o}".encode())] for o in offsets], 1, [1000 + o for o in offsets])


def batch(batch_id: int, offsets: list[int], crashes: int = 0, bucket: int | None = 2) -> Batch:
    cols = columns(offsets)
    frame = encode_batch(batch_id, 5, 9, TP[0], TP[1], cols)
    return Batch(batch_id, TP, 5, 9, cols.first, cols.last, len(cols), frame, bucket, crashes=crashes)


def offsets_of(b: Batch) -> list[int]:
    frame = decode_frame(b.frame)
    assert frame is not None
    return list(frame.columns.offset_list())


def ids(start: int) -> itertools.count[int]:
    return itertools.count(start)


@pytest.mark.parametrize("crashes", [0, 1])
def test_a_batch_below_max_crashes_is_delivered_again_as_it_is(crashes: int) -> None:
    b = batch(7, list(range(10, 20)), crashes=crashes)
    counter = ids(100)
    iso = isolate(b, 2, lambda: next(counter))
    assert iso.requeue == [b] and iso.requeue[0] is b
    assert iso.split is None and iso.dead_letter is None
    assert next(counter) == 100, "no id was taken"


@pytest.mark.parametrize("offsets", [list(range(10, 20)), [10, 11, 15, 16, 17, 30, 31],
                                     [3, 7], [0, 1, 2]],
                         ids=["contiguous", "gaps", "two", "odd"])
def test_at_max_crashes_a_batch_becomes_two_halves_covering_exactly_its_records(offsets: list[int]) -> None:
    b = batch(7, offsets, crashes=3, bucket=1)
    counter = ids(100)
    iso = isolate(b, 3, lambda: next(counter))
    assert iso.dead_letter is None
    left, right = iso.requeue
    assert offsets_of(left) + offsets_of(right) == offsets, "every record once, in offset order"
    assert len(offsets_of(left)) == len(offsets) // 2
    assert (left.batch_id, right.batch_id) == (100, 101)
    for half, part in zip((left, right), (offsets[: len(offsets) // 2], offsets[len(offsets) // 2:]),
                          strict=True):
        assert (half.tp, half.slot, half.epoch, half.bucket) == (TP, 5, 9, 1)
        assert (half.first, half.last, half.count) == (part[0], part[-1], len(part))
        assert half.crashes == 2, "one crash short of the limit: one more crash bisects it again"
        frame = decode_frame(half.frame)
        assert frame is not None
        assert (frame.batch_id, frame.slot, frame.epoch, frame.topic, frame.partition) == \
            (half.batch_id, 5, 9, TP[0], TP[1])
        assert frame.columns.keys == [f"k{o}".encode() for o in part]
        assert frame.columns.values == [f"v{o}".encode() for o in part]
        assert frame.columns.headers == [[("h", f"{o}".encode())] for o in part]
        assert frame.columns.timestamps == [1000 + o for o in part]
    assert iso.split == [(100, left.first, left.last), (101, right.first, right.last)]


def test_the_split_is_what_the_offset_tracker_accepts_in_place_of_the_batch() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    t.register(7, 10, 16)
    b = batch(7, [10, 11, 12, 14, 16], crashes=2)
    iso = isolate(b, 2, iter([50, 51]).__next__)
    assert iso.split is not None
    t.split(7, iso.split)
    assert not t.is_pending(7) and t.is_pending(50) and t.is_pending(51)
    t.complete(1)
    t.complete(51)
    assert t.committable == 10
    t.complete(50)
    assert t.committable == 17


def test_a_one_record_batch_at_max_crashes_is_dead_lettered_not_requeued() -> None:
    b = batch(7, [42], crashes=2)
    iso = isolate(b, 2, lambda: pytest.fail("no new batch for a single record"))  # type: ignore[arg-type]
    assert iso.requeue == [] and iso.split is None
    assert iso.dead_letter == (42, b"k42", b"v42", [("h", b"42")])


def test_a_one_record_batch_without_headers_is_dead_lettered_with_none() -> None:
    cols = Columns(8, None, [None], [b"poison"], None, 0, [5])
    b = Batch(3, TP, 0, 1, 8, 8, 1, encode_batch(3, 0, 1, TP[0], TP[1], cols), None, crashes=1)
    assert isolate(b, 1, lambda: 0).dead_letter == (8, None, b"poison", None)


@pytest.mark.parametrize("poison_index", [0, 5, 7, 8, 15])
@pytest.mark.parametrize("max_crashes", [1, 2, 3])
def test_repeated_crashes_bisect_down_to_the_poison_record_and_commit_waits_for_its_dead_letter(
        poison_index: int, max_crashes: int) -> None:
    """Through the supervisor's rooms: intake cuts one batch of 16 records (gaps:
    compaction), a worker dies whenever it runs the poison record, results.py isolates
    (retry, bisect) and hands the record to the real dead-letter desk; the commit stays at
    the poison record until the broker acknowledges that letter, and nothing is dropped."""
    offsets = [100 + 2 * i for i in range(16)]
    poison = offsets[poison_index]
    clock_box: list[Any] = []
    desk, producer = make_desk(lambda: clock_box[0]())
    sup, consumer, clock, pool = make(desk=desk, dead_letter={"topic": "dlq", "max_crashes": max_crashes},
                                      batch_max_records=16, batch_max_wait_ms=0)
    clock_box.append(clock)
    start(sup, consumer, [TP])
    p = sup.partitions[TP]
    feed(sup, consumer, TP, msgs(TP, *offsets))
    crashes = ran = 0
    while pool.handles[0].ring.frames:
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            if poison in f.columns.offset_list():
                crashes += 1  # the worker dies running it; the frames behind it go back too
                sup.applier.collect()  # what it reported before it died is read first (workforce.manage)
                redeliver(sup, Death(0, f.batch_id, "killed by SIGKILL"))
                break
            ran += len(f.columns)
            report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns)))
        sup.applier.collect()
        sup.deliver_dead_letters()
        done = p.tracker.committable
        assert done is None or done <= poison, "committed past the poison record before its dead letter"
        sup.scheduler.dispatch(sup.capacity())
    # The pieces before it are done and committable (a revocation mid-bisection commits them).
    assert p.tracker.committable == (poison if poison_index else None)
    (letter,) = producer.sent
    assert letter["value"] == b"v" and letter["headers"]["ringmaster.source.offset"] == str(poison).encode()
    assert ran == 15, "every other record ran once"
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert p.tracker.committable == offsets[-1] + 1, "every record handled, nothing dropped"
    assert p.tracker.unfinished == 0
    # 16 records: 4 bisections; max_crashes crashes before the first, one per level after it.
    assert crashes == max_crashes + 4


def _exactly_once(max_crashes: int, **w: Any) -> tuple[Any, Any, Any, Any, Any]:
    clock_box: list[Any] = []
    desk, producer = make_desk(lambda: clock_box[0]())
    sup, consumer, clock, pool = make(desk=desk, dead_letter={"topic": "dlq", "max_crashes": max_crashes},
                                      **w)
    clock_box.append(clock)
    sup.results.transactional = True  # output.guarantee = "exactly-once"
    start(sup, consumer, [TP])
    return sup, consumer, clock, pool, producer


@pytest.mark.parametrize("poison_index", [0, 7, 15])
def test_under_exactly_once_the_poison_records_letter_is_a_batch_for_a_workers_transaction(
        poison_index: int) -> None:
    """Exactly-once: the supervisor writes no letter of its own (outside a transaction, read
    again by the partition's next owner); the letter goes back into the lane as a LETTERS
    batch in the record's place, completed by the worker's commit. A worker that dies running
    that batch does not make a second letter, nor bisect anything."""
    offsets = [100 + 2 * i for i in range(16)]
    poison = offsets[poison_index]
    sup, consumer, _clock, pool, producer = _exactly_once(2, batch_max_records=16, batch_max_wait_ms=0)
    p = sup.partitions[TP]
    feed(sup, consumer, TP, msgs(TP, *offsets))
    crashes = ran = 0
    letters: list[Any] = []
    while pool.handles[0].ring.frames:
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            if f.letters and not letters:
                letters.append(f)  # the first worker to run it dies writing it
                sup.applier.collect()
                redeliver(sup, Death(0, f.batch_id, "killed by SIGKILL"))
                break
            if f.letters or poison in f.columns.offset_list():
                if not f.letters:
                    crashes += 1
                    sup.applier.collect()
                    redeliver(sup, Death(0, f.batch_id, "killed by SIGKILL"))
                    break
                letters.append(f)
            ran += len(f.columns) * (not f.letters)
            report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns),
                                   dead_letters=len(f.columns) * f.letters))
        sup.applier.collect()
        sup.deliver_dead_letters()
        sup.scheduler.dispatch(sup.capacity())
    assert producer.sent == [], "the supervisor wrote a dead letter outside any transaction"
    first, second = letters
    for f in letters:
        assert (f.topic, f.partition, list(f.columns.offset_list())) == (TP[0], TP[1], [poison])
        (headers,) = f.columns.headers
        h = dict(headers)
        assert f.columns.values == [b"v"]  # msgs() gives every record the value b"v"
        assert h["ringmaster.source.offset"] == str(poison).encode()
        assert h["ringmaster.error.type"] == b"WorkerCrashed" and h["ringmaster.attempts"] == b"2"
    assert first.batch_id == second.batch_id, "the same batch again, not a new letter"
    assert ran == 15 and crashes == 2 + 4, "every other record ran once; no crash bisected the letter"
    assert p.tracker.committable == offsets[-1] + 1 and p.tracker.unfinished == 0
    assert sup.results.totals.dead_letters == 1


def test_under_exactly_once_the_letter_batch_runs_after_the_batches_before_its_record() -> None:
    """Its transaction commits the offset after the record: right only once every batch
    before it in the partition has committed. A dead worker's earlier batches, not yet
    reported, go back in front of the letter, in order."""
    sup, consumer, _clock, pool, producer = _exactly_once(1, batch_max_records=1, batch_max_wait_ms=0)
    feed(sup, consumer, TP, msgs(TP, 10, 11, 12))
    frames = [decode_frame(raw) for raw in pool.handles[0].ring.take()]
    assert [f.columns.first for f in frames if f is not None] == [10, 11], "12 waits in the lane"
    crashed = frames[1]
    assert crashed is not None
    redeliver(sup, Death(0, crashed.batch_id, "killed by SIGKILL"))  # 10 ran, not reported
    again = []
    sup.scheduler.dispatch(sup.capacity())
    while pool.handles[0].ring.frames:
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            again.append((f.columns.first, f.letters))
            report(pool, 0, Result(DONE, f.batch_id, f.slot, f.epoch, processed=1))
        sup.applier.collect()
        sup.scheduler.dispatch(sup.capacity())
    assert again == [(10, False), (11, True), (12, False)]
    assert sup.partitions[TP].tracker.committable == 13
    assert producer.sent == []


def test_a_letter_batch_is_made_only_for_one_record_of_a_partition_ordered_lane() -> None:
    from runtime.execution.deadletter_format import DeadLetter
    from runtime.supervisor.datapath.isolation import letters_batch

    letter = DeadLetter(b"k", b"v", [("ringmaster.error.type", b"WorkerCrashed")], "whole")

    def letter_at(_limit: int) -> DeadLetter:
        return letter

    with pytest.raises(ValueError):  # a key lane: batches finish out of order
        letters_batch(batch(7, [42], crashes=2, bucket=3), letter_at, 1 << 20, 1 << 20)
    with pytest.raises(ValueError):
        letters_batch(batch(7, [42, 43], crashes=2, bucket=None), letter_at, 1 << 20, 1 << 20)
    made = letters_batch(batch(7, [42], crashes=2, bucket=None), letter_at, 1 << 20, 1 << 20)
    f = decode_frame(made.frame)
    assert f is not None and f.letters and made.letters
    assert (made.batch_id, made.first, made.last, made.count, made.crashes) == (7, 42, 42, 1, 2)
    assert (f.batch_id, f.slot, f.epoch, list(f.columns.offset_list())) == (7, 5, 9, [42])
    assert (f.columns.keys, f.columns.values, f.columns.headers) == \
        ([b"k"], [b"v"], [[("ringmaster.error.type", b"WorkerCrashed")]])


def test_under_exactly_once_a_letter_that_kills_max_crashes_workers_of_its_own_goes_to_the_desk() -> None:
    """The letter holds the record's bytes: if writing it kills workers too, the record is
    not stuck for good. After max_crashes deaths of its own the supervisor's desk writes it
    (outside any transaction: at-least-once for that letter), and its ack completes the batch."""
    sup, consumer, _clock, pool, producer = _exactly_once(1, batch_max_records=1, batch_max_wait_ms=0)
    p = sup.partitions[TP]
    feed(sup, consumer, TP, msgs(TP, 10))
    deaths = 0
    while pool.handles[0].ring.frames:
        (raw,) = pool.handles[0].ring.take()
        f = decode_frame(raw)
        assert f is not None
        deaths += 1
        redeliver(sup, Death(0, f.batch_id, "killed by SIGKILL"))
        sup.deliver_dead_letters()
        sup.scheduler.dispatch(sup.capacity())
    assert deaths == 1 + 1, "the record once (max_crashes 1), then its letter once"
    (letter,) = producer.sent
    assert letter["headers"]["ringmaster.source.offset"] == b"10"
    assert letter["headers"]["ringmaster.error.type"] == b"WorkerCrashed"
    assert p.tracker.committable is None, "not before the letter is acknowledged"
    producer.deliver_next(None)
    sup.deliver_dead_letters()
    assert p.tracker.committable == 11


def test_the_letter_of_a_record_that_crashes_workers_fits_a_frame_of_the_ring() -> None:
    """A record that fitted its ring, with a traceback and the reasons in its letter's
    headers, can make a letter larger than any frame: such a LETTERS batch could never be
    placed and its partition would wait for good. The letter is cut to fit the smaller of
    message.max.bytes and the frame limit, as a record set aside at intake is."""
    from runtime.supervisor.datapath.deadletter_desk import supervisor_letter
    from runtime.supervisor.datapath.isolation import letters_batch

    max_frame = 64 * 1024
    row = (42, b"k", b"x" * (max_frame - 100), [("h", b"y" * 2000)])

    def letter_at(limit: int):  # type: ignore[no-untyped-def]
        return supervisor_letter(TP, row, "WorkerCrashed", "worker killed by SIGKILL" * 50, limit)

    made = letters_batch(batch(7, [42], crashes=3, bucket=None), letter_at, 1_000_000, max_frame)
    assert len(made.frame) <= max_frame
    f = decode_frame(made.frame)
    assert f is not None and f.letters
    headers = dict(f.columns.headers[0])
    assert headers["ringmaster.value.truncated"] == str(max_frame - 100).encode()
    assert headers["ringmaster.error.type"] == b"WorkerCrashed"
