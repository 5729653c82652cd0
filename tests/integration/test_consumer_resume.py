"""A resumed partition fetches again at once, against the real broker (runtime/kafka/positions.py,
``Positions._wake_fetcher``). The flow control pauses every partition when the backlog
fills the rings and resumes them when it has drained halfway, counting on the records coming
back within a fetch's round trip. librdkafka's own resume left a broker thread with no
partition to fetch asleep for up to a second: the rings ran dry and the workers waited."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import group_settings, make_topics, produce

from runtime.kafka.consumer import GroupConsumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# Far above a fetch's round trip here (milliseconds), far below librdkafka's idle second.
# Without the wake the wait is what is left of that second: the tries idle 0.2 to 0.98 s, so
# the first ones wait 550-800 ms (measured, on both brokers: 20-800 ms without the wake,
# 3-17 ms with it).
_PROMPT_S = 0.5


class Reader:
    """consume() until records come, checking that each partition's records follow on from
    the last ones read: a resume must fetch from where the pause left it, no gap, no repeat."""

    def __init__(self, consumer: GroupConsumer) -> None:
        self.consumer = consumer
        self.last: dict[tuple[str, int], int] = {}

    def first_records_after(self, deadline_s: float) -> float:
        """Seconds until consume() returns a record, at most deadline_s."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            fetched = self.consumer.consume(100, 0.01)
            for tp, run in fetched.runs.items():
                if tp in self.last:
                    first = run[0].offset()
                    assert first == self.last[tp] + 1, f"{tp}: {self.last[tp]} then {first}"
                self.last[tp] = run[-1].offset()
            if fetched.count:
                break
        return time.monotonic() - start


def consumer(broker: Any, names: dict[str, str]) -> GroupConsumer:
    topic = names["in"]
    make_topics(broker.bootstrap, 2, topic)
    produce(broker.bootstrap, topic, [f"r{i}" for i in range(20_000)], 2)
    return GroupConsumer({"bootstrap.servers": broker.bootstrap, "group.id": names["group"],
                          "auto.offset.reset": "earliest", "enable.auto.commit": False,
                          **group_settings(),
                          # The daemon's own fetch settings (runtime/kafka/properties.py), and a
                          # small local queue, so that the topic is never all fetched.
                          "fetch.wait.max.ms": 100, "fetch.queue.backoff.ms": 10,
                          "queued.max.messages.kbytes": 64})


def reading(c: GroupConsumer, topic: str) -> tuple[Reader, list[tuple[str, int]]]:
    """Subscribed, and records read: the reader and the two partitions assigned."""
    assigned: list[tuple[str, int]] = []
    c.subscribe([topic], assigned.extend, lambda _tps: None, lambda _tps: None)
    reader = Reader(c)
    assert reader.first_records_after(60.0) < 60.0, "the consumer never read the topic"
    assert len(assigned) == 2
    return reader, sorted(assigned)


def assert_prompt_after_each_resume(c: GroupConsumer, reader: Reader, tps: list[tuple[str, int]],
                                   while_paused: Callable[[], None]) -> None:
    """Seven tries: pause every partition, ``while_paused()``, wait, resume, time the first
    record. Every partition paused, the fetch in flight returns (fetch.wait.max.ms) and the
    broker thread goes idle: different idle times meet its wake-up at different phases."""
    waits = []
    for trial in range(7):
        c.pause(tps)
        while_paused()
        time.sleep(0.2 + 0.13 * trial)
        c.resume(tps)
        waits.append(reader.first_records_after(5.0))
    assert max(waits) < _PROMPT_S, f"records came {[round(w * 1000) for w in waits]} ms after resume()"


def test_records_come_promptly_after_every_partition_was_paused_and_resumed(
        broker: Any, names: dict[str, str]) -> None:
    c = consumer(broker, names)
    try:
        reader, tps = reading(c, names["in"])
        assert_prompt_after_each_resume(c, reader, tps, lambda: None)
    finally:
        c.close(10)


def test_records_come_promptly_after_partitions_rewound_while_paused_are_resumed(
        broker: Any, names: dict[str, str]) -> None:
    """The supervisor rewinds a partition while it is paused (a seek back to its lowest
    unhandled offset) and resumes it once its batches are back. Until consume() returns one
    of its records the partition has no position, so the wake seeks it where it was sought:
    without that its records came 30-810 ms after the resume on both brokers, like any resume
    before the wake (measured here), and from the offset it was rewound to either way."""
    c = consumer(broker, names)

    def rewind() -> None:
        for tp in tps:
            back = max(0, reader.last.get(tp, 0) - 50)
            assert c.seek(tp, back)
            reader.last[tp] = back - 1  # the next record read must be the one rewound to

    try:
        reader, tps = reading(c, names["in"])
        assert_prompt_after_each_resume(c, reader, tps, rewind)
    finally:
        c.close(10)
