"""Outputs the broker acknowledged are not written again while the same worker runs the same
records again: retries, bisection, a deferred batch coming back (runtime/execution/acked.py,
issue 29). Judged on what a fake broker holds: every good record's outputs exactly once,
nothing lost, identical outputs of different records all kept (a multiset)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

from runtime.errors import DeliveryFailed, OutputRejected
from runtime.execution import acked as acked_module
from runtime.execution.acked import Acknowledged, acknowledged, digest
from runtime.execution.run import RetryPolicy, run_batch
from runtime.plugin import Backoff, Output, Plugin, Record
from runtime.transport.board import BOARD_BYTES, Board
from runtime.transport.frames import DEFERRED, DONE, BatchFrame, Columns

POLICY = RetryPolicy(max_attempts=2, backoff_s=0, backoff_max_s=0)
BAD = "no such topic!"
MISSING = "missing-topic"  # a valid name the broker refuses (no such topic, none created)


def records(n: int) -> list[Record]:
    return [Record("in", 0, i, None, f"v{i}".encode(), None, (1, 0)) for i in range(n)]


class Broker:
    """A deliver() that writes every output but those routed to BAD (refused, as the broker
    refuses an invalid topic name), saying which it acknowledged, as BatchRunner does."""

    def __init__(self, known: bool = True) -> None:
        self.written: Counter[tuple[str | None, bytes | None]] = Counter()
        self.known = known

    def __call__(self, outputs: list[Output]) -> None:
        ok = [i for i, o in enumerate(outputs) if o.topic != BAD]
        for i in ok:
            self.written[(outputs[i].topic, outputs[i].value)] += 1
        if len(ok) < len(outputs):
            exc = OutputRejected(f"the output to {BAD!r} was refused")
            exc.acknowledged = frozenset(ok) if self.known else None
            raise exc


def per_record(out: Any) -> Plugin:
    def process(batch: Sequence[Record]) -> Iterable[Any]:
        return [o for r in batch for o in out(r)]
    return Plugin("p", process, None, None)


def routed(bad: set[int], extra: int = 1) -> Plugin:
    """Each record: ``extra`` outputs of its own; the records in ``bad`` also one to BAD."""
    def out(r: Record) -> list[Output]:
        outs = [Output(r.value + f"-{j}".encode(), topic="out") for j in range(extra)]
        return outs + ([Output(b"x", topic=BAD)] if r.offset in bad else [])
    return per_record(out)


def test_an_output_refused_in_a_batch_leaves_the_others_written_exactly_once() -> None:
    broker = Broker()
    outcome = run_batch(routed({5}, extra=2), records(8), POLICY, deliver=broker, sleep=lambda _s: None)
    assert [f.record.offset for f in outcome.failures] == [5]
    expected = Counter({("out", f"v{i}-{j}".encode()): 1 for i in range(8) if i != 5 for j in range(2)})
    # Record 5's own good outputs were acknowledged in the first attempts: not written again
    # either, although the record is dead-lettered (its letter carries the record, not them).
    expected.update({("out", b"v5-0"): 1, ("out", b"v5-1"): 1})
    assert broker.written == expected


def test_identical_outputs_of_different_records_are_all_kept() -> None:
    """A multiset: records 0..5 all yield the same output; each must be written once (six
    copies), through the retries and the bisection that isolate record 4."""
    def out(r: Record) -> list[Output]:
        same = [Output(b"same", topic="out")]
        return same + ([Output(b"x", topic=BAD)] if r.offset == 4 else [])
    broker = Broker()
    outcome = run_batch(per_record(out), records(6), POLICY, deliver=broker, sleep=lambda _s: None)
    assert [f.record.offset for f in outcome.failures] == [4]
    assert broker.written == Counter({("out", b"same"): 6})


def test_a_later_part_of_a_bisection_is_not_matched_to_an_earlier_parts_outputs() -> None:
    """Record 2 raises: nothing of the first calls was written. The parts that then succeed
    write their outputs; record 1's identical output must not be taken for record 0's."""
    def process(batch: Sequence[Record]) -> list[Output]:
        if any(r.offset == 2 for r in batch):
            raise ValueError("bad record")
        return [Output(b"same", topic="out") for _ in batch]
    broker = Broker()
    run_batch(Plugin("p", process, None, None), records(4), POLICY, deliver=broker, sleep=lambda _s: None)
    assert broker.written == Counter({("out", b"same"): 3})


def test_when_the_acknowledged_outputs_are_unknown_everything_is_written_again() -> None:
    """No knowledge (in flight when the delivery failed): at-least-once, never a loss."""
    broker = Broker(known=False)
    run_batch(routed({1}), records(2), POLICY, deliver=broker, sleep=lambda _s: None)
    assert broker.written[("out", b"v0-0")] > 1  # written again: nothing assumed
    assert all(n >= 1 for n in broker.written.values())


def test_a_deferred_run_carried_on_writes_nothing_twice() -> None:
    """The batch is bisected (record 5 raises), its first half is written, then a Backoff
    defers it; run again with the same Acknowledged, what was written is not written again."""
    state = {"backoff": True}

    def process(batch: Sequence[Record]) -> list[Output]:
        offsets = [r.offset for r in batch]
        if 5 in offsets and len(offsets) > 1:
            raise ValueError("record 5")
        if state["backoff"] and 6 in offsets:
            state["backoff"] = False
            raise Backoff(0)
        return [Output(r.value, topic="out") for r in batch if r.offset != 5]

    broker = Broker()
    acked = Acknowledged()
    plugin = Plugin("p", process, None, None)
    with pytest.raises(Backoff):
        run_batch(plugin, records(8), POLICY, deliver=broker, sleep=lambda _s: None, acked=acked)
    assert broker.written == Counter({("out", f"v{i}".encode()): 1 for i in range(5)})  # 0..3, 4
    acked.keep()
    run_batch(plugin, records(8), POLICY, deliver=broker, sleep=lambda _s: None, acked=acked)
    assert broker.written == Counter({("out", f"v{i}".encode()): 1 for i in range(8) if i != 5})


def test_nothing_is_hashed_when_no_call_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(_o: Output) -> bytes:
        raise AssertionError("hashed on the hot path")
    monkeypatch.setattr(acked_module, "digest", no)
    broker = Broker()
    run_batch(routed(set()), records(50), POLICY, deliver=broker, sleep=lambda _s: None)
    assert sum(broker.written.values()) == 50


@pytest.mark.parametrize(("a", "b"), [
    (Output(b"", None, None, None), Output(None, None, None, None)),
    (Output(b"v", None, None, ""), Output(b"v", None, None, None)),
    (Output(b"v", b"k"), Output(b"kv")),
    (Output(b"v", None, []), Output(b"v", None, None)),
    (Output(b"v", None, [("a", b"b")]), Output(b"v", None, [("ab", None)])),
    (Output(b"v", None, [("a", b"")]), Output(b"v", None, [("a", None)])),
])
def test_the_digest_tells_apart_outputs_that_differ_in_any_field(a: Output, b: Output) -> None:
    assert digest(a) != digest(b)
    assert digest(a) == digest(Output(a.value, a.key, a.headers, a.topic)) and len(digest(a)) == 16


# -- the local worker: what the producer says, and a deferred batch coming back ------------

class _Msg:
    def __init__(self, topic: str, key: Any, value: Any, headers: Any) -> None:
        self._t, self._k, self._v, self._h = topic, key, value, headers

    def topic(self) -> str:
        return self._t

    def key(self) -> Any:
        return self._k

    def value(self) -> Any:
        return self._v

    def headers(self) -> Any:
        return None  # as confluent-kafka's failed messages: their headers do not come back


class FakeProducer:
    """OutputProducer's contract without a broker: messages to BAD or MISSING are refused at delivery;
    ``outage`` makes the next delivery fail after the broker took the messages queued before
    the outage (one call: the first ``outage`` messages)."""

    broken = False

    def __init__(self) -> None:
        self.written: Counter[bytes] = Counter()
        self.queued: list[_Msg] = []
        self.undelivered: list[Any] | None = None
        self.outage: int | None = None

    def produce(self, topic: str, value: Any, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
        self.queued.append(_Msg(topic, key, value, headers))

    def deliver(self, timeout_s: float, beat: Any = None) -> None:
        queued, self.queued = self.queued, []
        taken = queued if self.outage is None else queued[:self.outage]
        lost = [] if self.outage is None else queued[self.outage:]
        refused = [m for m in taken if m.topic() in (BAD, MISSING)]
        for m in taken:
            if m.topic() not in (BAD, MISSING):
                self.written[m.value()] += 1
        self.undelivered = refused + lost
        if lost:
            self.outage = None
            raise DeliveryFailed("broker away")
        if refused:
            raise OutputRejected("invalid topic")


def _runner(process: Any, producer: FakeProducer) -> Any:
    from runtime.worker.batch_runner import BatchRunner
    from runtime.worker.spec import WorkerSpec
    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1)
    runner = BatchRunner(Plugin("p", process, None, None), spec, Board(memoryview(bytearray(BOARD_BYTES))),
                         producer)  # type: ignore[arg-type]
    runner._dead_letter = lambda failures: None  # letters: not what is judged here
    return runner


def _frame(n: int, first: int = 0, partition: int = 0) -> BatchFrame:
    prefix = f"p{partition}" if partition else ""
    values = [f"{prefix}v{first + i}".encode() for i in range(n)]
    return BatchFrame(1, 0, 1, "in", partition, Columns(first, None, [None] * n, values, None, 0, [0] * n))


@pytest.mark.parametrize("topic", [BAD, MISSING], ids=["invalid-name", "refused-by-the-broker"])
def test_the_worker_writes_the_outputs_of_a_batch_with_a_refused_topic_once(topic: str) -> None:
    def process(batch: Sequence[Record]) -> list[Output]:
        return [Output(r.value) for r in batch] + [Output(b"x", topic=topic) for r in batch if r.offset == 3]
    producer = FakeProducer()
    assert _runner(process, producer).run(_frame(6)).kind == DONE
    assert producer.written == Counter({f"v{i}".encode(): 1 for i in range(6)})


def test_an_output_routed_to_a_name_kafka_never_accepts_is_refused_before_the_client_is_asked() -> None:
    """Asked, the client said "Broker: Invalid topic" or, on Apache Kafka, sometimes "Local:
    Unknown topic", whose hint says to create the topic: the worker's own check says why."""
    from runtime.kafka.producer import invalid_topic
    seen: list[str] = []

    class Recording(FakeProducer):
        def produce(self, topic: str, value: Any, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
            seen.append(topic)
            super().produce(topic, value, key, headers, queue_wait_s)

    runner = _runner(lambda batch: [Output(b"x", topic=BAD) for r in batch if r.offset == 1], Recording())
    failures: list[Any] = []
    runner._dead_letter = failures.extend
    assert runner.run(_frame(3)).kind == DONE
    assert BAD not in seen
    assert [f.record.offset for f in failures] == [1]
    assert "Invalid topic; not a valid topic name" in failures[0].message
    assert invalid_topic("orders.v2-retry_1") is None
    assert invalid_topic("x" * 250) is not None
    assert invalid_topic("orders\n") is not None  # refused by the config check too (runtime/config/models.py)


def test_a_deferred_batch_back_on_the_same_worker_writes_nothing_twice() -> None:
    """An outage after the broker took 2 of the 4 outputs: deferred; when the same batch (or
    one cut longer) comes back, only the others are written."""
    producer = FakeProducer()
    runner = _runner(lambda batch: [Output(r.value) for r in batch], producer)
    producer.outage = 2
    assert runner.run(_frame(4)).kind == DEFERRED
    assert runner.run(_frame(6)).kind == DONE
    assert producer.written == Counter({f"v{i}".encode(): 1 for i in range(6)})


def test_a_batch_that_does_not_begin_with_the_deferred_records_uses_nothing_of_them() -> None:
    producer = FakeProducer()
    runner = _runner(lambda batch: [Output(b"same") for _ in batch], producer)
    producer.outage = 2
    assert runner.run(_frame(4)).kind == DEFERRED
    assert runner.run(_frame(4, first=2)).kind == DONE  # other records: all four written
    assert producer.written == Counter({b"same": 6})


def test_an_unmatched_undelivered_message_means_nothing_is_known() -> None:
    """A refusal that matches no output: nothing is assumed acknowledged; none: all were."""
    assert acknowledged([Output(b"v0")], [_Msg("elsewhere", None, b"?", None)], "out") is None
    assert acknowledged([Output(b"v0")], None, "out") is None
    assert acknowledged([Output(b"v0"), Output(None, topic=None)], [], None) == frozenset({0, 1})


def test_outputs_that_share_an_undelivered_messages_topic_key_and_value_count_as_not_written() -> None:
    """A failed message does not bring its headers back: which of two outputs differing only
    in headers failed is unknown, so neither is assumed written (a duplicate, not a loss)."""
    outputs = [Output(b"v", None, [("a", b"1")]), Output(b"v", None, [("a", b"2")]), Output(b"w")]
    assert acknowledged(outputs, [_Msg("out", None, b"v", None)], "out") == frozenset({2})


def test_the_redrive_writes_the_outputs_of_a_batch_with_an_invalid_topic_once() -> None:
    """The redrive runs the same retries and bisection as a worker, with the same rule."""
    from runtime.redrive.actions import ThroughPlugin
    from tests.unit.test_redrive_engine import TP0, letter_of, stored

    def process(batch: Sequence[Record]) -> list[Output]:
        outs = [Output(b"out-" + (r.value or b"")) for r in batch]
        return outs + [Output(b"x", topic=BAD) for r in batch if r.offset == 103]
    producer = FakeProducer()
    action = ThroughPlugin(Plugin("p", process, None, None), POLICY, lambda: producer,  # type: ignore[arg-type,return-value]
                           "out", "dlq", 1_000_000, 1.0, 100, 0.0, lambda _s: True, "v1")
    for i in range(6):
        letter = letter_of(i, value=f"v{i}".encode())
        action.submit(TP0, letter, stored(letter))
    action.flush_pending()
    outputs = Counter({v: n for v, n in producer.written.items() if v.startswith(b"out-")})
    assert outputs == Counter({f"out-v{i}".encode(): 1 for i in range(6)})
    assert producer.written[b"v3"] == 1, "the record whose output was refused is dead-lettered"


def test_what_deferred_batches_keep_is_bounded_and_the_oldest_partition_is_dropped_first(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from runtime.worker import batch_runner
    monkeypatch.setattr(batch_runner, "MAX_CARRIED_OUTPUTS", 3)
    producer = FakeProducer()
    runner = _runner(lambda batch: [Output(r.value) for r in batch], producer)
    for partition in (0, 1):
        producer.outage = 2
        assert runner.run(_frame(4, partition=partition)).kind == DEFERRED
    assert "too many acknowledged outputs" in caplog.text
    assert runner.run(_frame(4, partition=1)).kind == DONE  # kept: written once
    assert runner.run(_frame(4, partition=0)).kind == DONE  # dropped: its first two again
    assert producer.written == Counter({**{f"p1v{i}".encode(): 1 for i in range(4)},
                                        **{f"v{i}".encode(): 2 if i < 2 else 1 for i in range(4)}})


# -- a multiset, not a set (issue 44): each acknowledged copy stands for one output only ----------
class QueueFullProducer(FakeProducer):
    """The local queue fills after ``room`` messages (once): produce() raises DeliveryFailed,
    and the messages queued before it are delivered, so exactly those count as written."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room: int | None = room

    def produce(self, topic: str, value: Any, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
        if self.room is not None and len(self.queued) == self.room:
            self.room = None
            raise DeliveryFailed("the producer's local queue stayed full")
        super().produce(topic, value, key, headers, queue_wait_s)


def test_a_call_that_yields_one_output_twice_writes_again_the_copy_the_broker_did_not_take() -> None:
    """The batch's one call yields the same output twice and only the first copy is taken
    before an outage defers it: its next run must write the second copy (a set would take the
    acknowledged copy for both, and lose one)."""
    producer = QueueFullProducer(room=1)
    runner = _runner(lambda batch: [Output(b"same"), Output(b"same")], producer)
    assert runner.run(_frame(1)).kind == DEFERRED
    assert producer.written == Counter({b"same": 1})
    assert runner.run(_frame(1)).kind == DONE
    assert producer.written == Counter({b"same": 2})


def test_identical_outputs_of_the_records_of_one_batch_are_each_written_once_through_an_outage() -> None:
    """Four records yield the same output; two copies are taken before the outage: two more
    when the batch comes back, four in all."""
    producer = QueueFullProducer(room=2)
    runner = _runner(lambda batch: [Output(b"same") for _ in batch], producer)
    assert runner.run(_frame(4)).kind == DEFERRED
    assert runner.run(_frame(4)).kind == DONE
    assert producer.written == Counter({b"same": 4})


def test_identical_outputs_across_bisection_parts_are_each_written_once_through_an_outage() -> None:
    """Records 0..5 yield the same output and record 3 raises: bisection runs 0..2 alone, of
    whose three copies one is taken before an outage defers the batch. Run again, the part
    0..2 writes the two copies not taken, the part 4..5 its own two: five in all, record 3
    dead-lettered."""
    def process(batch: Sequence[Record]) -> list[Output]:
        if any(r.offset == 3 for r in batch):
            raise ValueError("record 3")
        return [Output(b"same") for _ in batch]
    producer = QueueFullProducer(room=1)
    runner = _runner(process, producer)
    failures: list[Any] = []
    runner._dead_letter = failures.extend
    assert runner.run(_frame(6)).kind == DEFERRED
    assert producer.written == Counter({b"same": 1})
    assert runner.run(_frame(6)).kind == DONE
    assert producer.written == Counter({b"same": 5})
    assert [f.record.offset for f in failures] == [3]


def test_a_producer_that_broke_is_let_go_of_when_the_worker_makes_a_new_one() -> None:
    """A producer that lost its idempotence state fails every message: the worker makes a new
    one and lets the old one go at once (its client's threads and connections, producer.py
    ``discard``), rather than leaving it to the cyclic collector."""
    from runtime.kafka.producer import OutputProducer

    class Broken(FakeProducer):
        broken = True
        fatal = "Broker: Producer attempted an operation with an old epoch"
        discarded = False

        def discard(self) -> None:
            self.discarded = True

    old = Broken()
    old.outage = 0
    runner = _runner(lambda batch: [Output(r.value) for r in batch], old)
    assert runner.run(_frame(3)).kind == DEFERRED
    assert old.discarded and isinstance(runner.producer, OutputProducer)
    runner.producer.discard()
