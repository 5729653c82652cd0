"""Records of an older position reaching intake (invariant 1), through the real rooms.

A ``consume()`` call can hand over records fetched before the partition was sought somewhere
else: librdkafka purges what it has queued on a seek (a version barrier), but not what it has
already returned to Python. Issue 40's cluster runs and the fault row
``supervisor-killed-elsewhere-exactly-once`` ended a member with "span [349..349] overlaps or
goes backwards": a record at or below what the partition had already registered was cut and
registered again. These tests drive the loop's own steps with the fake consumer; each fails
(the crash, or a record never run) without the change it names."""

from __future__ import annotations

import logging
from itertools import pairwise

import fakes
import pytest
from fakes import TP0, RingWorker, assign_in_consume, feed, make, msgs, start

from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.partition.offsets import OffsetTracker
from runtime.supervisor.partition.partition import PauseReason
from runtime.tp import TP


def _run_out(sup: Supervisor, tp: TP) -> None:
    """The worker's results read and batches placed until none of tp's is out."""
    for _ in range(100):
        if not sup.scheduler.has_out(tp):
            return
        sup.applier.collect()
        sup.scheduler.dispatch(sup.capacity())
    raise AssertionError("batches still out")


def _spans(sup: Supervisor, tp: TP) -> list[tuple[int, int]]:
    """The spans registered and not done, (first, last)."""
    return [(s.first, s.last) for s in sup.partitions[tp].tracker._spans]


def test_records_returned_before_a_retried_start_are_dropped_and_reading_begins_at_the_start() -> None:
    """The straddle of a retried start (starts.py ``retry``): the partition waits for its
    committed offset (SEEKING); a consume() returns records fetched from wherever librdkafka
    was (345-350); in the same tick the retry finds the committed offset (340) and seeks
    there. Those records predate the seek: taken, they were registered (345-350), and the
    records the seek brought (340...) crashed the supervisor ("span [340..344] overlaps or
    goes backwards"); and 340-344 must not be lost either."""
    sup, consumer, clock, pool = make(batch_max_records=100, batch_max_wait_ms=0)
    consumer.seek_fails = {TP0}
    start(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    assert p.seeking
    consumer.seek_fails.clear()
    clock.now += 5.0  # past the back-off: this tick's retry seeks it
    # The tick: consume() returns them, the retry seeks, the intake takes what is left, the cut.
    feed(sup, consumer, TP0, msgs(TP0, *range(345, 351)))
    assert not p.seeking and consumer.started[-1] == [TP0]
    assert p.intake.open_msgs == [] and _spans(sup, TP0) == [], \
        "records consume() returned before the seek are not processed"
    feed(sup, consumer, TP0, msgs(TP0, *range(340, 351)))  # what the seek brings
    assert _spans(sup, TP0) == [(340, 350)], "read from the committed offset, nothing skipped"
    RingWorker(pool, 0)
    _run_out(sup, TP0)
    assert p.tracker.committable == 351


def test_a_record_at_or_below_what_was_registered_is_dropped_with_a_debug_line_not_a_crash(
        caplog: pytest.LogCaptureFixture) -> None:
    """Whatever brings them (a position that moved back under the runtime: a second start of
    a partition it holds, an offset fetch of librdkafka's own answered late), records the
    partition was already handed since it was positioned are stale: registered again they
    crashed the supervisor ("span [349..349] overlaps or goes backwards"). They are dropped,
    and what follows them is read on."""
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(340, 350)))
    assert _spans(sup, TP0) == [(340, 349)]
    with caplog.at_level(logging.DEBUG, logger="ringmaster.partition"):
        feed(sup, consumer, TP0, msgs(TP0, 349))
        feed(sup, consumer, TP0, msgs(TP0, *range(345, 356)))
    assert _spans(sup, TP0) == [(340, 349), (350, 355)], "each record registered once, in order"
    stale = [r for r in caplog.records if r.getMessage() == "stale records dropped"]
    assert [(r.__dict__["first"], r.__dict__["last"], r.__dict__["expected"]) for r in stale] == \
        [(349, 349, 350), (345, 349, 350)]
    assert all(r.levelno == logging.DEBUG for r in stale)
    RingWorker(pool, 0)
    _run_out(sup, TP0)
    assert sup.partitions[TP0].tracker.committable == 356, "every record done once, none skipped"


