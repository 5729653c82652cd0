"""The ends a batch run (``--until-caught-up``) judges the group's partitions by are the real
ends on the real broker, whatever its ListOffsets answers (runtime/kafka/group_offsets.py,
read_ends.py): Tansu answers "latest" with the last batch's base offset + 1, and a run that
lost a partition before its first fetch judged it by that answer and exited 0 with most of
it uncommitted (docs/brokers.md)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from helpers import lists_latest_exactly, make_topics, unique, wait_for

from runtime.kafka.group_offsets import GroupOffsets
from runtime.kafka.read_ends import ReadEnds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def produce_in_batches(bootstrap: str, topic: str, partitions: int, batches: int, per_batch: int) -> None:
    """``batches`` batches of ``per_batch`` records to each partition (one flush a batch)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100, "batch.num.messages": per_batch})
    for b in range(batches):
        for part in range(partitions):
            for i in range(per_batch):
                p.produce(topic, f"b{b}-{i}".encode(), partition=part)
        assert p.flush(30) == 0


def test_the_group_standing_takes_each_partition_to_its_true_end(broker: Any) -> None:
    topic, group = unique("ends"), unique("ends-group")
    make_topics(broker.bootstrap, 2, topic)
    produce_in_batches(broker.bootstrap, topic, 2, batches=3, per_batch=100)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    listed = {tp.partition: f.result(30).offset for tp, f in admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in range(2)}).items()}
    if lists_latest_exactly(broker.bootstrap):
        assert listed == {0: 300, 1: 300}
    else:  # the pinned Tansu: the last batch's base + 1, what a judge by the answer took for the end
        assert all(at < 300 for at in listed.values()), listed

    # A commit at the start, so that there is a committed offset to read (the group's offsets are
    # read through a consumer's committed(), which asks again while a coordinator just started
    # answers NOT_COORDINATOR: runtime/kafka/group_committed.py).
    member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        member.commit(offsets=[TopicPartition(topic, p, 0) for p in range(2)], asynchronous=False)
    finally:
        member.close()
    offsets = GroupOffsets({"bootstrap.servers": broker.bootstrap, "group.id": group}, [topic],
                           interval_s=0.2)

    def complete() -> Any:
        offsets.refresh(True)
        standing = offsets.standing()
        return standing if standing.complete else None

    try:
        standing = wait_for(complete, 30, "the group's standing, every partition with its end")
    finally:
        offsets.abandon()
    assert dict(standing.ends) == {(topic, 0): 300, (topic, 1): 300}
    assert standing.left(set()) == {(topic, 0): 0, (topic, 1): 0}, "committed at the start: all left"


def test_an_idle_partition_and_an_empty_one_get_their_ends_at_once(broker: Any) -> None:
    """Where the answer is exact the reader starts at the end and reads nothing: an idle
    partition's end comes from an empty fetch, and an empty partition's end is its start."""
    topic = unique("ends-idle")
    make_topics(broker.bootstrap, 2, topic)
    produce_in_batches(broker.bootstrap, topic, 1, batches=1, per_batch=5)  # partition 1 stays empty
    reader = ReadEnds({"bootstrap.servers": broker.bootstrap, "group.id": unique("ends-reader")})
    assert reader.find({(topic, 0): 5, (topic, 1): 0}) == {(topic, 0): 5, (topic, 1): 0}


def test_a_partition_written_to_all_the_time_still_gets_an_end(broker: Any) -> None:
    """A partition written to faster than a fetch's wait is never at its end: it ends where
    its first fetch said the end was, once the reader passed it, so a batch run over a topic
    written to all the time still ends (what it judges by is taken once)."""
    topic = unique("ends-busy")
    make_topics(broker.bootstrap, 1, topic)
    produce_in_batches(broker.bootstrap, topic, 1, batches=1, per_batch=50)
    stop = threading.Event()
    written = [50]

    def write() -> None:
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        while not stop.is_set():
            p.produce(topic, b"more", partition=0)
            p.flush(5)
            written[0] += 1
            stop.wait(0.005)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_for(lambda: written[0] >= 100, 30, "the writer under way")
        reader = ReadEnds({"bootstrap.servers": broker.bootstrap, "group.id": unique("ends-reader")})
        before = written[0]
        started = time.monotonic()
        ends = reader.find({(topic, 0): 0})
        took = time.monotonic() - started
        after = written[0]
    finally:
        stop.set()
        writer.join(10)
    assert (topic, 0) in ends, "an end, not given up on"
    assert before <= ends[(topic, 0)] <= after + 1, (before, ends, after)
    assert took < reader.timeout_s, "passed the first fetch's end, not read until the bound"
