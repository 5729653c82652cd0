"""runtime.kafka.consumer.OutputProducer against a fake confluent Producer: a refused output is the
record's fault (OutputRejected), anything else is an outage (DeliveryFailed) and wins, the
wait is bounded and leaves nothing queued behind, a producer that lost its idempotence state
says it is broken."""

from __future__ import annotations

import gc
import os
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException

from runtime.errors import DeliveryFailed, OutputRejected, TransactionAborted
from runtime.kafka.producer import (
    PRODUCER_STATE_ERRORS,
    RECORD_ERRORS,
    TOPIC_ERRORS,
    OutputProducer,
    is_record_error,
    is_records_fault,
)


class FakeMsg:
    def __init__(self, topic: str, value: bytes | None, key: bytes | None, headers: Any,
                 on_delivery: Callable[[Any, Any], None], partition: int | None = None) -> None:
        self._topic, self._value, self._key = topic, value, key
        self.headers, self.on_delivery, self.partition = headers, on_delivery, partition

    def topic(self) -> str:
        return self._topic

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key


class FakeProducer:
    """Stands in for confluent_kafka.Producer. ``fate(msg)`` decides each delivery report
    (None: acknowledged); ``stuck`` keeps messages queued forever (the broker is away)."""

    def __init__(self, fate: Callable[[FakeMsg], CKError | None] = lambda m: None) -> None:
        self.fate = fate
        self.stuck = False
        self.queue: list[FakeMsg] = []
        self.reports: list[tuple[FakeMsg, CKError | None]] = []  # served by the next poll/flush
        self.produce_raises: list[BaseException] = []  # raised by produce(), one per call, in order
        self.produce_always: BaseException | None = None
        self.produced: list[FakeMsg] = []
        self.flushes: list[float] = []
        self.polls: list[float] = []
        self.purges: list[tuple[bool, bool, bool]] = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, *,
                headers: Any = None, on_delivery: Callable[[Any, Any], None], **kw: Any) -> None:
        if self.produce_always is not None:
            raise self.produce_always
        if self.produce_raises:
            raise self.produce_raises.pop(0)
        msg = FakeMsg(topic, value, key, headers, on_delivery, kw.get("partition"))
        self.produced.append(msg)
        self.queue.append(msg)

    def __len__(self) -> int:
        return len(self.queue) + len(self.reports)

    def _serve(self) -> None:
        reports, self.reports = self.reports, []
        for msg, err in reports:
            msg.on_delivery(err, msg)

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        self._serve()
        return 0

    def flush(self, timeout: float) -> int:
        self.flushes.append(timeout)
        if self.stuck:
            time.sleep(min(timeout, 0.005))
        else:
            self.reports.extend((m, self.fate(m)) for m in self.queue)
            self.queue = []
        self._serve()
        return len(self)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.purges.append((in_queue, in_flight, blocking))
        if in_queue:
            self.reports.extend((m, CKError(CKError._PURGE_QUEUE)) for m in self.queue)
            self.queue = []


@pytest.fixture
def fake() -> FakeProducer:
    return FakeProducer()


@pytest.fixture
def producer(fake: FakeProducer) -> Iterator[OutputProducer]:
    p = OutputProducer({"bootstrap.servers": "127.0.0.1:9"})
    p._p = fake  # type: ignore[assignment]  # the real client never connects
    yield p


def err(code: int) -> CKError:
    return CKError(code)


def fail_values(mapping: dict[bytes, int]) -> Callable[[FakeMsg], CKError | None]:
    return lambda m: err(mapping[m.value()]) if m.value() in mapping else None  # type: ignore[index]


# ---------------------------------------------------------------------- the error tables
def test_size_and_validity_errors_are_the_records_fault_and_outages_are_not() -> None:
    for code in (CKError.MSG_SIZE_TOO_LARGE, CKError.RECORD_LIST_TOO_LARGE, CKError.INVALID_RECORD,
                 CKError.INVALID_TIMESTAMP, CKError._UNKNOWN_PARTITION):
        assert is_record_error(err(code))
    for code in (CKError._MSG_TIMED_OUT, CKError._TRANSPORT, CKError.UNKNOWN_TOPIC_OR_PART,
                 CKError.TOPIC_AUTHORIZATION_FAILED, CKError.NOT_LEADER_FOR_PARTITION,
                 CKError.PRODUCER_FENCED):
        assert not is_record_error(err(code))
    assert not RECORD_ERRORS & PRODUCER_STATE_ERRORS


