"""Producing with acknowledgements, and the delivery errors that tell a record's fault from
an outage. Runs in: workers (outputs, dead letters) and the supervisor (its own dead letters,
asynchronously)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from confluent_kafka import KafkaError as _CKError
from confluent_kafka import KafkaException, Message, Producer

from runtime.errors import DeliveryFailed, KafkaError, KafkaUnreachable, OutputRejected, TransactionAborted
from runtime.kafka.client_log import UNREACHABLE, log_client_error, with_logger
from runtime.kafka.messages import offset_of
from runtime.tp import TOPIC_NAME

log = logging.getLogger(__name__)


# Delivery errors, in three classes (one place: every producer of the runtime asks here).
#
# * RECORD_ERRORS: the message can never be delivered as it is, wherever it goes: it is the
#   record's fault, like a plugin exception (retried with its batch, then isolated and
#   dead-lettered with the error).
# * TOPIC_ERRORS: the topic refuses every message (it does not exist and is not created, this
#   client may not write to it). The record's fault when the record chose the topic (an
#   ``Output(topic=...)`` the plugin routed): another record's outputs go elsewhere, and waiting
#   cannot help. An outage for the topics the configuration names (``[output] topic``, the
#   dead-letter topic): every record would fail alike, and dead-lettering them all would turn a
#   deployment mistake (an ACL, a topic not created yet) into thousands of letters; the batch
#   waits until the operator fixes it, as for a broker away.
# * anything else (broker or leader away, leader moving, timed out, throttled): an outage. The
#   batch waits and is tried again; no record is blamed for it.
RECORD_ERRORS = frozenset({
    _CKError.MSG_SIZE_TOO_LARGE, _CKError.RECORD_LIST_TOO_LARGE, _CKError.INVALID_RECORD,
    _CKError.INVALID_TIMESTAMP,
    # A record sent to a partition the topic does not have (a redrive to the partition a record
    # came from, after the topic was created again with fewer): only an explicit partition can.
    _CKError._UNKNOWN_PARTITION,
    # "Broker: Invalid topic": a name Kafka never accepts ("no such topic!", 250 characters).
    # Configured topic names are checked at start (runtime/config/models.py), and a worker refuses a
    # routed output's before producing it (``invalid_topic``): kept for any other producer.
    _CKError.TOPIC_EXCEPTION,
})
TOPIC_ERRORS = frozenset({
    _CKError.TOPIC_AUTHORIZATION_FAILED,
    # A topic that does not exist with auto-creation off: the broker's answer, or librdkafka's
    # own after topic.metadata.propagation.max.ms.
    _CKError.UNKNOWN_TOPIC_OR_PART, _CKError._UNKNOWN_TOPIC,
})


# Errors that mean the producer's own idempotence state is lost or fenced: it will fail every
# message from now on, so its owner replaces it (seen on the embedded broker after messages
# timed out during an outage: every retry came back PRODUCER_FENCED).
PRODUCER_STATE_ERRORS = frozenset({
    _CKError.PRODUCER_FENCED, _CKError.INVALID_PRODUCER_EPOCH, _CKError.OUT_OF_ORDER_SEQUENCE_NUMBER,
    _CKError.UNKNOWN_PRODUCER_ID, _CKError.INVALID_PRODUCER_ID_MAPPING, _CKError._FENCED,
    _CKError._FATAL, _CKError._INCONSISTENT, _CKError._GAPLESS_GUARANTEE,
})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A message of a delivery that the cluster refused for what it is (``is_records_fault``):
    ``whole_topic`` when the topic refuses every message (missing, not authorised), else this
    message only (its key and value: a failed message does not bring its headers back)."""

    topic: str
    key: bytes | None
    value: bytes | None
    whole_topic: bool
    reason: str


def is_record_error(err: _CKError) -> bool:
    """The message can never be delivered as it is, to whatever topic (RECORD_ERRORS)."""
    return err.code() in RECORD_ERRORS


def is_records_fault(err: _CKError, topic: str, own_topics: frozenset[str] | None) -> bool:
    """Whether a delivery error is the fault of the record whose output it was (the record is
    isolated and dead-lettered) rather than an outage (its batch waits and is tried again):
    RECORD_ERRORS always; TOPIC_ERRORS when ``topic`` is not one of ``own_topics``, the topics
    the configuration names (None: every topic is, so a topic's refusal is always an
    outage)."""
    code = err.code()
    if code in RECORD_ERRORS:
        return True
    return code in TOPIC_ERRORS and own_topics is not None and topic not in own_topics


