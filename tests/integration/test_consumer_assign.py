"""A look at a group's partitions without joining it (``GroupConsumer.assign``, what
``ringmaster redrive --dry-run`` reads with) starts at the group's committed offsets on the
real broker, also while the broker's group coordinator is still loading."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import group_settings, make_topics, new_broker, produce, unique

from runtime.kafka.consumer import GroupConsumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

# What the runtime owns in every group consumer (runtime/kafka/properties.py): a look commits nothing.
OWNED = {"enable.auto.commit": False, "enable.auto.offset.store": False}


def read(consumer: GroupConsumer, want: int, deadline_s: float = 20.0) -> dict[int, list[int]]:
    """The offsets consume() returned per partition, until ``want`` records or the deadline."""
    got: dict[int, list[int]] = {}
    start = time.monotonic()
    while sum(map(len, got.values())) < want and time.monotonic() - start < deadline_s:
        for (_, partition), run in consumer.consume(100, 0.2).runs.items():
            got.setdefault(partition, []).extend(m.offset() for m in run)
    return got


def test_a_look_without_joining_reads_from_the_committed_offsets_even_from_a_broker_just_started(
        tmp_path: Path) -> None:
    """The first group a fresh Apache Kafka broker sees finds its coordinator loading: the
    offset fetch librdkafka makes for a partition assigned at OFFSET_STORED was refused as a
    whole (NOT_COORDINATOR), and librdkafka never asked again nor fetched the partition
    (librdkafka#5586): 0 of 10 records in 20 s, every time. ``assign()`` reads the committed
    offsets itself, asking again until the coordinator answers."""
    topic, group = unique("look"), unique("look-group")
    with new_broker(log_path=tmp_path / "broker.log") as fresh:
        bs = fresh.bootstrap
        make_topics(bs, 2, topic)
        produce(bs, topic, [f"v{n}" for n in range(10)], 2)
        look = GroupConsumer({"bootstrap.servers": bs, "group.id": group, **OWNED})
        try:
            look.assign([(topic, 0), (topic, 1)])
            assert read(look, 10) == {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3, 4]}
        finally:
            look.close(5)
        # Where the group has committed, the look starts there; where not, at the reset position.
        member = Consumer({"bootstrap.servers": bs, "group.id": group, "enable.auto.commit": False})
        try:
            member.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        finally:
            member.close()
        again = GroupConsumer({"bootstrap.servers": bs, "group.id": group, **OWNED})
        try:
            again.assign([(topic, 0), (topic, 1)])
            assert read(again, 7) == {0: [3, 4], 1: [0, 1, 2, 3, 4]}
        finally:
            again.close(5)


def test_a_member_that_reads_its_start_itself_fetches_from_a_broker_just_started(tmp_path: Path) -> None:
    """The same for a member of the group (``subscribe(read_start_s=...)``, the redrive's): the
    first group of a fresh Apache Kafka broker, left to librdkafka, read 0 of 10 records in 25
    s. (The supervisor seeks its partitions after each assignment instead, which starts them
    too: docs/design.md.)"""
    topic, group = unique("member"), unique("member-group")
    with new_broker(log_path=tmp_path / "broker.log") as fresh:
        bs = fresh.bootstrap
        make_topics(bs, 2, topic)
        produce(bs, topic, [f"v{n}" for n in range(10)], 2)
        member = GroupConsumer({"bootstrap.servers": bs, "group.id": group, **OWNED, **group_settings()})
        assigned: list[tuple[str, int]] = []
        try:
            member.subscribe([topic], assigned.extend, lambda tps: None, lambda tps: None, read_start_s=15)
            assert read(member, 10, deadline_s=30) == {0: [0, 1, 2, 3, 4], 1: [0, 1, 2, 3, 4]}
            assert sorted(assigned) == [(topic, 0), (topic, 1)]
        finally:
            member.close(5)