# One test per class of delivery error (issue 29): what can never be delivered is the record's
# fault; what a routed topic refuses is too; what the configured topics refuse, and anything
# transient, is an outage.
OWN = frozenset({"out", "dlq"})
ROUTED = "elsewhere"


@pytest.mark.parametrize("code", [CKError.MSG_SIZE_TOO_LARGE, CKError.RECORD_LIST_TOO_LARGE,
                                  CKError.INVALID_RECORD, CKError.INVALID_TIMESTAMP,
                                  CKError._UNKNOWN_PARTITION, CKError.TOPIC_EXCEPTION])
def test_a_message_that_can_never_be_delivered_is_the_records_fault_whatever_the_topic(code: int) -> None:
    for topic, own in (("out", OWN), (ROUTED, OWN), ("out", None)):
        assert is_records_fault(err(code), topic, own)


@pytest.mark.parametrize("code", [CKError.TOPIC_AUTHORIZATION_FAILED, CKError.UNKNOWN_TOPIC_OR_PART,
                                  CKError._UNKNOWN_TOPIC])
def test_a_topic_refusing_everything_is_the_records_fault_only_where_the_plugin_routed_it(code: int) -> None:
    assert is_records_fault(err(code), ROUTED, OWN), "the plugin chose the topic"
    assert not is_records_fault(err(code), "out", OWN), "the configured output topic: every record alike"
    assert not is_records_fault(err(code), "dlq", OWN), "the dead-letter topic: an outage"
    assert not is_records_fault(err(code), ROUTED, None), "no topics named: every topic is the config's"


@pytest.mark.parametrize("code", [CKError._MSG_TIMED_OUT, CKError._TRANSPORT,
                                  CKError.NOT_LEADER_FOR_PARTITION, CKError.LEADER_NOT_AVAILABLE,
                                  CKError.REQUEST_TIMED_OUT,
                                  CKError.NOT_ENOUGH_REPLICAS, CKError._ALL_BROKERS_DOWN,
                                  CKError.PRODUCER_FENCED, CKError.THROTTLING_QUOTA_EXCEEDED])
def test_transient_errors_are_outages_whatever_the_topic(code: int) -> None:
    assert not is_records_fault(err(code), ROUTED, OWN)
    assert not is_records_fault(err(code), "out", OWN)


# Every error the Kafka protocol calls retriable (the Java client's RetriableException
# subclasses; INVALID_MSG is librdkafka's CORRUPT_MESSAGE): the broker's answer to a cluster in
# trouble, never a record's fault. Issue 40: a replicated cluster refuses outputs with
# NOT_ENOUGH_REPLICAS while its ISR is short.
RETRIABLE = ["NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "NOT_LEADER_OR_FOLLOWER",
             "LEADER_NOT_AVAILABLE", "REQUEST_TIMED_OUT", "NETWORK_EXCEPTION", "INVALID_MSG",
             "KAFKA_STORAGE_ERROR", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH", "OFFSET_NOT_AVAILABLE",
             "CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "COORDINATOR_NOT_AVAILABLE",
             "NOT_COORDINATOR", "THROTTLING_QUOTA_EXCEEDED", "UNSTABLE_OFFSET_COMMIT",
             "PREFERRED_LEADER_NOT_AVAILABLE", "REBALANCE_IN_PROGRESS"]


@pytest.mark.parametrize("name", RETRIABLE)
def test_every_retriable_broker_error_is_an_outage_of_the_configured_topics(name: str) -> None:
    code = getattr(CKError, name, None)
    if code is None and name == "NOT_LEADER_OR_FOLLOWER":  # this client's name for it
        code = CKError.NOT_LEADER_FOR_PARTITION
    assert code is not None, name
    for topic in ("out", "dlq", ROUTED):
        assert not is_records_fault(err(code), topic, OWN), f"{name} on {topic} would be dead-lettered"


def test_the_classes_do_not_overlap() -> None:
    assert not RECORD_ERRORS & TOPIC_ERRORS and not (RECORD_ERRORS | TOPIC_ERRORS) & PRODUCER_STATE_ERRORS


def test_an_output_routed_to_a_topic_that_refuses_it_is_rejected_and_the_configured_ones_wait(
        fake: FakeProducer) -> None:
    p = OutputProducer({"bootstrap.servers": "127.0.0.1:9"}, own_topics=("out", None, "dlq"))
    p._p = fake  # type: ignore[assignment]
    fake.fate = lambda m: err(CKError.TOPIC_AUTHORIZATION_FAILED) if m.topic() != "ok" else None
    p.produce(ROUTED, b"a")
    p.produce("ok", b"b")
    with pytest.raises(OutputRejected, match="may not write to the topic the plugin routed it to"):
        p.deliver(5.0)
    p.produce("out", b"c")
    with pytest.raises(DeliveryFailed):
        p.deliver(5.0)