OnDelivery = Callable[[_CKError | None, Any], None]


class Tally:
    """The failed deliveries of one delivery's messages (those produced with ``on_delivery``),
    on whichever thread serves the client's callbacks: a worker's watcher thread tells from it
    and ``OutputProducer.in_flight`` that a batch in flight was taken whole while the next batch
    runs (runtime/worker/batch_runner.py). Each failure is also passed to ``forward`` (the
    producer's own), so that ``deliver()`` still sees it. (Successes are not reported:
    ``delivery.report.only.error``, runtime/worker/spec.py.)

    RACE: two threads may run callbacks at once (a flush and a poll): ``list.append`` is atomic
    under the GIL."""

    __slots__ = ("_forward", "failed")

    def __init__(self, forward: OnDelivery) -> None:
        self._forward = forward
        self.failed: list[Message] = []  # the messages the broker or the client did not take

    def on_delivery(self, err: _CKError | None, msg: Message) -> None:
        if err is not None:
            self.failed.append(msg)
            self._forward(err, msg)


class _ClientErrors:
    """What a producer's client said through error_cb: its fatal error, if any."""

    __slots__ = ("bootstrap", "fatal")

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.fatal: str | None = None

    def on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log_client_error("kafka producer", err, self.bootstrap)


class _Placement(TypedDict, total=False):
    """Where Producer.produce puts a message: nothing for the partitioner's choice."""

    partition: int


