"""Assign-only reading, without group membership and without commits: a whole topic from its
beginning to its end, then following it (the control topic, ``ringmaster tail``); the bounds
of a topic's partitions; one record at given coordinates. Runs in: the supervisor and the CLI
(the control topic, ``tail``), the Spark driver, ``ringmaster redrive`` (bounds of the
dead-letter topic, re-reading the source of a truncated or reference dead letter).

"The end" comes from end-of-partition events and the high watermark that librdkafka caches
from fetch responses, never from a ListOffsets answer (stale on some brokers).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _CKError

from runtime.errors import KafkaError, KafkaUnreachable
from runtime.kafka.client_log import UNREACHABLE, with_logger
from runtime.kafka.messages import headers_of, offset_of, partition_of

Apply = Callable[[bytes | None, bytes | None, int], None]  # key, value, offset


class TopicReader:
    def __init__(self, topic: str, props: Mapping[str, Any]) -> None:
        self.topic = topic
        self._props = with_logger({**props, "enable.partition.eof": True})
        self._consumer: Consumer | None = None

    def read_to_end(self, apply: Apply, timeout_s: float, what: str) -> int:
        """Read every record from the beginning, calling ``apply(key, value, offset)``, until
        every partition reported its end; returns the records read. Raises KafkaUnreachable
        when the cluster does not answer, KafkaError (naming ``what``) when reading takes
        longer than timeout_s."""
        try:
            self._consumer = c = Consumer(self._props)
            deadline = time.monotonic() + timeout_s
            parts = _partitions_once_known(c, self.topic, deadline, what)
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            at_end: set[int] = set()
            count = 0
            while len(at_end) < len(parts):
                if time.monotonic() > deadline:
                    raise KafkaError(f"could not read the {what} {self.topic!r} to its end within "
                                     f"{timeout_s:g} s")
                for m in c.consume(1000, 0.2):
                    err = m.error()
                    if err is None:
                        apply(m.key(), m.value(), offset_of(m))
                        count += 1
                        at_end.discard(partition_of(m))
                    elif err.code() == _CKError._PARTITION_EOF:
                        at_end.add(partition_of(m))
                    elif err.fatal():
                        raise KafkaError(f"{what} {self.topic!r}: {err}")
            return count
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, _CKError) and err.code() in UNREACHABLE:
                raise KafkaUnreachable(f"cannot read the {what} {self.topic!r}: the Kafka cluster at "
                                       f"{self._props.get('bootstrap.servers', '?')} did not answer within "
                                       f"{timeout_s:g} s ({err.str()})") from None
            raise KafkaError(f"{what} {self.topic!r}: {err}") from None

    def poll(self, apply: Apply, max_records: int = 100) -> int:
        """Apply what arrived since the last call, without waiting. Errors are the caller's
        to log: they come back as KafkaError."""
        if self._consumer is None:
            return 0
        n = 0
        try:
            for m in self._consumer.consume(max_records, 0):
                if m.error() is None:
                    apply(m.key(), m.value(), offset_of(m))
                    n += 1
        except KafkaException as exc:
            raise KafkaError(str(exc.args[0])) from None
        return n

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


# What a broker answers for a topic created a moment ago, before its metadata reached the
# broker asked (Apache Kafka: the controller has it, the broker's metadata cache not yet).
_NOT_YET = frozenset({_CKError.UNKNOWN_TOPIC_OR_PART, _CKError.LEADER_NOT_AVAILABLE, _CKError._UNKNOWN_TOPIC})


def _partitions_once_known(c: Consumer, topic: str, deadline: float, what: str) -> list[int]:
    """The partitions of a topic the caller has just made sure exists, asked for again while
    the broker does not know it yet, until ``deadline``."""
    while True:
        meta = c.list_topics(topic, timeout=max(0.1, deadline - time.monotonic())).topics[topic]
        parts = sorted(meta.partitions)
        if meta.error is None and parts:
            return parts
        if (meta.error is not None and meta.error.code() not in _NOT_YET) or time.monotonic() > deadline:
            raise KafkaError(f"{what} {topic!r}: {meta.error or 'no partitions'}")
        time.sleep(0.1)


def partition_bounds(topic: str, props: Mapping[str, Any], timeout_s: float) -> dict[int, tuple[int, int]]:
    """(first offset, end offset) of every partition of ``topic`` as the broker answers a fetch
    now: the first record's offset (or the end, when empty) and the high watermark, the offset
    after the last record a consumer may read. Reads at most one small fetch per partition.
    Raises KafkaError when the topic is unknown or a partition does not answer in time."""
    c = Consumer({**props, "enable.partition.eof": True, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "fetch.message.max.bytes": 1, "fetch.wait.max.ms": 10})
    try:
        meta = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            why = "no partitions" if meta is None or meta.error is None else meta.error
            raise KafkaError(f"topic {topic!r}: {why}")
        parts = sorted(meta.partitions)
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        first: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(first) < len(parts):
            if time.monotonic() > deadline:
                missing = sorted(set(parts) - set(first))
                raise KafkaError(f"topic {topic!r}: partitions {missing} did not answer a fetch within "
                                 f"{timeout_s:g} s")
            for m in c.consume(100, 0.1):
                err = m.error()
                if err is None or err.code() == _CKError._PARTITION_EOF:
                    first.setdefault(partition_of(m), offset_of(m))
                elif err.fatal():
                    raise KafkaError(f"topic {topic!r}: {err}")
        bounds = {}
        for p in parts:
            _, high = c.get_watermark_offsets(TopicPartition(topic, p), cached=True)
            end = high if high >= 0 else first[p]  # unknown: take nothing of it rather than guess
            bounds[p] = (min(first[p], end), end)
        return bounds
    except KafkaException as exc:
        raise KafkaError(f"topic {topic!r}: {exc.args[0]}") from None
    finally:
        c.close()


@dataclass(frozen=True, slots=True)
class Stored:
    """One record as a topic holds it."""

    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None
    timestamp: tuple[int, int]


class RecordFetcher:
    """Reads single records by their coordinates (a source record of a dead letter that does not
    hold it whole). One consumer, assigned anew for each look-up; close() when done."""

    # Errors that say the record is not there and will not be: deleted by retention
    # (OFFSET_OUT_OF_RANGE, turned into _AUTO_OFFSET_RESET by auto.offset.reset=error), or the
    # topic or partition is gone.
    _GONE = frozenset({_CKError._AUTO_OFFSET_RESET, _CKError.OFFSET_OUT_OF_RANGE,
                       _CKError.UNKNOWN_TOPIC_OR_PART, _CKError._UNKNOWN_PARTITION,
                       _CKError._UNKNOWN_TOPIC})

    def __init__(self, props: Mapping[str, Any]) -> None:
        self._props = {**props, "enable.partition.eof": True, "enable.auto.commit": False,
                       "auto.offset.reset": "error", "fetch.wait.max.ms": 10}
        self._consumer: Consumer | None = None

    def fetch(self, topic: str, partition: int, offset: int, timeout_s: float) -> Stored | None:
        """The record at ``offset``, or None when the topic no longer holds it (deleted,
        compacted away, or beyond its end). Raises KafkaError when the broker gives no answer
        within timeout_s (an outage: the caller must not take that for "gone")."""
        try:
            if self._consumer is None:
                self._consumer = Consumer(self._props)
            c = self._consumer
            tp = TopicPartition(topic, partition, offset)
            c.assign([tp])
            deadline = time.monotonic() + timeout_s
            try:
                while time.monotonic() < deadline:
                    for m in c.consume(1, 0.1):
                        err = m.error()
                        if err is None:
                            at = offset_of(m)
                            if at == offset:
                                return Stored(m.key(), m.value(), headers_of(m), m.timestamp())
                            if at > offset:
                                return None  # compacted or deleted: the log goes on after it
                        elif err.code() == _CKError._PARTITION_EOF or err.code() in self._GONE:
                            return None
                        elif err.fatal():
                            raise KafkaError(f"reading {topic}[{partition}]@{offset}: {err}")
                    # Some brokers answer a fetch outside the log with nothing at all instead of
                    # OFFSET_OUT_OF_RANGE: the watermarks of that answer tell.
                    low, high = c.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
                    if (high >= 0 and offset >= high) or (low >= 0 and offset < low):
                        return None
            finally:
                c.unassign()
        except KafkaException as exc:
            err = exc.args[0]
            if isinstance(err, _CKError) and err.code() in self._GONE:
                return None
            raise KafkaError(f"reading {topic}[{partition}]@{offset}: {err}") from None
        raise KafkaError(f"reading {topic}[{partition}]@{offset}: no answer within {timeout_s:g} s")

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


@dataclass(frozen=True)
class Item:
    """One record as ``ringmaster tail`` shows it."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]
    timestamp: tuple[int, int] | None = None  # (type, ms) as the client gives it; type 0: none


