"""runtime.supervisor.partition.offsets.OffsetTracker with lanes: a cut (span) of a partition is handed out as
several batches whose offsets interleave (key ordering), batches finish in any order, some
are bisected before they finish. The committable offset is the end of the longest prefix of
fully done spans, and never passes a record that is not done (invariant 1)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.supervisor.partition.offsets import OffsetTracker


@dataclass
class Span:
    offsets: list[int]
    parts: dict[int, list[int]] = field(default_factory=dict)  # batch id -> its record offsets
    split: bool = False  # a batch of it was bisected

    @property
    def first(self) -> int:
        return self.offsets[0]

    @property
    def last(self) -> int:
        return self.offsets[-1]


@dataclass
class Model:
    spans: list[Span] = field(default_factory=list)
    registered: int = 0  # spans[:registered] are registered in the tracker
    pending: dict[int, tuple[int, list[int]]] = field(default_factory=dict)  # id -> (span, offsets)
    next_id: int = 1

    def span_done(self, i: int) -> bool:
        return not any(s == i for s, _ in self.pending.values())

    def expected_committable(self) -> int | None:
        prefix = 0
        while prefix < self.registered and self.span_done(prefix):
            prefix += 1
        done = self.spans[prefix - 1].last + 1 if prefix else None
        if prefix < self.registered and self.spans[prefix].split:
            # A bisected head span: the offsets below its lowest piece not done are done.
            low = min(offs[0] for s, offs in self.pending.values() if s == prefix)
            if low > self.spans[prefix].first:
                return low
        return done

    def expected_uncommitted(self) -> int:
        prefix = 0
        while prefix < self.registered and self.span_done(prefix):
            prefix += 1
        return sum(len(s.offsets) for s in self.spans[prefix:self.registered])


def check(t: OffsetTracker, m: Model) -> None:
    expected = m.expected_committable()
    assert t.committable == expected
    lowest_pending = min((min(offs) for _, offs in m.pending.values()), default=None)
    if t.committable is not None and lowest_pending is not None:
        assert t.committable <= lowest_pending, "committable passed a record that is not done"
    assert t.unfinished == len(m.pending)
    assert t.uncommitted_records == m.expected_uncommitted()
    if expected is not None:
        assert t.restart_offset() == expected
    elif m.registered:
        assert t.restart_offset() == m.spans[0].first


@st.composite
def cuts(draw: st.DrawFn) -> list[tuple[list[int], int]]:
    """Spans (record offsets with gaps, lane count)."""
    offset = draw(st.integers(0, 10_000))
    out = []
    for _ in range(draw(st.integers(1, 12))):
        offset += draw(st.integers(0, 5))  # a gap between cuts
        offsets = []
        for _ in range(draw(st.integers(1, 30))):
            offsets.append(offset)
            offset += draw(st.sampled_from([1, 1, 1, 2, 7]))  # gaps inside (compaction, markers)
        out.append((offsets, draw(st.integers(1, 4))))
    return out


@settings(max_examples=200, deadline=None)
@given(cuts(), st.data())
def test_committable_is_the_end_of_the_done_prefix_whatever_the_lanes_and_the_order(
        spec: list[tuple[list[int], int]], data: st.DataObject) -> None:
    t = OffsetTracker()
    m = Model()
    for offsets, lanes in spec:
        span = Span(offsets)
        by_lane: dict[int, list[int]] = {}
        for o in offsets:
            by_lane.setdefault(data.draw(st.integers(0, lanes - 1)), []).append(o)
        for lane_offsets in by_lane.values():
            span.parts[m.next_id] = lane_offsets
            m.next_id += 1
        m.spans.append(span)
    check(t, m)
    while m.registered < len(m.spans) or m.pending:
        actions = []
        if m.registered < len(m.spans):
            actions.append("register")
        if m.pending:
            actions += ["complete", "complete", "duplicate"]
            if any(len(offs) > 1 for _, offs in m.pending.values()):
                actions.append("split")
        action = data.draw(st.sampled_from(actions))
        if action == "register":
            i = m.registered
            span = m.spans[i]
            parts = [(bid, offs[0], offs[-1]) for bid, offs in span.parts.items()]
            t.register_span(span.first, span.last, data.draw(st.permutations(parts)), len(span.offsets))
            m.registered += 1
            m.pending.update({bid: (i, offs) for bid, offs in span.parts.items()})
        elif action == "complete":
            bid = data.draw(st.sampled_from(sorted(m.pending)))
            before = m.expected_committable()
            del m.pending[bid]
            assert t.complete(bid) == (m.expected_committable() != before)
        elif action == "duplicate":
            done = [bid for s in m.spans[:m.registered] for bid in s.parts if bid not in m.pending]
            bid = data.draw(st.sampled_from(done)) if done else 10**9
            assert t.complete(bid) is False, "a duplicate or unknown acknowledgement changes nothing"
        else:  # split: bisect a pending batch (crash isolation)
            bid = data.draw(st.sampled_from(sorted(b for b, (_, o) in m.pending.items() if len(o) > 1)))
            span_i, offs = m.pending.pop(bid)
            k = data.draw(st.integers(1, len(offs) - 1))
            halves = [(m.next_id, offs[:k]), (m.next_id + 1, offs[k:])]
            m.next_id += 2
            t.split(bid, [(hid, h[0], h[-1]) for hid, h in halves])
            m.spans[span_i].split = True
            for hid, h in halves:
                m.pending[hid] = (span_i, h)
                m.spans[span_i].parts[hid] = h
        check(t, m)
    assert t.committable == m.spans[-1].last + 1
    assert t.uncommitted_records == 0 and t.unfinished == 0


# ---------------------------------------------------------------------- examples
def test_interleaved_lanes_commit_only_when_every_lane_of_the_span_is_done() -> None:
    t = OffsetTracker()
    # span [0..9]: lane A has 0,2,4,6,8 ; lane B has 1,3,5,7,9
    t.register_span(0, 9, [(1, 0, 8), (2, 1, 9)], 10)
    t.register_span(10, 14, [(3, 10, 14)], 5)
    assert t.complete(2) is False and t.committable is None
    assert t.complete(3) is False and t.committable is None, "a later span done first commits nothing"
    assert t.uncommitted_records == 15
    assert t.complete(1) is True and t.committable == 15
    assert t.uncommitted_records == 0


def test_uncommitted_records_counts_every_record_past_the_committable_offset() -> None:
    t = OffsetTracker()
    assert t.uncommitted_records == 0
    t.register_span(0, 9, [(1, 0, 9)], 10)
    t.register_span(20, 29, [(2, 20, 25), (3, 21, 29)], 7)  # gaps: 7 records
    assert t.uncommitted_records == 17
    t.complete(2)
    assert t.uncommitted_records == 17, "done but not committable still counts"
    t.complete(1)
    assert t.uncommitted_records == 7
    t.complete(3)
    assert t.uncommitted_records == 0


def test_restart_offset_is_the_first_registered_offset_then_the_committable_one() -> None:
    t = OffsetTracker()
    assert t.restart_offset() is None
    t.register(1, 40, 49)
    t.register(2, 52, 60)
    assert t.restart_offset() == 40
    t.complete(2)
    assert t.restart_offset() == 40
    t.complete(1)
    assert t.restart_offset() == 61
    assert OffsetTracker(start=17).restart_offset() == 17


def test_after_discarding_the_unfinished_the_partition_is_registered_again_from_restart_offset() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    t.register_span(10, 19, [(2, 10, 18), (3, 11, 19)], 10)
    t.register(4, 20, 29)
    t.complete(1)
    t.complete(3)
    t.complete(4)
    assert t.committable == 10
    t.discard_unfinished()  # a rewind: read again from restart_offset()
    assert t.unfinished == 0 and t.uncommitted_records == 0
    restart = t.restart_offset()
    assert restart == 10
    assert t.complete(2) is False, "a batch still out there completes nothing after the rewind"
    t.register(5, restart, 19)
    t.register(6, 20, 29)
    t.complete(6)
    assert t.committable == 10
    t.complete(5)
    assert t.committable == 30


def test_discarding_before_anything_is_done_restarts_at_the_first_offset_ever_registered() -> None:
    t = OffsetTracker()
    t.register(1, 100, 109)
    t.register(2, 110, 119)
    t.discard_unfinished()
    assert t.restart_offset() == 100 and t.committable is None
    t.register(3, 100, 119)
    t.complete(3)
    assert t.committable == 120


@pytest.mark.parametrize(("first", "last"), [(5, 9), (9, 12), (0, 3), (7, 8)])
def test_register_span_refuses_a_span_that_overlaps_or_goes_backwards(first: int, last: int) -> None:
    t = OffsetTracker()
    t.register(1, 5, 9)
    with pytest.raises(ValueError, match="overlaps or goes backwards"):
        t.register_span(first, last, [(2, first, last)], last - first + 1)
    assert t.unfinished == 1 and t.uncommitted_records == 5


def test_register_span_refuses_a_span_below_the_committable_offset() -> None:
    t = OffsetTracker(start=50)
    with pytest.raises(ValueError, match="below the committable offset"):
        t.register(1, 40, 60)


def test_register_span_refuses_an_empty_span() -> None:
    t = OffsetTracker()
    with pytest.raises(ValueError):
        t.register_span(5, 4, [(1, 5, 4)], 0)
    with pytest.raises(ValueError):
        t.register_span(5, 9, [], 5)


@pytest.mark.parametrize("parts", [[(1, 0, 10)], [(1, -1, 9)], [(1, 0, 5), (2, 6, 12)], [(1, 5, 3)],
                                   [(1, 0, 4), (1, 5, 9)]],
                         ids=["past-end", "before-start", "second-outside", "backwards", "same-id"])
def test_register_span_refuses_parts_that_are_not_new_parts_inside_the_span(
        parts: list[tuple[int, int, int]]) -> None:
    t = OffsetTracker()
    with pytest.raises(ValueError, match="is not a new part"):
        t.register_span(0, 9, parts, 10)


def test_register_span_refuses_a_batch_id_already_pending() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    with pytest.raises(ValueError, match="is not a new part"):
        t.register(1, 10, 19)


def test_a_refused_register_span_leaves_the_tracker_as_it_was() -> None:
    t = OffsetTracker()
    with pytest.raises(ValueError):
        t.register_span(0, 9, [(1, 0, 4), (2, 5, 12)], 10)
    assert t.unfinished == 0 and t.uncommitted_records == 0
    t.register_span(0, 9, [(1, 0, 4), (2, 5, 9)], 10)  # the corrected call
    t.complete(1)
    t.complete(2)
    assert t.committable == 10


def test_complete_of_an_unknown_or_already_done_batch_returns_false() -> None:
    t = OffsetTracker()
    assert t.complete(1) is False
    t.register(1, 0, 4)
    t.register(2, 5, 9)
    assert t.complete(2) is False, "done, but the span before it is not"
    assert t.complete(2) is False
    assert t.complete(1) is True
    assert t.complete(1) is False and t.complete(99) is False
    assert t.committable == 10


def test_split_refuses_unknown_batches_and_parts_outside_the_batch() -> None:
    t = OffsetTracker()
    t.register(1, 10, 19)
    with pytest.raises(ValueError, match="not pending"):
        t.split(7, [(8, 10, 14)])
    with pytest.raises(ValueError, match="inside the batch"):
        t.split(1, [(2, 9, 14), (3, 15, 19)])
    with pytest.raises(ValueError, match="inside the batch"):
        t.split(1, [(2, 10, 14), (3, 15, 20)])
    with pytest.raises(ValueError, match="inside the batch"):
        t.split(1, [])
    assert t.is_pending(1)


def test_split_refuses_a_new_part_id_that_is_already_pending() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    t.register(2, 10, 19)
    with pytest.raises(ValueError):
        t.split(2, [(1, 10, 14), (3, 15, 19)])


# ---------------------------------------------------------------------- found by mutation testing
def test_split_into_more_than_two_parts_checks_the_last_one() -> None:
    t = OffsetTracker()
    t.register(1, 10, 19)
    with pytest.raises(ValueError):
        t.split(1, [(2, 10, 12), (3, 13, 15), (4, 16, 25)])  # the last part reaches past the batch
    assert t.is_pending(1), "a refused split changes nothing"
    t.split(1, [(2, 10, 12), (3, 13, 15), (4, 16, 19)])
    for bid in (2, 4):
        t.complete(bid)
    assert t.committable == 13, "the done piece at the start of a bisected batch, not the one after a gap"
    t.complete(3)
    assert t.committable == 20


def test_the_oldest_unhandled_span_is_known_until_it_is_done() -> None:
    t = OffsetTracker()
    assert t.oldest_at() is None
    t.register(1, 0, 9, at=5.0)
    t.register(2, 10, 19, at=7.0)
    assert t.oldest_at() == 5.0
    t.complete(1)
    assert t.oldest_at() == 7.0
    t.complete(2)
    assert t.oldest_at() is None


def test_restart_offset_is_the_first_span_not_the_first_offset_ever_once_those_were_discarded() -> None:
    t = OffsetTracker()
    t.register(1, 100, 109)
    t.discard_unfinished()
    t.register(2, 120, 129)  # registered again after a rewind that skipped nothing handled
    assert t.restart_offset() == 120
