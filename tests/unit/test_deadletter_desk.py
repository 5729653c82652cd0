"""The supervisor's own dead letters (runtime/supervisor/datapath/deadletter_desk.py):
asynchronous, never blocking its loop, counted as handled only when acknowledged, made to fit,
degraded to a reference record when the broker refuses one for what it is, retried with
back-off during an outage."""

from __future__ import annotations

from confluent_kafka import KafkaError
from fakes import FakeProducer

from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def desk(max_bytes: int = 1_000_000) -> tuple[DeadLetterDesk, FakeProducer, Clock]:
    p, clock = FakeProducer(), Clock()
    return DeadLetterDesk("dlq", lambda: p, max_bytes, clock, backoff_s=1.0, backoff_max_s=4.0), p, clock


ROW = (42, b"k", b"v" * 100, [("h", b"1")])


def test_a_dead_letter_counts_only_once_the_broker_acknowledged_it() -> None:
    d, p, _ = desk()
    d.submit(("t", 0), 7, ROW, "WorkerCrashed", "worker died")
    assert d.poll() == [] and d.pending() == 1, "sent, not acknowledged: not handled yet"
    p.deliver_next(None)
    assert d.poll() == [(("t", 0), 7)] and d.pending() == 0
    h = p.sent[0]["headers"]
    assert h["ringmaster.error.type"] == b"WorkerCrashed" and h["ringmaster.source.offset"] == b"42"


def test_an_outage_is_retried_with_back_off_and_never_blocks() -> None:
    d, p, clock = desk()
    d.submit(("t", 0), 7, ROW, "RecordTooLarge", "too big")
    d.poll()
    p.deliver_next(KafkaError(KafkaError._MSG_TIMED_OUT))
    assert d.poll() == [] and d.last_error
    clock.now += 0.5
    d.poll()
    assert len(p.sent) == 1, "waits for its back-off"
    clock.now += 0.6
    d.poll()
    assert len(p.sent) == 2, "sent again after 1 s"
    p.deliver_next(None)
    assert d.poll() == [(("t", 0), 7)]


def test_a_full_local_queue_is_an_outage_too() -> None:
    d, p, clock = desk()
    p.refuse_produce = True
    d.submit(("t", 0), 7, ROW, "RecordTooLarge", "too big")
    assert d.poll() == [] and d.pending() == 1
    p.refuse_produce = False
    clock.now += 1.1
    d.poll()
    p.deliver_next(None)
    assert d.poll() == [(("t", 0), 7)]


def test_a_letter_the_broker_refuses_for_its_size_becomes_a_reference_record() -> None:
    d, p, _ = desk()
    d.submit(("t", 3), 9, ROW, "RecordTooLarge", "too big")
    d.poll()
    p.deliver_next(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
    d.poll()
    ref = p.sent[-1]
    assert ref["value"] is None and ref["key"] == b"t/3/42"
    assert ref["headers"]["ringmaster.value.omitted"] == b"true"
    p.deliver_next(None)
    assert d.poll() == [(("t", 3), 9)]


def test_a_record_larger_than_message_max_bytes_is_truncated_before_it_is_sent() -> None:
    d, p, _ = desk(max_bytes=20_000)
    d.submit(("t", 0), 1, (5, b"k", b"x" * 100_000, None), "RecordTooLarge", "too big")
    d.poll()
    sent = p.sent[0]
    assert len(sent["value"]) < 20_000 and sent["headers"]["ringmaster.value.truncated"] == b"100000"


def test_letters_of_a_released_partition_are_forgotten() -> None:
    d, _p, _ = desk()
    d.submit(("t", 0), 1, ROW, "WorkerCrashed", "x")
    d.submit(("t", 1), 2, ROW, "WorkerCrashed", "x")
    d.forget(("t", 0))
    assert d.pending() == 1 and d.pending(("t", 1)) == 1


def test_a_redriven_record_that_crashes_again_keeps_its_redrive_count_in_every_form() -> None:
    row = (42, b"k", b"v" * 100, [("h", b"1"), ("ringmaster.redrive.count", b"2")])
    d, p, _ = desk()
    d.submit(("t", 0), 7, row, "WorkerCrashed", "worker died")
    d.poll()
    assert p.sent[0]["headers"]["ringmaster.redrive.count"] == b"2"
    p.deliver_next(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))  # refused: a reference record goes
    d.poll()
    assert p.sent[1]["key"] == b"t/0/42" and p.sent[1]["headers"]["ringmaster.redrive.count"] == b"2"


# ---------------------------------------------------------------------- found by mutation testing
def test_the_supervisors_dead_letter_says_where_the_record_was_who_wrote_it_and_its_crashes() -> None:
    d, p, _ = desk()
    d.submit(("orders", 3), 7, (42, b"key", b"v", [("h", b"1")]), "WorkerCrashed", "worker died", attempts=3,
             plugin_version="2.1")
    d.poll()
    (sent,) = p.sent
    h = sent["headers"]
    assert sent["topic"] == "dlq" and sent["key"] == b"key" and sent["value"] == b"v" and h["h"] == b"1"
    assert h["ringmaster.source.topic"] == b"orders" and h["ringmaster.source.partition"] == b"3"
    assert h["ringmaster.source.offset"] == b"42" and h["ringmaster.attempts"] == b"3"
    assert h["ringmaster.worker"] == b"supervisor" and h["ringmaster.error.message"] == b"worker died"
    assert h["ringmaster.plugin.version"] == b"2.1"


def test_each_failed_attempt_doubles_the_wait_up_to_the_cap() -> None:
    d, p, clock = desk()
    d.submit(("t", 0), 7, ROW, "WorkerCrashed", "x")
    waits = []
    for _ in range(4):
        d.poll()
        p.deliver_next(KafkaError(KafkaError._MSG_TIMED_OUT))
        d.poll()
        sent = len(p.sent)
        step = 0.0
        while len(p.sent) == sent:
            step += 0.5
            clock.now += 0.5
            d.poll()
        waits.append(step)
    assert waits == [1.0, 2.0, 4.0, 4.0], "1 s, doubling, at most backoff_max_s (4 s)"
    assert d.last_error is not None
    p.deliver_next(None)
    assert d.poll() == [(("t", 0), 7)] and d.last_error is None


def test_the_loop_never_waits_on_the_producer() -> None:
    d, p, _ = desk()
    waited: list[float] = []
    p.poll = lambda timeout=0: waited.append(timeout)  # type: ignore[method-assign]
    d.submit(("t", 0), 7, ROW, "WorkerCrashed", "x")
    d.poll()
    assert waited == [0]
    assert p.sent[0]["queue_wait_s"] == 0.0, "nor for room in the producer's queue"


def test_a_producer_that_broke_is_replaced_and_the_letters_in_flight_sent_again() -> None:
    d, p, _ = desk()
    d.submit(("t", 0), 7, ROW, "WorkerCrashed", "x")
    d.poll()
    p.fatal = "idempotent producer lost its state"
    d.poll()  # sees it broken: drops it
    p.fatal = None
    d.poll()  # a new one (the factory gives the same fake), the letter sent again
    assert len(p.sent) == 2