class OutputProducer:
    """Produce and wait, within a bound, for the broker's acknowledgements. Runs in: a worker
    (outputs, dead letters) or the supervisor (dead letters of records that crash workers,
    asynchronously through ``on_delivery`` and ``poll``: it must never block the loop).

    ``deliver()`` raises :class:`OutputRejected` when the broker or the client refuses a
    message for what it is (record-specific) and :class:`DeliveryFailed` for anything else
    (an outage), never both: an outage wins, the whole batch is tried again later. A fatal
    error (the idempotent producer lost its state, e.g. after a broker restart) makes
    ``broken`` true: the owner drops this producer and creates a new one."""

    def __init__(self, props: Mapping[str, Any], own_topics: Iterable[str | None] | None = None) -> None:
        """``own_topics``: the topics the configuration names (outputs, dead letters), whose
        refusal of every message is an outage; a topic error on any other topic (one an
        output was routed to) is the record's fault (``is_records_fault``). None: every
        topic counts as the configuration's."""
        props = with_logger(props)
        self.transactional = bool(props.get("transactional.id"))
        self.own_topics = None if own_topics is None else frozenset(t for t in own_topics if t)
        # Kept apart from this object: a bound method of it as error_cb was a cycle (it -> client
        # -> it), so a producer its owner replaced (broken, fenced) kept its client's threads
        # and broker connections until the cyclic garbage collector ran.
        self._errors = _ClientErrors(str(props.get("bootstrap.servers", "")))
        props["error_cb"] = self._errors.on_error
        try:
            self._p = Producer(props)
        except KafkaException as exc:
            raise KafkaError(f"cannot create a producer: {exc.args[0]}; check [kafka.producer]") from None
        self._failures: list[tuple[str, _CKError, Message]] = []
        # After deliver() raised: the messages of that delivery the broker did not take, or
        # None when some are still in flight (unknown). Every other message queued since the
        # previous deliver() was acknowledged (runtime/execution/acked.py builds on it).
        self.undelivered: list[Message] | None = None
        # After deliver() raised: the messages of that delivery refused for what they are.
        self.refused: list[Refusal] = []

    @property
    def fatal(self) -> str | None:
        """The client's fatal error, or a delivery error that breaks the producer itself."""
        return self._errors.fatal

    @fatal.setter
    def fatal(self, reason: str | None) -> None:
        self._errors.fatal = reason

    @property
    def broken(self) -> bool:
        return self.fatal is not None

    @property
    def client(self) -> Producer:
        """The client itself, for its transactions (runtime/kafka/transactions.py)."""
        return self._p

    def _on_delivery(self, err: _CKError | None, msg: Message) -> None:
        if err is not None:
            try:
                topic = str(msg.topic())
            except SystemError as exc:  # the client's fatal error pending: see _client_failed
                self._client_failed(exc)
                topic = ""
            self._failures.append((topic, err, msg))
            self.note(err)

    def _client_failed(self, exc: SystemError) -> None:
        """A transactional producer fenced by a newer one (a worker's replacement, a daemon's on
        this host, the broker's own epoch bump) turns fatal inside a flush, and confluent-kafka
        (2.x) leaves that error pending while it runs the delivery callbacks: the next call into
        the client in them, and the flush itself, end in SystemError, the fatal error as its
        cause. Seen on a three-node cluster when a frozen coordinator's node woke up. The
        producer is broken: an outage its owner ends by replacing it, never the records' fault
        (the plugin's retry path took it for a plugin exception)."""
        self.fatal = self.fatal or str(exc.__cause__ or exc)

    def note(self, err: _CKError) -> None:
        """Remember a delivery error that breaks the producer itself (see PRODUCER_STATE_ERRORS)."""
        if err.code() in PRODUCER_STATE_ERRORS or err.fatal():
            self.fatal = self.fatal or str(err)

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None,
                on_delivery: OnDelivery | None = None, queue_wait_s: float = 30.0,
                partition: int | None = None) -> None:
        """Queue one message (to ``partition``, or where the partitioner puts its key). Raises
        OutputRejected if the client refuses it for what it is (larger than message.max.bytes,
        a partition the topic does not have), DeliveryFailed if the local queue stays full for
        queue_wait_s (an outage that kept earlier messages from leaving)."""
        on_delivery = on_delivery or self._on_delivery
        try:  # the hot path (once per output): no deadline, no keyword dict until the queue is full
            if partition is None:  # no partition argument at all unless asked: the partitioner places it
                # The stub's list[tuple[str, str | bytes | None]] is invariant, so it refuses our
                # narrower list[tuple[str, bytes | None]], which the client takes as it is.
                self._p.produce(topic, value, key, headers=headers,  # type: ignore[arg-type]
                                on_delivery=on_delivery)
            else:
                self._p.produce(topic, value, key, partition=partition,
                                headers=headers,  # type: ignore[arg-type]
                                on_delivery=on_delivery)
        except BufferError:
            self._produce_when_room(topic, value, key, headers, on_delivery, queue_wait_s, partition)
        except KafkaException as exc:
            raise self._refused(exc, topic, value, key) from None

    def _produce_when_room(self, topic: str, value: bytes | None, key: bytes | None,
                           headers: list[tuple[str, bytes | None]] | None, on_delivery: OnDelivery,
                           queue_wait_s: float, partition: int | None) -> None:
        """The local queue is full: let deliveries drain, and try again, for queue_wait_s."""
        deadline = time.monotonic() + queue_wait_s
        where: _Placement = {} if partition is None else {"partition": partition}
        while True:
            if time.monotonic() >= deadline:
                raise DeliveryFailed(f"the producer's local queue stayed full for {queue_wait_s:g} s "
                                     "(the broker is not taking messages)")
            self._p.poll(0.05)
            try:
                self._p.produce(topic, value, key, headers=headers,  # type: ignore[arg-type]
                                on_delivery=on_delivery, **where)
                return
            except BufferError:
                continue
            except KafkaException as exc:
                raise self._refused(exc, topic, value, key) from None

    def _refused(self, exc: KafkaException, topic: str, value: bytes | None,
                 key: bytes | None) -> OutputRejected | DeliveryFailed | TransactionAborted:
        err = exc.args[0]
        if is_records_fault(err, topic, self.own_topics):
            return OutputRejected(_refusal(topic, err, value, key))
        if err.fatal() or err.code() == _CKError._FATAL:  # "Unable to produce message: Local: Fatal error"
            self.fatal = self.fatal or str(err)
        return self._outage(f"producing to {topic!r} failed: {err}")

    def poll(self, timeout_s: float = 0.0) -> None:
        self._p.poll(timeout_s)

    @property
    def in_flight(self) -> int:
        """Messages not acknowledged yet, or whose failure is not reported yet: 0 once every
        message produced so far has its answer, and its failure (if any) its callback."""
        return len(self._p)

    def tally(self) -> Tally:
        """A record of the failed deliveries of the messages produced with its ``on_delivery``."""
        return Tally(self._on_delivery)

    def deliver(self, timeout_s: float, beat: Callable[[], None] = lambda: None) -> None:
        """Wait until every queued message is acknowledged, at most timeout_s (calling beat()
        between short waits). Raise as described in the class docstring."""
        deadline = time.monotonic() + timeout_s
        remaining = len(self._p)
        while remaining and not self.fatal:
            try:
                remaining = self._p.flush(max(0.0, min(0.5, deadline - time.monotonic())))
            except (KafkaException, SystemError) as exc:
                # A transaction the coordinator timed out fences its producer, and flush() then
                # raised SystemError ("returned a result with an exception set", confluent-kafka
                # 2.16, Apache Kafka 4.4): the worker exited 1 and its batch was blamed (issue 44).
                self.fatal = self.fatal or f"the client failed while flushing: {exc}"
                remaining = len(self._p)
            beat()
            if time.monotonic() >= deadline:
                break
        failures, self._failures = self._failures, []
        purged = self._purge() if remaining or self.fatal else []
        # Knowing which messages made it costs nothing when all did (no failures).
        self.undelivered = None if len(self._p) else [m for _, _, m in failures + purged]
        faults = [(t, e, m) for t, e, m in failures if is_records_fault(e, t, self.own_topics)]
        self.refused = [Refusal(t, m.key(), m.value(), e.code() not in RECORD_ERRORS, _refusal(t, e))
                        for t, e, m in faults]
        refused = [(t, e) for t, e, _ in faults]
        outage = [f"{t}: {e}" for t, e, _ in failures if not is_records_fault(e, t, self.own_topics)]
        if self.fatal:
            outage.insert(0, f"fatal producer error: {self.fatal}")
        if remaining:
            outage.append(f"{remaining} message(s) not acknowledged within {timeout_s:g} s")
        if outage:
            raise self._outage(f"delivery failed: {outage[0]}"
                               + (f" (+{len(outage) - 1} more)" if len(outage) > 1 else ""))
        if refused:
            topic, err = refused[0]
            raise OutputRejected(_refusal(topic, err) + (f" (+{len(refused) - 1} more)"
                                                         if len(refused) > 1 else ""))

    def _outage(self, reason: str) -> DeliveryFailed | TransactionAborted:
        """Not the records' fault. A transactional producer's fatal error ends the batch's
        transaction (the coordinator timed it out and fenced the producer, or a successor took
        its transactional id): TransactionAborted, a deferral like any outage."""
        if self.transactional and self.fatal:
            return TransactionAborted(f"the batch's transaction was aborted: {reason}")
        return DeliveryFailed(reason)

    def discard_queued(self) -> None:
        """Drop messages not yet sent: the batch they belong to is tried again later, and they
        must not pile up in the producer's queue across retries of a long outage. Messages
        already in flight may still arrive (a duplicate, never a loss)."""
        self._purge()

    def _purge(self) -> list[tuple[str, _CKError, Message]]:
        """discard_queued, returning the delivery failures reported meanwhile (the purged
        messages among them)."""
        with contextlib.suppress(KafkaException, RuntimeError, SystemError):  # SystemError: deliver()
            self._p.purge(in_queue=True, in_flight=False, blocking=False)
            try:
                self._p.poll(0)
            except SystemError as exc:
                self._client_failed(exc)
        purged, self._failures = self._failures, []
        return purged

    def discard(self) -> None:
        """Let go of this producer (its owner replaces one that broke or was fenced): what is
        queued or in flight is dropped, and the reports of it served, since each message's
        delivery callback refers back to this object until it runs. Then the client, its
        threads and broker connections go as soon as the owner drops the last reference, not
        at the next run of the cyclic collector. What was in flight may still have been
        written: its batch runs again (at-least-once), or its transaction is aborted."""
        with contextlib.suppress(KafkaException, RuntimeError, SystemError):
            self._p.purge(in_queue=True, in_flight=True, blocking=True)
            self._p.poll(0)
        self._failures = []

    def flush(self, timeout_s: float) -> int:
        """Best effort at exit: what was still queued after timeout_s."""
        return int(self._p.flush(timeout_s))