def test_an_invalid_topic_name_is_rejected_with_how_to_fix_it(fake: FakeProducer) -> None:
    p = OutputProducer({"bootstrap.servers": "127.0.0.1:9"}, own_topics=("out",))
    p._p = fake  # type: ignore[assignment]
    fake.fate = lambda m: err(CKError.TOPIC_EXCEPTION)
    p.produce("no such topic!", b"a")
    with pytest.raises(OutputRejected, match="not a valid topic name"):
        p.deliver(5.0)


# ---------------------------------------------------------------------- deliver()
def test_a_batch_whose_every_message_is_acknowledged_is_delivered(producer: OutputProducer,
                                                                  fake: FakeProducer) -> None:
    beats = []
    producer.produce("out", b"a", b"k", [("h", b"1")])
    producer.produce("out", b"b")
    producer.deliver(5.0, beat=lambda: beats.append(1))
    assert [(m.topic(), m.value(), m.key(), m.headers) for m in fake.produced] == \
        [("out", b"a", b"k", [("h", b"1")]), ("out", b"b", None, None)]
    assert beats, "deliver beats the heartbeat while it waits"
    assert fake.purges == []


def test_deliver_with_nothing_queued_returns_at_once(producer: OutputProducer, fake: FakeProducer) -> None:
    producer.deliver(5.0)
    assert fake.flushes == []


@pytest.mark.parametrize("code", sorted(RECORD_ERRORS))
def test_a_message_refused_for_what_it_is_raises_output_rejected(producer: OutputProducer,
                                                                 fake: FakeProducer, code: int) -> None:
    fake.fate = fail_values({b"big": code})
    producer.produce("out", b"ok")
    producer.produce("out", b"big")
    with pytest.raises(OutputRejected) as caught:
        producer.deliver(5.0)
    assert "the output to 'out' was refused" in str(caught.value)
    assert err(code).str() in str(caught.value)
    assert not producer.broken


def test_several_refusals_are_one_output_rejected_that_counts_the_rest(producer: OutputProducer,
                                                                      fake: FakeProducer) -> None:
    fake.fate = lambda m: err(CKError.MSG_SIZE_TOO_LARGE)
    for v in (b"a", b"b", b"c"):
        producer.produce("out", v)
    with pytest.raises(OutputRejected, match=r"\(\+2 more\)"):
        producer.deliver(5.0)


def test_a_size_refusal_says_how_to_fix_it(producer: OutputProducer, fake: FakeProducer) -> None:
    fake.fate = lambda m: err(CKError.MSG_SIZE_TOO_LARGE)
    producer.produce("out", b"x")
    with pytest.raises(OutputRejected, match=r"message\.max\.bytes"):
        producer.deliver(5.0)


@pytest.mark.parametrize("outage", [CKError._MSG_TIMED_OUT, CKError.UNKNOWN_TOPIC_OR_PART,
                                    CKError.TOPIC_AUTHORIZATION_FAILED, CKError._TRANSPORT])
def test_an_outage_wins_over_a_record_error(producer: OutputProducer, fake: FakeProducer,
                                            outage: int) -> None:
    fake.fate = fail_values({b"big": CKError.MSG_SIZE_TOO_LARGE, b"lost": outage})
    producer.produce("out", b"big")
    producer.produce("out", b"lost")
    with pytest.raises(DeliveryFailed) as caught:
        producer.deliver(5.0)
    assert not isinstance(caught.value, OutputRejected)
    assert err(outage).str() in str(caught.value)


def test_an_outage_alone_is_a_delivery_failure(producer: OutputProducer, fake: FakeProducer) -> None:
    fake.fate = lambda m: err(CKError._MSG_TIMED_OUT)
    producer.produce("out", b"a")
    with pytest.raises(DeliveryFailed, match="Message timed out"):
        producer.deliver(5.0)


