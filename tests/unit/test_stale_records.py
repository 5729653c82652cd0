"""Records of an older position reaching intake (invariant 1), through the real rooms.

A ``consume()`` call can hand over records fetched before the partition was sought somewhere
else: librdkafka purges what it has queued on a seek (a version barrier), but not what it has
already returned to Python. Issue 40's cluster runs and the fault row
``supervisor-killed-elsewhere-exactly-once`` ended a member with "span [349..349] overlaps or
goes backwards": a record at or below what the partition had already registered was cut and
registered again. These tests drive the loop's own steps with the fake consumer; each fails
(the crash, or a record never run) without the change it names."""

from __future__ import annotations

from fakes import TP0, RingWorker, feed, make, msgs, start

from runtime.supervisor.daemon.loop import Supervisor
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
