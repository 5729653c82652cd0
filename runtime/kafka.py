"""The only module that imports confluent_kafka.

Runs in: supervisor (GroupConsumer, the dead-letter Producer) and workers (Producer).
Rebalance callbacks run inside ``consume()`` on the supervisor's one thread.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka import KafkaError as _CKError
from confluent_kafka.admin import AdminClient, NewTopic

from runtime import speedups
from runtime.errors import KafkaError
from runtime.frames import Columns, Headers, batch_head, encode_columns

log = logging.getLogger(__name__)
TP = tuple[str, int]
# A run of consumed messages of one partition in offset order. Outside this module the
# messages are opaque: use offset_of, fields_of and pack_run.
Run = list[Message]
offset_of: Callable[[Message], int] = Message.offset  # type: ignore[assignment]


def _topic_partition_of(m: Message) -> tuple[str | None, int | None]:
    return m.topic(), m.partition()


class ConsumerState(enum.Enum):
    CREATED = "created"
    CONSUMING = "consuming"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(slots=True)
class Fetched:
    """What one consume() call returned, grouped by partition, in offset order."""

    runs: dict[TP, Run] = field(default_factory=dict)
    eof: dict[TP, int] = field(default_factory=dict)
    count: int = 0


def fields_of(m: Message) -> tuple[int, bytes | None, bytes | None, Headers | None]:
    """(offset, key, value, headers) of one message: for the rare record the supervisor
    handles itself (dead-lettering one that fits in no ring)."""
    return m.offset(), m.key(), m.value(), m.headers()


_ts_type, _ts_ms = itemgetter(0), itemgetter(1)


def columns_of(msgs: Run) -> Columns:
    """A run's records as frame columns. The canonical forms (no offsets when contiguous,
    no headers when none, one timestamp type when shared) are the C packer's too."""
    offsets: list[int] | None = list(map(Message.offset, msgs))
    first = offsets[0]  # type: ignore[index]
    # Offsets in a run strictly increase, so equal ends mean no gaps.
    if offsets[-1] - first + 1 == len(offsets):  # type: ignore[index]
        offsets = None
    headers: list[Headers | None] | None = list(map(Message.headers, msgs))
    if headers.count(None) == len(headers):  # type: ignore[union-attr]
        headers = None
    stamps = list(map(Message.timestamp, msgs))
    types = list(map(_ts_type, stamps))
    ts_types: int | list[int] = types[0] if types.count(types[0]) == len(types) else types
    return Columns(first, offsets, list(map(Message.key, msgs)), list(map(Message.value, msgs)),
                   headers, ts_types, list(map(_ts_ms, stamps)))


def _pack_run_py(head: tuple[Any, ...], msgs: Run, start: int, stop: int) -> bytes:
    return encode_columns(head, columns_of(msgs[start:stop]))


def _native_pack() -> Callable[..., bytes] | None:
    if speedups.native is None:
        return None
    try:
        speedups.native.bind(Message)
    except TypeError as exc:  # a confluent-kafka whose Message methods are not plain C methods
        log.warning("C frame packer unavailable", extra={"why": str(exc)})
        return None
    return speedups.native.pack_frame  # type: ignore[no-any-return]


PACK = speedups.HotPath("pack_frame", _native_pack(), _pack_run_py)


def pack_run(batch_id: int, slot: int, epoch: int, topic: str, partition: int, msgs: Run,
             start: int, stop: int) -> bytes:
    """Runs in: supervisor (hot path). msgs[start:stop] as one batch frame (runtime.frames):
    in C, about 0.2 µs per record; in Python, about 0.8 µs."""
    head = batch_head(batch_id, slot, epoch, topic, partition)
    return PACK.call(head, msgs, start, stop)  # type: ignore[no-any-return]


# Errors that librdkafka reports but recovers from by itself.
_TRANSIENT = {
    _CKError._TRANSPORT, _CKError._ALL_BROKERS_DOWN, _CKError._TIMED_OUT,
    _CKError._MSG_TIMED_OUT, _CKError._RESOLVE, _CKError.NOT_COORDINATOR,
    _CKError.COORDINATOR_NOT_AVAILABLE, _CKError.REBALANCE_IN_PROGRESS,
    _CKError.UNKNOWN_TOPIC_OR_PART, _CKError.LEADER_NOT_AVAILABLE,
    _CKError.NOT_LEADER_FOR_PARTITION, _CKError._NO_OFFSET,
}