_HINTS = {
    _CKError.MSG_SIZE_TOO_LARGE: "; raise kafka.producer message.max.bytes (and the topic's "
                                 "max.message.bytes) or make the output smaller",
    _CKError.TOPIC_EXCEPTION: "; not a valid topic name ([a-zA-Z0-9._-], 1-249 characters): fix the "
                              "Output(topic=...) the plugin routed it to",
    _CKError.TOPIC_AUTHORIZATION_FAILED: "; this client may not write to the topic the plugin routed it to",
    _CKError.UNKNOWN_TOPIC_OR_PART: "; the topic the plugin routed it to does not exist (and is not created)",
    _CKError._UNKNOWN_TOPIC: "; the topic the plugin routed it to does not exist (and is not created)",
}
_HINTS[_CKError.RECORD_LIST_TOO_LARGE] = _HINTS[_CKError.MSG_SIZE_TOO_LARGE]
_VALID_TOPIC = re.compile(TOPIC_NAME)


def invalid_topic(topic: str) -> OutputRejected | None:
    """The refusal of an output routed to a topic name Kafka never accepts, before it is
    produced; None for a valid name. Left to the client, the refusal said "Broker: Invalid
    topic" or, when the client had the name's metadata answer first, "Local: Unknown topic"
    (seen on Apache Kafka 4.4), whose hint tells the user to create a topic that cannot exist."""
    if _VALID_TOPIC.fullmatch(topic):  # match() lets "$" pass a trailing newline
        return None
    hint = _HINTS[_CKError.TOPIC_EXCEPTION]
    return OutputRejected(f"the output to {topic!r} was refused: Invalid topic{hint}")