def test_messages_still_queued_after_the_timeout_fail_the_delivery_and_are_purged(
        producer: OutputProducer, fake: FakeProducer) -> None:
    fake.stuck = True
    producer.produce("out", b"a")
    producer.produce("out", b"b")
    started = time.monotonic()
    with pytest.raises(DeliveryFailed, match=r"2 message\(s\) not acknowledged within 0\.1 s"):
        producer.deliver(0.1)
    assert time.monotonic() - started < 2.0, "the wait is bounded by the timeout"
    assert all(t <= 0.1 + 1e-9 for t in fake.flushes), "no flush waits past the deadline"
    assert fake.purges == [(True, False, False)], "queued messages are dropped, in-flight ones are not"
    assert len(fake) == 0, "the purge reports were served"


def test_a_purged_batchs_reports_do_not_fail_the_next_batch(producer: OutputProducer,
                                                          fake: FakeProducer) -> None:
    fake.stuck = True
    producer.produce("out", b"a")
    with pytest.raises(DeliveryFailed):
        producer.deliver(0.05)
    fake.stuck = False
    producer.produce("out", b"b")
    producer.deliver(5.0)  # the purge reports (_PURGE_QUEUE) of the first batch are forgotten


def test_the_failures_of_one_delivery_are_forgotten_by_the_next(producer: OutputProducer,
                                                               fake: FakeProducer) -> None:
    fake.fate = fail_values({b"big": CKError.MSG_SIZE_TOO_LARGE})
    producer.produce("out", b"big")
    with pytest.raises(OutputRejected):
        producer.deliver(5.0)
    producer.produce("out", b"fine")
    producer.deliver(5.0)
    fake.fate = fail_values({b"lost": CKError._MSG_TIMED_OUT})
    producer.produce("out", b"lost")
    with pytest.raises(DeliveryFailed):
        producer.deliver(5.0)
    producer.produce("out", b"fine")
    producer.deliver(5.0)


# ---------------------------------------------------------------------- broken producers
@pytest.mark.parametrize("code", sorted(PRODUCER_STATE_ERRORS))
def test_a_delivery_error_that_loses_the_producers_state_makes_it_broken(producer: OutputProducer,
                                                                       fake: FakeProducer, code: int) -> None:
    fake.fate = lambda m: err(code)
    producer.produce("out", b"a")
    assert not producer.broken
    with pytest.raises(DeliveryFailed, match="fatal producer error"):
        producer.deliver(5.0)
    assert producer.broken and producer.fatal is not None


def test_a_fatal_client_error_makes_the_producer_broken_and_fails_delivery_at_once(
        producer: OutputProducer, fake: FakeProducer) -> None:
    fake.stuck = True
    producer.produce("out", b"a")
    producer._errors.on_error(CKError(CKError._FATAL, "idempotence lost", fatal=True))
    assert producer.broken
    started = time.monotonic()
    with pytest.raises(DeliveryFailed, match="idempotence lost"):
        producer.deliver(30.0)
    assert time.monotonic() - started < 5, "a broken producer does not wait out the timeout"
    assert fake.purges and fake.purges[0][:2] == (True, False)


def test_a_fenced_transactional_producer_is_an_outage_never_the_records_fault(
        producer: OutputProducer, fake: FakeProducer) -> None:
    """confluent-kafka leaves a fenced transactional producer's fatal error pending while it
    runs the delivery callbacks (a three-node cluster, a frozen coordinator woken up): a call
    into the client in a callback, and the flush, end in SystemError. It escaped deliver(), and
    the plugin's retry path took it for the plugin's exception."""
    fenced = KafkaException(CKError(CKError._FENCED, "fenced by a newer instance", fatal=True))

    class Pending(FakeMsg):
        def topic(self) -> str:
            raise SystemError("<method 'topic'> returned a result with an exception set") from fenced

    real_flush = fake.flush

    def flush(timeout: float) -> int:
        for m in fake.queue:
            m.__class__ = Pending
        fake.reports.extend((m, err(CKError._PURGE_QUEUE)) for m in fake.queue)
        fake.queue = []
        fake._serve()
        raise SystemError("<method 'flush'> returned NULL without setting an exception")

    fake.flush = flush  # type: ignore[method-assign]
    producer.produce("out", b"a")
    with pytest.raises(DeliveryFailed, match="fatal producer error"):
        producer.deliver(5.0)
    assert producer.broken and "fenced by a newer instance" in (producer.fatal or "")
    fake.flush = real_flush  # type: ignore[method-assign]


def test_a_transient_client_error_does_not_break_the_producer(producer: OutputProducer) -> None:
    producer._errors.on_error(CKError(CKError._TRANSPORT))
    producer.note(CKError(CKError._MSG_TIMED_OUT))
    assert not producer.broken


