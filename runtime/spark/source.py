"""A Kafka source and sink for Spark's Python Data Source API (format ``ringmaster_kafka``).

Runs in: the Spark driver (planning: offsets, partitions) and Python workers (read, write).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import KafkaError as _CKError
from confluent_kafka import KafkaException, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from runtime.errors import RingmasterError
from runtime.kafka.messages import headers_of, offset_of
from runtime.kafka.producer import OutputProducer
from runtime.spark import offsets as ko

log = logging.getLogger("ringmaster.spark")
T = TypeVar("T")

NAME = "ringmaster_kafka"
# A question of the driver's client that failed is asked again on a new client, as Spark's own
# Kafka source does (fetchOffset.numRetries, fetchOffset.retryIntervalMs): KafkaStreamReader._ask.
ASK_ATTEMPTS = 3
ASK_AGAIN_AFTER_S = 1.0
INPUT_SCHEMA = ("topic string, partition int, offset long, key binary, value binary, "
                "headers array<struct<key:string,value:binary>>, timestamp_type int, timestamp long")
OUTPUT_SCHEMA = "topic string, key binary, value binary, headers array<struct<key:string,value:binary>>"


@dataclass
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int  # exclusive


def _options(raw: Any) -> dict[str, str]:
    """Spark hands options over case-insensitively (lower-cased keys): normalise once here."""
    return {str(k).lower(): v for k, v in dict(raw).items()}


def _props(options: dict[str, str]) -> dict[str, Any]:
    props: dict[str, Any] = json.loads(options.get("kafka", "{}"))
    props["bootstrap.servers"] = options["bootstrap"]
    props["group.id"] = options["group"]
    return props


def _ranges(start: ko.Offsets, end: ko.Offsets) -> list[KafkaRange]:
    return [KafkaRange(*r) for r in ko.ranges(start, end)]


def read_range(options: dict[str, str], r: InputPartition) -> Iterator[tuple[Any, ...]]:
    """Runs in: a Python worker. Every record with start <= offset < end, in order.

    Spark reads a plan of no partitions as one plain ``InputPartition(None)`` (an empty
    backfill, a batch with nothing new): that reads nothing (it was an AttributeError and
    300 lines of JVM traces, issue 17.10)."""
    if not isinstance(r, KafkaRange):
        return
    c = ko.client(_props(options))
    try:
        c.assign([TopicPartition(r.topic, r.partition, r.start)])
        next_offset, idle = r.start, 0
        while next_offset < r.end:
            msgs = c.consume(1000, 1.0)
            if not msgs:
                idle += 1
                if idle > 60:
                    raise RingmasterError(f"{r.topic}[{r.partition}]: no record between {next_offset} and "
                                          f"{r.end} after 60 s")
                continue
            idle = 0
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == _CKError._PARTITION_EOF and offset_of(m) >= r.end:
                        next_offset = r.end  # the rest of the range holds no records (markers)
                    elif err.code() != _CKError._PARTITION_EOF:
                        raise RingmasterError(f"{r.topic}[{r.partition}]: {err}")
                    continue
                off = offset_of(m)
                if off >= r.end:
                    next_offset = r.end
                    break
                next_offset = off + 1
                ts_type, ts = m.timestamp()
                yield (m.topic(), m.partition(), off, m.key(), m.value(),
                       [(k, v) for k, v in (headers_of(m) or [])], ts_type, ts)
    finally:
        c.close()


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of Kafka offset ranges with admission control.

    Group offsets are not committed here: Spark calls ``commit(end)`` for batch N only when it
    plans batch N+1, and never for the last batch of an availableNow run; the GroupCommitter
    listener commits after each batch instead.
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.topics = options["topics"].split(",")
        self.mode = options.get("endoffsets", "checked")
        self.max_rows = int(options.get("maxrecordspertrigger", "0"))
        self._target: ko.Offsets | None = None
        self._client: Any = None
        self._pauses: Any = None

    @property
    def _c(self) -> Any:
        """A driver-side client, created on first use and never pickled to workers."""
        if self._client is None:
            self._client = ko.client(_props(self.options))
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_pauses": None}

    def _ask(self, question: Callable[[Any], T]) -> T:
        """``question(client)``, asked again on a new client when the client fails to answer.
        RACE: a client's metadata keeps naming a partition's leader after it is gone. On a
        three-node cluster with one partition's leader killed, the driver's client timed out
        (30 s) and was then refused (NOT_LEADER_FOR_PARTITION) until the node came back, so a
        streaming query's next micro-batch could not be planned; a new client answered as soon
        as the partition had moved (runtime/kafka/admin.py, STALE_LEADERS)."""
        attempt = 1
        while True:
            try:
                return question(self._c)
            except KafkaException as exc:
                self._drop_client()
                if attempt >= ASK_ATTEMPTS:
                    raise
                log.warning("the Kafka cluster did not answer the source's question; asking again on a new "
                            "client", extra={"attempt": attempt, "error": str(exc.args[0])})
                attempt += 1
                time.sleep(ASK_AGAIN_AFTER_S)

    def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except (KafkaException, RuntimeError):  # closed already, or broken: it goes anyway
                log.debug("closing the driver's client failed", exc_info=True)

    def _hold_paused(self, begin: ko.Offsets, end: ko.Offsets) -> ko.Offsets:
        """Operator pauses (`ringmaster pause`) hold partitions where they are: a streaming
        query reads nothing of them until they are resumed (an availableNow run ends without
        them). Read from the group's control topic on the driver, as every supervisor does."""
        spec = self.options.get("control")
        if not spec:
            return end
        if self._pauses is None:
            from runtime.ops.control import OperatorPauses

            cfg = json.loads(spec)
            self._pauses = OperatorPauses(cfg["topic"], cfg["props"], cfg["load_timeout_s"])
            self._pauses.load()
        self._pauses.poll()
        held = {t: {p: (begin.get(t, {}).get(p, o) if self._pauses.pause_for((t, int(p))) else o)
                    for p, o in ps.items()}
                for t, ps in end.items()}
        return held

    def _latest(self, c: Any) -> ko.Offsets:
        # Partitions listed again for every micro-batch (one metadata request), so partitions
        # added to a topic while the query runs are read too.
        return ko.latest(c, ko.partitions_of(c, self.topics), self.mode)

    def initialOffset(self) -> dict[str, Any]:
        spec = self.options.get("startingoffsets", "committed")
        return self._ask(lambda c: ko.parse(spec, c, ko.partitions_of(c, self.topics), self.mode,
                                            what="startingOffsets"))

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows > 0 else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ask(self._latest)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        end = self._target or self._ask(self._latest)
        # Partitions new since `start` (added, or missing from a checkpoint) begin at their low
        # watermark, as in Spark's Kafka source, and their backlog counts against the limit.
        begin = self._ask(lambda c: ko.with_starts(c, start, end))
        end = ko.at_least(end, begin)  # a stale or lower end never moves a partition back
        end = self._hold_paused(begin, end)
        if isinstance(limit, ReadMaxRows):
            return ko.admit(begin, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._target

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRange]:
        # A partition new in this batch is not in `start` (the previous batch's end): it starts
        # at its low watermark, as latestOffset assumed (also when a restart replans the batch).
        return _ranges(self._ask(lambda c: ko.with_starts(c, start, end)), end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # see the class docstring

    def stop(self) -> None:
        if self._pauses is not None:
            self._pauses.close()
            self._pauses = None
        self._drop_client()


class KafkaBatchReader(DataSourceReader):
    """An offset range read once (backfill). `ranges` (set by `ringmaster spark backfill`) is the
    exact plan; otherwise startingOffsets .. endingOffsets are planned here."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        if "ranges" in options:
            self.planned = [KafkaRange(*r) for r in json.loads(options["ranges"])]
            return
        c = ko.client(_props(options))
        try:
            tps = ko.partitions_of(c, options["topics"].split(","))
            start, end = ko.plan(c, tps, options.get("endoffsets", "checked"),
                                 options.get("startingoffsets", "earliest"),
                                 options.get("endingoffsets", "latest"),
                                 what=("startingOffsets", "endingOffsets"))
        finally:
            c.close()
        self.planned = _ranges(start, end)

    def partitions(self) -> list[KafkaRange]:
        return self.planned

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return read_range(self.options, partition)


def write_rows(options: dict[str, str], rows: Iterator[Any]) -> int:
    """Runs in: a Python worker. Produce rows and wait for every acknowledgement; a failure
    fails the task, so Spark retries it (at-least-once)."""
    props = json.loads(options.get("kafka_producer", "{}"))
    props["bootstrap.servers"] = options["bootstrap"]
    producer = OutputProducer(props)
    n = 0
    for row in rows:
        producer.produce(row.topic, row.value, row.key, [(h.key, h.value) for h in row.headers or []])
        n += 1
    producer.deliver(120.0)  # raises on any failure: the task fails and Spark retries it
    return n


@dataclass
class Written(WriterCommitMessage):
    records: int


class KafkaBatchWriter(DataSourceWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        return Written(write_rows(self.options, iterator))


class KafkaStreamWriter(DataSourceStreamWriter):
    def __init__(self, options: dict[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> Written:
        return Written(write_rows(self.options, iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:
        pass  # every row was acknowledged by the broker in write()

    def abort(self, messages: list[Any], batchId: int) -> None:
        pass  # rows already produced stay; the batch is retried (at-least-once)


class KafkaSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return INPUT_SCHEMA

    def reader(self, schema: StructType) -> KafkaBatchReader:
        return KafkaBatchReader(_options(self.options))

    def streamReader(self, schema: StructType) -> KafkaStreamReader:
        return KafkaStreamReader(_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> KafkaBatchWriter:
        return KafkaBatchWriter(_options(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        return KafkaStreamWriter(_options(self.options))