def test_a_partition_assigned_again_while_held_reads_on_past_what_it_registered() -> None:
    """The group assigns a partition this member holds (no revocation between): the rebalance
    step seeks it to the group's committed offset again (starts.py ``settle``), behind the
    spans it registered and whose batches are still out; the records that come again crashed
    the supervisor ("span [340..348] overlaps or goes backwards"). They are dropped: each
    record registered once, every one done."""
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, *range(340, 360)))
    p = sup.partitions[TP0]
    assign_in_consume(sup, consumer, [TP0])
    feed(sup, consumer, TP0, msgs(TP0, 360))  # this consume() straddles it: dropped
    assert sup.partitions[TP0] is p and consumer.started == [[TP0], [TP0]], "sought to its start again"
    feed(sup, consumer, TP0, msgs(TP0, *range(340, 365)))
    assert _spans(sup, TP0) == [(340, 349), (350, 359), (360, 364)]
    RingWorker(pool, 0)
    _run_out(sup, TP0)
    assert p.tracker.committable == 365


def test_records_below_the_restart_offset_after_a_rewind_are_dropped() -> None:
    """A rewound partition is read again from its restart offset; records below it that
    still come (done already: their outputs written, their offsets committable) are stale,
    and registered they crashed the supervisor ("starts below the committable offset")."""
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    RingWorker(pool, 0)
    feed(sup, consumer, TP0, msgs(TP0, *range(10)))
    _run_out(sup, TP0)
    p = sup.partitions[TP0]
    assert p.tracker.committable == 10
    feed(sup, consumer, TP0, msgs(TP0, *range(10, 20)))  # its frame in the ring, not begun
    p.rewind(PauseReason.OPERATOR, "maintenance")
    _run_out(sup, TP0)  # the worker skips it (an older epoch): it comes back not done
    sup.starts.read_again()
    assert not p.rewinding and consumer.seeks[-1] == (TP0, 10)
    p.release(PauseReason.OPERATOR)
    feed(sup, consumer, TP0, msgs(TP0, *range(5, 15)))
    assert _spans(sup, TP0) == [(10, 14)], "5-9 are done: dropped; 10-14 read again"


def test_a_share_groups_records_handed_over_again_are_new_deliveries_not_stale() -> None:
    """A share group's broker hands a released record over again (a delivery more): the
    same offsets again are work to do, never dropped as stale."""
    p = fakes.partition(share=True)
    p.fetched(msgs(TP0, *range(5, 10)), 0.0)
    p.fetched(msgs(TP0, 5, 6), 0.0)
    assert [m.offset() for m in p.intake.open_msgs] == [5, 6, 7, 8, 9, 5, 6]


def test_handled_to_is_past_every_record_registered_or_done() -> None:
    t = OffsetTracker()
    assert t.handled_to is None, "nothing handed out yet"
    t.register(1, 340, 349)
    t.register(2, 350, 359)
    assert t.handled_to == 360
    t.complete(1)
    t.discard_unfinished()
    assert t.handled_to == 350, "after a rewind: the committable offset, where reading starts again"
    assert t.skip_to(350, 353)
    assert t.handled_to == 353, "an invisible tail counts as handed out"


def test_a_run_that_repeats_a_record_or_goes_back_keeps_each_record_once_in_order(
        caplog: pytest.LogCaptureFixture) -> None:
    """One consume()'s records of a partition out of order: a record twice (as an end event
    handed over as a record made it, beside the real one), a jump back into the run. Cut as
    they came, the second copy went backwards ("span [24..24] overlaps or goes backwards").
    The repeats are dropped, with a warning; every record is run once."""
    sup, consumer, _clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    start(sup, consumer, [TP0])
    with caplog.at_level(logging.WARNING, logger="ringmaster.partition"):
        feed(sup, consumer, TP0, msgs(TP0, *range(15, 25), 24))
        feed(sup, consumer, TP0, msgs(TP0, *range(25, 31), *range(27, 36)))
    spans = _spans(sup, TP0)
    assert spans[0] == (15, 24) and spans[-1][1] == 35, spans
    assert all(b[0] == a[1] + 1 for a, b in pairwise(spans)), \
        f"each record registered once, in order: {spans}"
    said = [r for r in caplog.records if r.getMessage().startswith("records out of order")]
    assert [(r.__dict__["records"], r.__dict__["kept"]) for r in said] == [(11, 10), (15, 11)]
    RingWorker(pool, 0)
    _run_out(sup, TP0)
    assert sup.partitions[TP0].tracker.committable == 36