# ---------------------------------------------------------------------- produce()
def test_a_message_the_client_refuses_for_its_size_is_output_rejected(producer: OutputProducer,
                                                                       fake: FakeProducer) -> None:
    fake.produce_always = KafkaException(err(CKError.MSG_SIZE_TOO_LARGE))
    with pytest.raises(OutputRejected) as caught:
        producer.produce("out", b"v" * 10, b"kk")
    assert "key 2 + value 10 bytes" in str(caught.value)
    assert "message.max.bytes" in str(caught.value)


def test_any_other_produce_error_is_a_delivery_failure(producer: OutputProducer, fake: FakeProducer) -> None:
    fake.produce_always = KafkaException(err(CKError._UNKNOWN_TOPIC))
    with pytest.raises(DeliveryFailed) as caught:
        producer.produce("nowhere", b"v")
    assert not isinstance(caught.value, OutputRejected)
    assert "nowhere" in str(caught.value)


def test_a_full_local_queue_is_waited_out_while_deliveries_drain(producer: OutputProducer,
                                                                 fake: FakeProducer) -> None:
    fake.produce_raises = [BufferError("Local: Queue full"), BufferError("Local: Queue full")]
    producer.produce("out", b"v", queue_wait_s=5.0)
    assert [m.value() for m in fake.produced] == [b"v"]
    assert len(fake.polls) == 2, "each refusal serves delivery reports before trying again"


def test_a_message_refused_once_the_queue_has_room_is_still_refused_for_what_it_is(
        producer: OutputProducer, fake: FakeProducer) -> None:
    fake.produce_raises = [BufferError("Local: Queue full"), KafkaException(err(CKError.MSG_SIZE_TOO_LARGE))]
    with pytest.raises(OutputRejected, match=r"message\.max\.bytes"):
        producer.produce("out", b"v" * 10, partition=1, queue_wait_s=5.0)
    assert fake.polls and not fake.produced


def test_a_local_queue_that_stays_full_becomes_a_delivery_failure(producer: OutputProducer,
                                                                  fake: FakeProducer) -> None:
    fake.produce_always = BufferError("Local: Queue full")
    started = time.monotonic()
    with pytest.raises(DeliveryFailed, match=r"stayed full for 0\.05 s"):
        producer.produce("out", b"v", queue_wait_s=0.05)
    assert time.monotonic() - started < 2.0
    assert fake.polls, "it polled while it waited"


def test_a_custom_delivery_callback_replaces_the_default_one(producer: OutputProducer,
                                                             fake: FakeProducer) -> None:
    seen: list[Any] = []
    fake.fate = lambda m: err(CKError.MSG_SIZE_TOO_LARGE)
    producer.produce("dlq", b"v", on_delivery=lambda e, m: seen.append(e.code()), queue_wait_s=0.0)
    producer.deliver(1.0)  # the owner of the callback judges the report, not deliver()
    assert seen == [CKError.MSG_SIZE_TOO_LARGE]


def test_a_message_goes_to_the_partition_asked_for_and_a_partition_the_topic_lacks_is_its_fault(
        producer: OutputProducer, fake: FakeProducer) -> None:
    producer.produce("t", b"v", b"k", partition=3)
    producer.produce("t", b"w", b"k")
    assert [m.partition for m in fake.produced] == [3, None], "None: the partitioner's choice"
    fake.produce_raises.append(KafkaException(err(CKError._UNKNOWN_PARTITION)))
    with pytest.raises(OutputRejected):
        producer.produce("t", b"v", b"k", partition=99)