def _refusal(topic: str, err: _CKError, value: bytes | None = None, key: bytes | None = None) -> str:
    size = "" if value is None and key is None else \
        f" (key {len(key or b'')} + value {len(value or b'')} bytes)"
    hint = _HINTS.get(err.code(), "")
    return f"the output to {topic!r} was refused: {err.str()}{size}{hint}"



def write_acknowledged(props: Mapping[str, Any], topic: str,
                       records: Iterable[tuple[bytes | None, bytes | None]], timeout_s: float = 30.0,
                       offsets: list[int] | None = None) -> int:
    """Write (key, value) records with acks=all and wait until the broker has every one;
    KafkaUnreachable when the cluster does not take them in time, KafkaError for any other
    refusal. Returns how many were written. For operator commands and ``ringmaster produce``,
    not a hot path: ``records`` may be a stream (a full local queue is waited out, as its
    deliveries drain, for at most timeout_s). ``offsets``: where the broker put each record
    is appended to it (the console waits for every member to have read past its actions)."""
    props = with_logger({**props, "acks": "all", "message.timeout.ms": int(timeout_s * 1000)})
    bootstrap = props.get("bootstrap.servers", "")
    try:
        p = Producer(props)
    except KafkaException as exc:
        raise KafkaError(f"cannot create a producer: {exc.args[0]}") from None
    failures: list[_CKError] = []
    count = 0

    def done(err: Any, msg: Any) -> None:
        if err:
            failures.append(err)
        elif offsets is not None:
            offsets.append(offset_of(msg))

    try:
        for key, value in records:
            full_since = None
            while True:
                try:
                    p.produce(topic, value, key, on_delivery=done)
                    break
                except BufferError:  # the local queue is full: wait for deliveries, not forever
                    full_since = full_since or time.monotonic()
                    if time.monotonic() - full_since > timeout_s:
                        failures.append(_CKError(_CKError._MSG_TIMED_OUT))
                        break
                    p.poll(0.05)
            count += 1
            if failures:
                break
            p.poll(0)
    except KafkaException as exc:
        raise KafkaError(f"writing to {topic!r} failed: {exc.args[0]}") from None
    left = p.flush(timeout_s + 5)
    if left or any(e.code() in (_CKError._MSG_TIMED_OUT, *UNREACHABLE) for e in failures):
        raise KafkaUnreachable(f"writing to {topic!r} failed: the Kafka cluster at {bootstrap} did not "
                               f"acknowledge it within {timeout_s:g} s"
                               + (f" ({failures[0].str()})" if failures else ""))
    if failures:
        raise KafkaError(f"writing to {topic!r} failed: {failures[0].str()}")
    return count
