"""Invariant 1 at the unit level: the committable offset never passes an unfinished batch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.supervisor.partition.offsets import OffsetTracker


@st.composite
def batches_and_order(draw: st.DrawFn) -> tuple[list[tuple[int, int, int]], list[int]]:
    n = draw(st.integers(1, 40))
    spans, offset = [], draw(st.integers(0, 1000))
    for i in range(n):
        offset += draw(st.integers(0, 3))  # gaps: compaction, transaction markers
        size = draw(st.integers(1, 50))
        spans.append((i + 1, offset, offset + size - 1))
        offset += size
    order = draw(st.permutations(list(range(n))))
    k = draw(st.integers(0, n))
    return spans, list(order[:k])


@settings(max_examples=400, deadline=None)
@given(batches_and_order(), st.booleans())
def test_committable_is_end_of_done_prefix(case: tuple[list[tuple[int, int, int]], list[int]],
                                           duplicate_acks: bool) -> None:
    spans, completed = case
    t = OffsetTracker()
    for bid, first, last in spans:
        t.register(bid, first, last)
    done: set[int] = set()
    for idx in completed:
        t.complete(spans[idx][0])
        if duplicate_acks:
            assert not t.complete(spans[idx][0])  # a redelivered ack changes nothing
        done.add(idx)
        prefix = 0
        while prefix < len(spans) and prefix in done:
            prefix += 1
        expected = spans[prefix - 1][2] + 1 if prefix else None
        assert t.committable == expected
        unfinished = [spans[i][1] for i in range(len(spans)) if i not in done]
        if unfinished and t.committable is not None:
            assert t.committable <= min(unfinished)


def test_split_keeps_order_and_requires_every_part() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    t.register(2, 10, 19)
    t.split(2, [(3, 10, 14), (4, 15, 19)])
    t.complete(1)
    assert t.committable == 10
    t.complete(4)
    assert t.committable == 10
    t.complete(3)
    assert t.committable == 20


def test_register_rejects_going_backwards() -> None:
    t = OffsetTracker()
    t.register(1, 5, 9)
    with pytest.raises(ValueError):
        t.register(2, 9, 12)


def test_needs_commit_tracks_what_was_sent() -> None:
    t = OffsetTracker()
    t.register(1, 0, 4)
    assert not t.needs_commit()
    t.complete(1)
    assert t.needs_commit()
    t.mark_committed(5)
    assert not t.needs_commit()


# ---------------------------------------------------------------- offsets no consumer sees (issue 29)
def test_a_tail_the_consumer_skipped_is_done_once_the_records_before_it_are() -> None:
    t = OffsetTracker()
    t.register(1, 0, 9)
    assert t.skip_to(10, 11), "a commit marker at 10, the end reported at 11"
    assert t.committable is None, "the records before it are not done"
    t.register(2, 11, 14)
    t.complete(1)
    assert t.committable == 11
    t.complete(2)
    assert t.committable == 15


def test_a_partition_whose_first_report_is_its_end_is_committable_there_until_a_record_comes() -> None:
    t = OffsetTracker()
    assert t.start_at_end(4), "only an aborted transaction (0-2) and its marker (3): nothing visible"
    assert t.committable == 4
    assert not t.start_at_end(6), "where reading began is known now: skip_to judges later gaps"
    t = OffsetTracker()
    t.register(1, 0, 9)
    assert not t.start_at_end(11) and t.committable is None, "a record registered: not an empty start"


def test_a_tail_is_skipped_only_right_after_everything_registered() -> None:
    t = OffsetTracker()
    assert not t.skip_to(10, 11), "nothing registered: where reading began is unknown"
    t.register(1, 0, 9)
    assert not t.skip_to(5, 11), "records 5-9 are registered: not a gap"
    assert not t.skip_to(12, 14), "offsets 10-11 are not registered: a record may wait uncut there"
    assert not t.skip_to(10, 10), "nothing to skip"
    t.complete(1)
    assert t.skip_to(10, 12) and t.committable == 12
    assert not t.skip_to(10, 12), "a second end event changes nothing"