class StreamProducer:
    """A confluent_kafka.Producer whose local queue holds two messages until polled."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.queued: list[Any] = []
        self.sent: list[bytes] = []
        self.fail: bytes | None = None

    def produce(self, topic: str, value: bytes, key: bytes | None, on_delivery: Any) -> None:
        if len(self.queued) >= 2:
            raise BufferError("queue full")
        self.queued.append((value, on_delivery))

    def poll(self, timeout: float) -> int:
        for value, done in self.queued:
            self.sent.append(value)
            done(CKError(CKError.MSG_SIZE_TOO_LARGE) if value == self.fail else None, None)
        self.queued.clear()
        return 0

    def flush(self, timeout: float) -> int:
        self.poll(0)
        return 0


def test_writing_a_stream_waits_out_a_full_local_queue_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.kafka.producer as producer_mod

    made: list[StreamProducer] = []
    def make(props: dict[str, Any]) -> StreamProducer:
        made.append(StreamProducer(props))
        return made[-1]

    monkeypatch.setattr(producer_mod, "Producer", make)
    count = producer_mod.write_acknowledged({}, "t", ((None, f"v{i}".encode()) for i in range(7)))
    assert count == 7 and made[0].sent == [f"v{i}".encode() for i in range(7)]


def test_writing_a_stream_stops_at_the_first_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.kafka.producer as producer_mod
    from runtime.errors import KafkaError

    fake = StreamProducer({})
    fake.fail = b"v1"
    monkeypatch.setattr(producer_mod, "Producer", lambda props: fake)
    with pytest.raises(KafkaError, match="writing to 't' failed"):
        producer_mod.write_acknowledged({}, "t", ((None, f"v{i}".encode()) for i in range(100)))
    assert len(fake.sent) < 100, "a refused record stops the stream"


# ------------------------------------------------- a transaction the coordinator ended (issue 44)
class FencedFlush(FakeProducer):
    """What confluent-kafka 2.16 did on Apache Kafka 4.4 once the coordinator had timed out the
    producer's transaction and fenced it: flush() raised SystemError ("<class 'str'> returned a
    result with an exception set"), and every produce() after it KafkaException _FATAL."""

    def flush(self, timeout: float) -> int:
        self.flushes.append(timeout)
        self.produce_always = KafkaException(err(CKError._FATAL))
        raise SystemError("<class 'str'> returned a result with an exception set")


@pytest.mark.parametrize("transactional", [True, False], ids=["transactional", "idempotent"])
def test_a_client_that_fails_inside_flush_is_an_outage_and_a_fenced_transaction_is_aborted(
        transactional: bool) -> None:
    """The worker used to exit 1 on it, and its batch was blamed and bisected."""
    props = {"bootstrap.servers": "127.0.0.1:9", **({"transactional.id": "t"} if transactional else {})}
    p = OutputProducer(props)
    p._p = FencedFlush()  # type: ignore[assignment]
    p.produce("out", b"v")
    kind = TransactionAborted if transactional else DeliveryFailed
    with pytest.raises(kind) as caught:
        p.deliver(1.0)
    assert p.broken and "flushing" in str(caught.value)
    assert transactional == isinstance(caught.value, TransactionAborted)
    with pytest.raises(kind):  # "Unable to produce message: Local: Fatal error"
        p.produce("out", b"w")


def test_a_failed_delivery_says_which_messages_were_refused_for_what_they_are(
        fake: FakeProducer, producer: OutputProducer) -> None:
    """What a transaction's next run must not produce again (runtime/worker/refusals.py): the
    routed topic that refuses everything, the message too large for its topic; not an outage."""
    producer.own_topics = OWN
    fake.fate = lambda m: (err(CKError.UNKNOWN_TOPIC_OR_PART) if m.topic() == ROUTED
                           else err(CKError.MSG_SIZE_TOO_LARGE) if m.value() == b"big"
                           else err(CKError._MSG_TIMED_OUT) if m.value() == b"late" else None)
    for topic, value in ((ROUTED, b"a"), ("out", b"big"), ("out", b"ok")):
        producer.produce(topic, value, b"k")
    with pytest.raises(OutputRejected):
        producer.deliver(1.0)
    assert [(r.topic, r.key, r.value, r.whole_topic) for r in producer.refused] == \
        [(ROUTED, b"k", b"a", True), ("out", b"k", b"big", False)]
    producer.produce("out", b"late")
    with pytest.raises(DeliveryFailed):
        producer.deliver(1.0)
    assert producer.refused == []


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("queued", [0, 50])
def test_a_producer_let_go_takes_its_client_with_it_without_the_garbage_collector(queued: int) -> None:
    """A worker replaces a producer that broke or was fenced (batch_runner.py, transactional.py).
    Were it a reference cycle with its client (error_cb a bound method of it; each message's
    delivery callback one too, until its report is served), the client's threads and broker
    connections would live until the cyclic collector ran: once a fault for each replacement."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        before = _threads()
        producer = OutputProducer({"bootstrap.servers": "127.0.0.1:1"})
        for i in range(queued):  # never sent: nothing listens there
            producer.produce("out", b"v%d" % i, b"k")
        assert _threads() > before, "the client's threads"
        kept = weakref.ref(producer)
        producer.discard()
        del producer
        assert kept() is None, "the producer outlived its owner's reference"
        assert _threads() == before, "the client's threads outlived it"
    finally:
        if enabled:
            gc.enable()