# librdkafka's logical offset "n records before the end" is RD_KAFKA_OFFSET_TAIL_BASE - n
# (confluent-kafka does not export it). It is resolved with ListOffsets, which some brokers
# answer stale (low): ``last`` then starts earlier and reads more, never fewer.
_OFFSET_TAIL_BASE = -2000


def tail(topic: str, props: Mapping[str, Any], stop: Callable[[], bool],
         poll_s: float = 0.2, last: int | None = None, follow: bool = True) -> Iterator[Item]:
    """The records of ``topic``, until ``stop()`` says so (checked between polls).
    Assign-only: no group is joined, nothing committed. Waits for the topic to exist (it may
    be created by the first output). Runs in: the CLI.

    ``last`` None: every record from the beginning, then whatever arrives. ``last`` N: the
    last N records of each partition as of now, partition by partition in offset order (Kafka
    orders records within a partition only, so this order is the same on every run), then,
    with ``follow``, whatever arrives. "Now" is each partition's end as its first fetch
    answers it."""
    consumer = Consumer(with_logger({**props, "enable.partition.eof": last is not None}))
    try:
        parts: list[int] = []
        while not parts and not stop():
            # list_topics() for every topic: some brokers create the topic a look-up names.
            meta = consumer.list_topics(timeout=10).topics.get(topic)
            parts = sorted(meta.partitions) if meta is not None and meta.error is None else []
            if not parts:
                time.sleep(poll_s)
        start = OFFSET_BEGINNING if last is None else _OFFSET_TAIL_BASE - last
        consumer.assign([TopicPartition(topic, p, start) for p in parts])
        if last is not None:
            kept: dict[int, deque[Item]] = {p: deque(maxlen=last) for p in parts}
            later: list[Item] = []  # arrived in a partition after its end: after the last N
            at_end: set[int] = set()
            while len(at_end) < len(parts) and not stop():
                for m in consumer.consume(500, poll_s):
                    err = m.error()
                    if err is None:
                        item = Item(partition_of(m), offset_of(m), m.key(), m.value(),
                                    list(headers_of(m) or []), m.timestamp())
                        (later.append if item.partition in at_end else kept[item.partition].append)(item)
                    elif err.code() == _CKError._PARTITION_EOF:
                        at_end.add(partition_of(m))
                    elif err.fatal():
                        raise KafkaError(f"reading {topic!r}: {err}")
            for p in parts:
                yield from kept[p]
            if not follow:
                return
            yield from later
        while not stop():
            for m in consumer.consume(500, poll_s):
                err = m.error()
                if err is not None:
                    if err.fatal():
                        raise KafkaError(f"reading {topic!r}: {err}")
                    continue
                yield Item(partition_of(m), offset_of(m), m.key(), m.value(), list(headers_of(m) or []),
                           m.timestamp())
                if stop():
                    return
    except KafkaException as exc:
        raise KafkaError(f"reading {topic!r}: {exc.args[0]}") from None
    finally:
        consumer.close()