class GroupConsumer:
    """A group member. Callbacks receive lists of (topic, partition) tuples."""

    def __init__(self, props: Mapping[str, Any]) -> None:
        props = dict(props)
        props["error_cb"] = self._on_error
        props["on_commit"] = self._on_commit
        self.fatal: str | None = None
        self._refused: dict[TP, int] = {}
        self._c = Consumer(props)
        self.state = ConsumerState.CREATED
        self.abandoned = False  # close() gave up waiting for librdkafka (see close())
        self._run_key: Callable[[Message], Any] = _topic_partition_of
        self.cooperative = "cooperative" in str(props.get("partition.assignment.strategy", ""))
        self._reset_to_end = str(props.get("auto.offset.reset", "earliest")) in ("latest", "end", "largest")

    def _check(self) -> None:
        if self.state in (ConsumerState.CLOSING, ConsumerState.CLOSED):
            raise KafkaError("the consumer is closed")

    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log.warning("kafka client error", extra={"error": str(err)})

    def _on_commit(self, err: _CKError | None, parts: list[TopicPartition]) -> None:
        """Runs in: consume()/commit(). Remember refused offsets so they are sent again:
        an asynchronous commit that fails (broker away, REBALANCE_IN_PROGRESS, ...) must
        not be forgotten, or the group lags behind what was done until the next record."""
        for p in parts:
            if err is not None or p.error is not None:
                self._refused[(p.topic, p.partition)] = p.offset
        if err is not None and err.code() != _CKError._NO_OFFSET:
            log.warning("commit refused; will retry", extra={"error": str(err), "partitions": len(parts)})

    def take_refused_commits(self) -> dict[TP, int]:
        refused, self._refused = self._refused, {}
        return refused

    def subscribe(self, topics: list[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None], on_lost: Callable[[list[TP]], None]) -> None:
        self._check()

        def assign_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            tps = [(p.topic, p.partition) for p in parts]
            # INVARIANT: assign before the runtime re-applies its pause state; a pause on a
            # partition that is not yet assigned is silently ignored by librdkafka.
            if self.cooperative:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)
            # While closing, librdkafka turns a late assignment into an unassignment: the
            # runtime has already let go of everything and must not take on new partitions.
            if self.state is ConsumerState.CONSUMING:
                on_assign(tps)

        def revoke_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            if self.state is ConsumerState.CONSUMING:
                on_revoke([(p.topic, p.partition) for p in parts])

        def lost_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            if self.state is ConsumerState.CONSUMING:
                on_lost([(p.topic, p.partition) for p in parts])

        # One topic: a run of one partition number is a run of one partition, and the
        # grouping key can be the C method itself (no Python call per record).
        single = len(topics) == 1 and not topics[0].startswith("^")
        self._run_key = Message.partition if single else _topic_partition_of
        self._c.subscribe(topics, on_assign=assign_cb, on_revoke=revoke_cb, on_lost=lost_cb)
        self.state = ConsumerState.CONSUMING

    def consume(self, max_records: int, timeout_s: float) -> Fetched:
        """Runs in: supervisor (hot path: per-record work here is the supervisor's cost).

        librdkafka hands out runs of one partition, so the messages are grouped by
        partition in C (groupby) and kept as they are: no per-record Python work happens
        here; pack_run turns them into frames later.

        Waits up to timeout_s for the first record only. librdkafka's batch consume returns
        when it has max_records or when the timeout expires, so one call asking for
        thousands waited out the whole timeout whenever fewer were queued: up to 20 ms on
        every record at moderate load. Take what is queued; if nothing is, wait for one
        record and take what arrived with it (a fetch response lands all at once)."""
        self._check()
        out = Fetched()
        by_tp = out.runs
        count = 0
        messages = self._c.consume(max_records, 0)
        if not messages and timeout_s > 0:
            messages = self._c.consume(1, timeout_s)
            if messages and max_records > 1:
                messages += self._c.consume(max_records - 1, 0)
        for _, run_iter in groupby(messages, self._run_key):
            run = list(run_iter)
            # Errors (mostly end-of-partition events) come at the edges of a run.
            if run[0].error() is not None or run[-1].error() is not None:
                good = []
                for m in run:
                    err = m.error()
                    if err is None:
                        good.append(m)
                    else:
                        self._handle_message_error(m, err, out)
                run = good
                if not run:
                    continue
            count += len(run)
            tp = (run[0].topic(), run[0].partition())
            if tp in by_tp:
                by_tp[tp].extend(run)
            else:
                by_tp[tp] = run
        out.count = count
        if self.fatal:
            raise KafkaError(f"fatal Kafka client error: {self.fatal}")
        return out

    def _handle_message_error(self, m: Message, err: _CKError, out: Fetched) -> None:
        if err.code() == _CKError._PARTITION_EOF:
            out.eof[(m.topic(), m.partition())] = m.offset()
        elif err.fatal():
            raise KafkaError(f"fatal Kafka client error: {err}")
        elif err.code() in _TRANSIENT:
            log.warning("transient consume error", extra={"error": str(err)})
        else:
            log.error("consume error", extra={"error": str(err)})

    def pause(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts:
            self._c.pause(parts)

    def resume(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts:
            self._c.resume(parts)

    def commit(self, offsets: Mapping[TP, int], asynchronous: bool) -> bool:
        """Commit next-offsets; False (logged) when the broker refused. Never raises for
        commit errors: an uncommitted offset is only a duplicate later, never a loss."""
        if not offsets or self.state is not ConsumerState.CONSUMING:
            return False
        parts = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        try:
            result = self._c.commit(offsets=parts, asynchronous=asynchronous)
        except KafkaException as exc:
            log.warning("commit failed", extra={"error": str(exc.args[0]), "partitions": len(parts)})
            return False
        if not asynchronous and result:
            failed = [p for p in result if p.error]
            if failed:
                log.warning("commit failed for some partitions",
                            extra={"error": str(failed[0].error), "partitions": len(failed)})
                return False
        return True

    def committed(self, tps: Iterable[TP], timeout_s: float = 10.0) -> dict[TP, int | None]:
        parts = self._c.committed([TopicPartition(t, p) for t, p in tps], timeout=timeout_s)
        return {(p.topic, p.partition): (None if p.offset == OFFSET_INVALID else p.offset)
                for p in parts}

    def seek_to_start(self, tps: Iterable[TP]) -> None:
        """Restart fetching of just-assigned partitions at their committed offset (or the
        reset position). A seek also discards whatever librdkafka had queued for them."""
        tps = list(tps)
        if not tps:
            return
        start = self.committed(tps)
        reset = OFFSET_END if self._reset_to_end else OFFSET_BEGINNING
        for tp, offset in start.items():
            try:
                self._c.seek(TopicPartition(tp[0], tp[1], reset if offset is None else offset))
            except KafkaException as exc:
                log.warning("seek failed", extra={"tp": f"{tp[0]}[{tp[1]}]", "error": str(exc.args[0])})

    def high_watermark(self, tp: TP) -> int | None:
        """The high watermark cached from fetch responses (never a ListOffsets look-up)."""
        try:
            _, high = self._c.get_watermark_offsets(TopicPartition(*tp), cached=True)
        except KafkaException:
            return None
        return high if high >= 0 else None

    def close(self, timeout_s: float = 30.0) -> bool:
        """Leave the group within timeout_s; False if librdkafka did not finish by then.

        The runtime releases (fences, commits) its partitions before it closes, so the
        rebalance callbacks that close() runs are not passed on. librdkafka's close has no
        timeout and can hang when an assignment arrives while it closes (librdkafka#4527,
        seen again with 2.16 on a rebalancing group): it runs on a helper thread so that a
        daemon told to stop does stop. If abandoned, the broker drops the member after
        session.timeout.ms; nothing is lost, the offsets were committed before. The caller
        must then end the process with os._exit (the client is still in use)."""
        if self.state in (ConsumerState.CLOSING, ConsumerState.CLOSED):
            return not self.abandoned
        self.state = ConsumerState.CLOSING
        failure: list[BaseException] = []

        def leave() -> None:
            try:
                self._c.close()
            except BaseException as exc:  # reported by the caller's thread
                failure.append(exc)

        closer = threading.Thread(target=leave, name="kafka-close", daemon=True)
        closer.start()
        closer.join(timeout_s)
        if closer.is_alive():
            self.abandoned = True
            log.error("leaving the consumer group did not finish in time; exiting without it "
                      "(the broker drops this member after session.timeout.ms)",
                      extra={"timeout_s": timeout_s})
            return False
        self.state = ConsumerState.CLOSED
        if failure:
            raise KafkaError(f"closing the consumer failed: {failure[0]}") from failure[0]
        return True


class DeliveryFailed(KafkaError):
    pass


class OutputProducer:
    """Produce and wait for delivery. Runs in: a worker (outputs, dead letters) or the
    supervisor (dead letters of records that crash workers)."""

    def __init__(self, props: Mapping[str, Any]) -> None:
        props = dict(props)
        props["error_cb"] = self._on_error
        self._p = Producer(props)
        self._failures: list[str] = []
        self.fatal: str | None = None

    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log.warning("kafka producer error", extra={"error": str(err)})

    def _on_delivery(self, err: _CKError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append(f"{msg.topic()}: {err}")

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None) -> None:
        while True:
            try:
                self._p.produce(topic, value, key, headers=headers, on_delivery=self._on_delivery)
                return
            except BufferError:
                self._p.poll(0.05)  # local queue full: let deliveries drain, then retry

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every produced message is acknowledged; raise DeliveryFailed if any
        was refused or the wait timed out (the caller must not acknowledge its batch)."""
        remaining = self._p.flush(timeout_s)
        failures, self._failures = self._failures, []
        if remaining:
            failures.append(f"{remaining} message(s) still undelivered after {timeout_s:.0f} s")
        if failures or self.fatal:
            raise DeliveryFailed(f"delivery failed: {(failures or [self.fatal])[0]}"
                                 f" ({len(failures)} failure(s))")


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int = 1,
                  extra: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> None:
    """Create topics that do not exist (used by the demo, tests and bench)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(extra or {})})
    futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1)
                                   for t in topics], operation_timeout=timeout_s)
    for topic, fut in futures.items():
        try:
            fut.result(timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() != _CKError.TOPIC_ALREADY_EXISTS:
                raise KafkaError(f"cannot create topic {topic!r}: {exc.args[0]}") from None
