"""Commits (runtime/supervisor/group/commits.py) on the loop's clock: the periodic commit is
asynchronous, goes out once commit_interval_ms has passed and not before, and carries only
what moved; a synchronous one answers per partition. Found by mutation testing: the periodic
step was reached only end to end."""

from __future__ import annotations

from fakes import TP0, TP1, assign, make


def done(sup: object, tp: object, first: int, last: int, bid: int) -> None:
    p = sup.partitions[tp]  # type: ignore[attr-defined]
    p.tracker.register(bid, first, last)
    p.tracker.complete(bid)


def test_the_periodic_commit_goes_out_once_its_interval_has_passed() -> None:
    sup, consumer, clock, _pool = make()
    sup.commits.interval_s = 1.0
    assign(sup, consumer, [TP0, TP1])
    done(sup, TP0, 0, 9, 1)
    sup.commits.commit_if_due()
    assert consumer.commits == [], "not due yet"
    clock.now += 0.999
    sup.commits.commit_if_due()
    assert consumer.commits == []
    clock.now += 0.001
    sup.commits.commit_if_due()
    assert consumer.commits == [{TP0: 10}], "due: what moved, asynchronously"
    assert consumer.acknowledged == {}, "an asynchronous commit is not waited for"
    done(sup, TP1, 0, 4, 2)
    clock.now += 0.5
    sup.commits.commit_if_due()
    assert len(consumer.commits) == 1, "the interval starts again at each commit"
    clock.now += 0.5
    sup.commits.commit_if_due()
    assert consumer.commits[-1] == {TP1: 5}, "only what moved since"
    assert sup.commits.committed == {TP0: 10, TP1: 5}


def test_a_synchronous_commit_answers_for_each_partition_with_its_offset() -> None:
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0, TP1])
    done(sup, TP0, 0, 9, 1)
    consumer.refuse_sync = {TP0: "REBALANCE_IN_PROGRESS"}
    answers = sup.commits.commit(list(sup.partitions.values()), asynchronous=False)
    assert answers[TP0].offset == 10 and answers[TP0].refused == "REBALANCE_IN_PROGRESS"
    assert answers[TP1].offset is None and answers[TP1].refused is None
    assert answers[TP0].epoch == sup.partitions[TP0].epoch
    assert sup.partitions[TP0].tracker.committed is None, "a refused offset is not taken as committed"
    assert sup.commits.commit(list(sup.partitions.values()), asynchronous=True) == {}, "none asynchronously"
