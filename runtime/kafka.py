"""The only module that imports confluent_kafka.

Runs in: supervisor (GroupConsumer, the dead-letter Producer) and workers (Producer).
Rebalance callbacks run inside ``consume()`` on the supervisor's one thread.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from operator import itemgetter
from typing import Any
from zlib import crc32

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
from runtime.errors import ConfigError, DeliveryFailed, KafkaError, OutputRejected
from runtime.frames import Columns, Headers, batch_head, encode_columns

log = logging.getLogger(__name__)
TP = tuple[str, int]
# A run of consumed messages of one partition in offset order. Outside this module the
# messages are opaque: use offset_of, fields_of and pack_run.
Run = list[Message]
offset_of: Callable[[Message], int] = Message.offset  # type: ignore[assignment]


def split_by_key(msgs: Run, lanes: int, null_lane: int) -> dict[int, Run]:
    """Key ordering: a run's messages by lane, each lane in offset order. A key's lane is a
    stable hash of its bytes (CRC-32: the same on every host and after every restart);
    records without a key stay together on null_lane, in partition order."""
    out: dict[int, Run] = {}
    for m, k in zip(msgs, map(Message.key, msgs), strict=True):
        lane = null_lane if k is None else crc32(k) % lanes
        bucket = out.get(lane)
        if bucket is None:
            out[lane] = [m]
        else:
            bucket.append(m)
    return out


def keys_of(msgs: Run) -> list[bytes | None]:
    return list(map(Message.key, msgs))


def _topic_partition_of(m: Message) -> tuple[str | None, int | None]:
    return m.topic(), m.partition()


def librdkafka_summary(stats: dict[str, Any]) -> dict[str, float]:
    """The few numbers of librdkafka's statistics JSON worth a metric: its queues and the
    brokers' round trips (https://github.com/confluentinc/librdkafka/blob/master/STATISTICS.md)."""
    out: dict[str, float] = {
        "replyq": float(stats.get("replyq", 0)),
        "msg_cnt": float(stats.get("msg_cnt", 0)),
        "rx_messages_total": float(stats.get("rxmsgs", 0)),
        "rx_bytes_total": float(stats.get("rxmsg_bytes", 0)),
    }
    fetchq = 0
    for topic in stats.get("topics", {}).values():
        for part in topic.get("partitions", {}).values():
            fetchq += int(part.get("fetchq_cnt", 0) or 0)
    out["fetch_queue_messages"] = float(fetchq)
    rtts = [b.get("rtt", {}).get("avg", 0) for b in stats.get("brokers", {}).values()
            if b.get("state") == "UP" and b.get("rtt", {}).get("cnt", 0)]
    if rtts:
        out["broker_rtt_avg_seconds"] = max(rtts) / 1e6
    return out


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
        if props.get("statistics.interval.ms"):
            props["stats_cb"] = self._on_stats
        self.stats_summary: dict[str, float] = {}  # the last statistics.interval.ms report, summed up
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

    def _on_stats(self, text: str) -> None:
        """Runs in: consume(), every statistics.interval.ms."""
        try:
            self.stats_summary = librdkafka_summary(json.loads(text))
        except (ValueError, TypeError, AttributeError):
            log.debug("unreadable librdkafka statistics")

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
        try:
            messages = self._c.consume(max_records, 0)
            if not messages and timeout_s > 0:
                messages = self._c.consume(1, timeout_s)
                if messages and max_records > 1:
                    messages += self._c.consume(max_records - 1, 0)
        except KafkaException as exc:
            self._raise_or_log(exc, "consume")
            messages = []
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

    def _raise_or_log(self, exc: KafkaException, what: str) -> None:
        """Every librdkafka error that reaches the loop is handled here: a fatal one becomes
        a KafkaError (exit 5, one line), anything else is logged and the loop goes on."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], _CKError) else None
        if err is not None and err.fatal():
            raise KafkaError(f"fatal Kafka client error during {what}: {err}") from None
        log.warning("kafka client call failed; carrying on", extra={"call": what, "error": str(exc)})

    def pause(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts:
            try:
                self._c.pause(parts)
            except KafkaException as exc:  # e.g. a partition no longer assigned: nothing to pause
                self._raise_or_log(exc, "pause")

    def resume(self, tps: Iterable[TP]) -> None:
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts:
            try:
                self._c.resume(parts)
            except KafkaException as exc:
                self._raise_or_log(exc, "resume")

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

    def committed(self, tps: Iterable[TP], timeout_s: float = 5.0) -> dict[TP, int | None]:
        """The group's committed offsets; raises KafkaError when the broker does not answer
        within timeout_s (bounded: this runs on the supervisor's loop)."""
        try:
            parts = self._c.committed([TopicPartition(t, p) for t, p in tps], timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaError(f"reading committed offsets failed: {exc.args[0]}") from None
        return {(p.topic, p.partition): (None if p.offset == OFFSET_INVALID or p.offset < 0 else p.offset)
                for p in parts}

    def seek_to_start(self, tps: Iterable[TP]) -> list[TP]:
        """Restart fetching of just-assigned partitions at their committed offset (or the
        reset position). A seek also discards whatever librdkafka had queued for them.
        Returns the partitions that could not be sought now (the broker did not answer in
        time): the caller keeps them paused and tries again."""
        tps = list(tps)
        if not tps:
            return []
        try:
            start = self.committed(tps)
        except KafkaError as exc:
            log.warning("cannot read committed offsets yet; will retry", extra={"error": str(exc)})
            return tps
        reset = OFFSET_END if self._reset_to_end else OFFSET_BEGINNING
        failed = []
        for tp, offset in start.items():
            if not self.seek(tp, reset if offset is None else offset):
                failed.append(tp)
        return failed

    def seek(self, tp: TP, offset: int) -> bool:
        """Fetch tp from offset next; what librdkafka had queued for it is discarded (its op
        version moves on). False (logged) if librdkafka refused."""
        try:
            self._c.seek(TopicPartition(tp[0], tp[1], offset))
            return True
        except KafkaException as exc:
            log.warning("seek failed", extra={"tp": f"{tp[0]}[{tp[1]}]", "offset": offset,
                                              "error": str(exc.args[0])})
            return False

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


# Delivery errors that are about the message itself: retrying cannot help, and it is the
# record whose output (or dead letter) this is that must be isolated. Every other delivery
# error (broker away, leader moving, topic missing, not authorised, timed out) is an outage:
# the batch waits and is tried again, and no record is blamed for it.
RECORD_ERRORS = frozenset({
    _CKError.MSG_SIZE_TOO_LARGE, _CKError.RECORD_LIST_TOO_LARGE, _CKError.INVALID_RECORD,
    _CKError.INVALID_TIMESTAMP,
})


# Errors that mean the producer's own idempotence state is lost or fenced: it will fail every
# message from now on, so its owner replaces it (seen on the embedded broker after messages
# timed out during an outage: every retry came back PRODUCER_FENCED).
PRODUCER_STATE_ERRORS = frozenset({
    _CKError.PRODUCER_FENCED, _CKError.INVALID_PRODUCER_EPOCH, _CKError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    _CKError.UNKNOWN_PRODUCER_ID, _CKError.INVALID_PRODUCER_ID_MAPPING, _CKError._FENCED,
    _CKError._FATAL, _CKError._INCONSISTENT, _CKError._GAPLESS_GUARANTEE,
})


def is_record_error(err: _CKError) -> bool:
    return err.code() in RECORD_ERRORS


OnDelivery = Callable[[_CKError | None, Any], None]


class OutputProducer:
    """Produce and wait, within a bound, for the broker's acknowledgements. Runs in: a worker
    (outputs, dead letters) or the supervisor (dead letters of records that crash workers,
    asynchronously through ``on_delivery`` and ``poll``: it must never block the loop).

    ``deliver()`` raises :class:`OutputRejected` when the broker or the client refuses a
    message for what it is (record-specific) and :class:`DeliveryFailed` for anything else
    (an outage), never both: an outage wins, the whole batch is tried again later. A fatal
    error (the idempotent producer lost its state, e.g. after a broker restart) makes
    ``broken`` true: the owner drops this producer and creates a new one."""

    def __init__(self, props: Mapping[str, Any]) -> None:
        props = dict(props)
        props["error_cb"] = self._on_error
        self._p = Producer(props)
        self._failures: list[tuple[str, _CKError]] = []
        self.fatal: str | None = None

    @property
    def broken(self) -> bool:
        return self.fatal is not None

    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log.warning("kafka producer error", extra={"error": str(err)})

    def _on_delivery(self, err: _CKError | None, msg: Message) -> None:
        if err is not None:
            self._failures.append((str(msg.topic()), err))
            self.note(err)

    def note(self, err: _CKError) -> None:
        """Remember a delivery error that breaks the producer itself (see PRODUCER_STATE_ERRORS)."""
        if err.code() in PRODUCER_STATE_ERRORS or err.fatal():
            self.fatal = self.fatal or str(err)

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None,
                on_delivery: OnDelivery | None = None, queue_wait_s: float = 30.0) -> None:
        """Queue one message. Raises OutputRejected if the client refuses it for what it is
        (larger than message.max.bytes), DeliveryFailed if the local queue stays full for
        queue_wait_s (an outage that kept earlier messages from leaving)."""
        deadline = time.monotonic() + queue_wait_s
        while True:
            try:
                self._p.produce(topic, value, key, headers=headers,
                                on_delivery=on_delivery or self._on_delivery)
                return
            except BufferError:
                if time.monotonic() >= deadline:
                    raise DeliveryFailed(f"the producer's local queue stayed full for {queue_wait_s:g} s "
                                         "(the broker is not taking messages)") from None
                self._p.poll(0.05)  # local queue full: let deliveries drain, then retry
            except KafkaException as exc:
                err = exc.args[0]
                if is_record_error(err):
                    raise OutputRejected(_refusal(topic, err, value, key)) from None
                raise DeliveryFailed(f"producing to {topic!r} failed: {err}") from None

    def poll(self, timeout_s: float = 0.0) -> None:
        self._p.poll(timeout_s)

    def deliver(self, timeout_s: float, beat: Callable[[], None] = lambda: None) -> None:
        """Wait until every queued message is acknowledged, at most timeout_s (calling beat()
        between short waits). Raise as described in the class docstring."""
        deadline = time.monotonic() + timeout_s
        remaining = len(self._p)
        while remaining and not self.fatal:
            remaining = self._p.flush(max(0.0, min(0.5, deadline - time.monotonic())))
            beat()
            if time.monotonic() >= deadline:
                break
        failures, self._failures = self._failures, []
        if remaining or self.fatal:
            self.discard_queued()
        outage = [f"{t}: {e}" for t, e in failures if not is_record_error(e)]
        if self.fatal:
            outage.insert(0, f"fatal producer error: {self.fatal}")
        if remaining:
            outage.append(f"{remaining} message(s) not acknowledged within {timeout_s:g} s")
        if outage:
            raise DeliveryFailed(f"delivery failed: {outage[0]}"
                                 + (f" (+{len(outage) - 1} more)" if len(outage) > 1 else ""))
        if failures:
            topic, err = failures[0]
            raise OutputRejected(_refusal(topic, err) + (f" (+{len(failures) - 1} more)"
                                                         if len(failures) > 1 else ""))

    def discard_queued(self) -> None:
        """Drop messages not yet sent: the batch they belong to is tried again later, and they
        must not pile up in the producer's queue across retries of a long outage. Messages
        already in flight may still arrive (a duplicate, never a loss)."""
        with contextlib.suppress(KafkaException, RuntimeError):
            self._p.purge(in_queue=True, in_flight=False, blocking=False)
        self._p.poll(0)
        self._failures.clear()

    def flush(self, timeout_s: float) -> int:
        """Best effort at exit: what was still queued after timeout_s."""
        return int(self._p.flush(timeout_s))


def _refusal(topic: str, err: _CKError, value: bytes | None = None, key: bytes | None = None) -> str:
    size = "" if value is None and key is None else \
        f" (key {len(key or b'')} + value {len(value or b'')} bytes)"
    hint = "; raise kafka.producer message.max.bytes (and the topic's max.message.bytes) or " \
           "make the output smaller" if err.code() in (_CKError.MSG_SIZE_TOO_LARGE,
                                                       _CKError.RECORD_LIST_TOO_LARGE) else ""
    return f"the output to {topic!r} was refused: {err.str()}{size}{hint}"


def check_client_properties(consumer_props: Mapping[str, Any], producer_props: Mapping[str, Any]) -> None:
    """Let librdkafka judge every property (a typo, a bad value) before anything connects: a
    client made without bootstrap.servers never touches the network. Raises ConfigError
    naming the section."""
    for section, client_type, props in (("kafka.consumer", Consumer, consumer_props),
                                        ("kafka.producer", Producer, producer_props)):
        # log_level 3: errors only (no notice that there is no bootstrap.servers: on purpose).
        offline = {k: v for k, v in props.items() if k != "bootstrap.servers"} | {"log_level": 3}
        try:
            client = client_type(offline)
        except KafkaException as exc:
            err = exc.args[0]
            raise ConfigError(f"{section}: {err.str() if isinstance(err, _CKError) else err}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{section}: {exc}") from None
        if isinstance(client, Consumer):
            client.close()
        else:
            client.flush(0)


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
