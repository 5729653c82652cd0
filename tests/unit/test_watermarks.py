"""runtime.kafka.watermarks.LatestOffsets: the end of paused partitions is asked for at most
once per interval, one request at a time, never waited for, abandoned when late; an answer
only ever raises a partition's end; partitions let go are forgotten."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from runtime.kafka.watermarks import LatestOffsets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeLister:
    def __init__(self) -> None:
        self.requests: list[list[tuple[str, int]]] = []
        self.futures: dict[TopicPartition, Future[Any]] = {}

    def list_offsets(self, requests: dict[TopicPartition, Any],
                     **kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        assert kwargs["request_timeout"] > 0
        self.requests.append(sorted((tp.topic, tp.partition) for tp in requests))
        self.futures = {tp: Future() for tp in requests}
        return self.futures

    def answer(self, **offsets: int) -> None:
        for tp, fut in self.futures.items():
            key = f"{tp.topic}{tp.partition}"
            if key in offsets:
                fut.set_result(SimpleNamespace(offset=offsets[key]))
            else:
                fut.set_exception(KafkaException("UNKNOWN_TOPIC_OR_PART"))


def make() -> tuple[LatestOffsets, FakeLister, Clock]:
    clock, lister = Clock(), FakeLister()
    latest = LatestOffsets({}, interval_s=5.0, timeout_s=10.0, clock=clock, lister=lambda: lister)
    return latest, lister, clock


def test_paused_partitions_are_asked_for_at_most_once_per_interval_and_never_waited_for() -> None:
    latest, lister, clock = make()
    paused = [("t", 0), ("t", 1)]
    latest.refresh(paused)
    assert lister.requests == [paused]
    assert latest.high(("t", 0)) is None, "no answer yet: nothing is waited for"
    clock.now += 1
    latest.refresh(paused)
    assert len(lister.requests) == 1, "one request in flight at a time"
    lister.answer(t0=120)  # t[1]: the broker could not say
    latest.refresh(paused)
    assert latest.high(("t", 0)) == 120 and latest.high(("t", 1)) is None
    assert len(lister.requests) == 1, "the next question waits for the interval"
    clock.now += 5
    latest.refresh(paused)
    assert len(lister.requests) == 2


def test_an_answer_never_lowers_a_partitions_end() -> None:
    latest, lister, clock = make()
    latest.refresh([("t", 0)])
    lister.answer(t0=500)
    clock.now += 5
    latest.refresh([("t", 0)])
    lister.answer(t0=480)  # a stale answer (a broker whose ListOffsets lags)
    clock.now += 5
    latest.refresh([("t", 0)])
    assert latest.high(("t", 0)) == 500


def test_a_request_without_an_answer_is_abandoned_after_its_timeout() -> None:
    latest, lister, clock = make()
    latest.refresh([("t", 0)])
    clock.now += 10.5
    latest.refresh([("t", 0)])
    assert len(lister.requests) == 2, "asked again once the first is given up"


def test_nothing_paused_asks_nothing_and_forgotten_partitions_are_gone() -> None:
    made: list[int] = []
    lister = FakeLister()
    latest = LatestOffsets({}, clock=Clock(), lister=lambda: made.append(1) or lister)  # type: ignore[func-returns-value]
    latest.refresh([])
    assert made == [] and lister.requests == [], "no admin client until something is paused"
    latest.refresh([("t", 3)])
    lister.answer(t3=9)
    latest.refresh([])
    assert latest.high(("t", 3)) == 9
    latest.forget([("t", 3)])
    assert latest.high(("t", 3)) is None


def test_a_stopping_member_asks_for_nothing_more() -> None:
    """At a stop every partition is paused and the final status reads their ends: a request
    started then kept the process from exiting until it timed out (seen as a member that did
    not exit within 60 s of SIGTERM while the group rebalanced)."""
    latest, lister, clock = make()
    latest.refresh([("t", 0)])
    assert len(lister.requests) == 1
    latest.abandon()
    clock.now += 60
    latest.refresh([("t", 0), ("t", 1)])
    assert len(lister.requests) == 1, "nothing asked after abandon()"


def test_a_client_whose_answer_came_back_short_is_replaced_before_the_next_ask() -> None:
    """STALE_LEADERS (runtime/kafka/admin.py): an error, an offset below zero or no answer in
    time; an answer in full keeps the client."""
    clock, lister = Clock(), FakeLister()
    made: list[FakeLister] = []

    def factory() -> FakeLister:
        made.append(lister)
        return lister

    latest = LatestOffsets({}, interval_s=5.0, timeout_s=10.0, clock=clock, lister=factory)
    paused = [("t", 0), ("t", 1)]
    latest.refresh(paused)
    lister.answer(t0=10, t1=20)
    clock.now += 5
    latest.refresh(paused)
    assert len(made) == 1 and len(lister.requests) == 2, "answered in full: the same client"
    lister.answer(t0=11)  # t[1]: an error
    clock.now += 5
    latest.refresh(paused)
    assert len(made) == 2, "an error: a new client"
    for fut in lister.futures.values():
        fut.set_result(SimpleNamespace(offset=-1001))  # no leader it could reach
    clock.now += 5
    latest.refresh(paused)
    assert len(made) == 3, "an offset below zero: a new client"
    assert latest.high(("t", 0)) == 11, "and nothing taken from that answer"
    clock.now += 11  # no answer in time
    latest.refresh(paused)
    clock.now += 5
    latest.refresh(paused)
    assert len(made) == 4, "no answer in time: a new client"
