"""A worker that does not wait for the broker between batches (runtime/worker/batch_runner.py,
pipelined delivery; issue 41): a batch's outputs stay in flight while the next batch runs, and
the batch is reported only once they are acknowledged; what the broker did not take defers the
batch, and the next one of its partition, which then runs again delivering as it goes, so that
a refused output is isolated on the retry path. Judged on a fake producer that records the
order of produce and flush calls."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from runtime.errors import DeliveryFailed, OutputRejected
from runtime.kafka.producer import Tally
from runtime.plugin import Output, Plugin, Record
from runtime.transport.board import BOARD_BYTES, Board
from runtime.transport.frames import DEFERRED, DONE, BatchFrame, Columns, Result
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec

REFUSED = b"refused"  # an output value the fake broker refuses for what it is


class Msg:
    def __init__(self, topic: str, value: Any) -> None:
        self._topic, self._value = topic, value

    def topic(self) -> str:
        return self._topic

    def key(self) -> Any:
        return None

    def value(self) -> Any:
        return self._value


class FakeProducer:
    """produce() queues; deliver() settles everything queued, as librdkafka's flush does, and
    runs each message's delivery callback: ``fail_next`` makes the next one an outage; an output
    valued REFUSED is refused (only failures have callbacks, as with the workers'
    delivery.report.only.error). poll() (the watcher's) acknowledges what is queued only once
    ``acks`` is set, as the broker would answer while the next batch runs."""

    def __init__(self) -> None:
        self.queued: list[tuple[Msg, Any]] = []
        self.written: list[bytes] = []
        self.calls: list[str] = []  # "produce <value>" and "flush", in order
        self.fail_next = False
        self.undelivered: list[Any] | None = None
        self.broken = False
        self.acks = threading.Event()
        self._lock = threading.Lock()  # the watcher's poll and the worker's produce and flush

    def produce(self, topic: str, value: Any, key: Any, headers: Any, queue_wait_s: float = 0,
                on_delivery: Any = None) -> None:
        with self._lock:
            self.calls.append(f"produce {value.decode()}")
            self.queued.append((Msg(topic, value), on_delivery))

    def tally(self) -> Tally:
        return Tally(lambda err, msg: None)

    @property
    def in_flight(self) -> int:
        return len(self.queued)

    def poll(self, timeout_s: float) -> None:
        if self.acks.wait(timeout_s):
            with self._lock:
                queued, self.queued = self.queued, []
                self._settle(queued)

    def _settle(self, queued: list[tuple[Msg, Any]]) -> list[Msg]:
        refused = [m for m, _ in queued if m.value() == REFUSED]
        self.written += [m.value() for m, _ in queued if m.value() != REFUSED]
        for m, cb in queued:
            if cb is not None and m.value() == REFUSED:  # failures only: delivery.report.only.error
                cb("refused", m)
        return refused

    def deliver(self, timeout_s: float, beat: Any = None) -> None:
        with self._lock:
            self.calls.append("flush")
            queued, self.queued = self.queued, []
            if self.fail_next:
                self.fail_next = False
                self.undelivered = [m for m, _ in queued]
                for m, cb in queued:
                    if cb is not None:
                        cb("timed out", m)
                raise DeliveryFailed("delivery failed: 3 message(s) not acknowledged within 30 s")
            refused = self.undelivered = self._settle(queued)
        if refused:
            raise OutputRejected("the output to 'out' was refused: Broker: Invalid record")

    def flush(self, timeout_s: float) -> int:
        return 0


def echo(refuse: set[int] | None = None) -> Plugin:
    """One output a record, its value the record's; REFUSED for the offsets in ``refuse``."""
    def process(batch: Sequence[Record]) -> list[Output]:
        return [Output(REFUSED if refuse and r.offset in refuse else r.value) for r in batch]
    return Plugin("p", process, None, None)


def frame(batch_id: int, slot: int, first: int, n: int = 3) -> BatchFrame:
    values = [f"s{slot}o{first + i}".encode() for i in range(n)]
    columns = Columns(first, None, [None] * n, values, None, 0, [0] * n)
    return BatchFrame(batch_id, slot, 1, "in", slot, columns)


def runner(plugin: Plugin, producer: FakeProducer, reports: list[Result]) -> BatchRunner:
    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1)
    r = BatchRunner(plugin, spec, Board(memoryview(bytearray(BOARD_BYTES))), producer,  # type: ignore[arg-type]
                    on_settled=reports.append)
    return r


def kinds(reports: list[Result]) -> list[tuple[int, str]]:
    return [(r.batch_id, r.kind.name) for r in reports]


def test_a_batch_is_reported_only_once_its_outputs_are_acknowledged_while_the_next_one_runs() -> None:
    producer, reports = FakeProducer(), []
    r = runner(echo(), producer, reports)
    assert r.run(frame(1, 0, 0)) is None  # in flight: no report yet
    assert producer.calls == ["produce s0o0", "produce s0o1", "produce s0o2"] and reports == []
    assert r.run(frame(2, 1, 0)) is None  # the next batch ran; batch 1 was settled before its outputs
    assert producer.calls[3:] == ["flush", "produce s1o0", "produce s1o1", "produce s1o2"]
    assert kinds(reports) == [(1, "DONE")] and reports[0].processed == 3
    r.settle()  # nothing more to run: wait for it
    assert kinds(reports) == [(1, "DONE"), (2, "DONE")]
    assert producer.written == [b"s0o0", b"s0o1", b"s0o2", b"s1o0", b"s1o1", b"s1o2"]


def test_the_same_partitions_next_batch_may_run_while_the_last_ones_outputs_are_in_flight() -> None:
    """One producer keeps a partition's outputs in order."""
    producer, reports = FakeProducer(), []
    r = runner(echo(), producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    assert r.run(frame(2, 0, 3)) is None
    r.settle()
    assert kinds(reports) == [(1, "DONE"), (2, "DONE")]
    assert producer.written == [f"s0o{i}".encode() for i in range(6)]


def test_outputs_the_broker_did_not_take_defer_their_batch_and_the_next_one_of_its_partition() -> None:
    """The next batch ran, but nothing of it is produced: it is deferred too, and the
    partition's next batch here delivers before it returns (it is not left in flight)."""
    producer, reports = FakeProducer(), []
    r = runner(echo(), producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    producer.fail_next = True
    second = r.run(frame(2, 0, 3))
    assert second is not None and second.kind == DEFERRED
    assert kinds(reports) == [(1, "DEFERRED")] and reports[0].cause == "delivery"
    assert not any(c.startswith("produce s0o3") for c in producer.calls)  # batch 2 produced nothing
    again = r.run(frame(3, 0, 0))  # the partition read again from the deferred batch's first record
    assert again is not None and again.kind == DONE  # delivered before it returned: not pipelined
    assert producer.written == [b"s0o0", b"s0o1", b"s0o2"]


def test_a_late_failure_defers_only_its_own_partition() -> None:
    producer, reports = FakeProducer(), []
    r = runner(echo(), producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    producer.fail_next = True
    assert r.run(frame(2, 1, 0)) is None  # another partition: it goes on, in flight
    assert kinds(reports) == [(1, "DEFERRED")]
    r.settle()
    assert kinds(reports) == [(1, "DEFERRED"), (2, "DONE")]
    assert producer.written == [b"s1o0", b"s1o1", b"s1o2"]


def test_an_output_refused_after_its_batch_ran_is_isolated_when_the_batch_runs_again() -> None:
    """Found late, a refusal cannot fail its call: the batch is deferred, and on its next run
    each delivery is waited for, so the retry path finds the record and dead-letters it. What
    the broker took of the first run is not written again (it was, twice, until the fault
    matrix's output-routed-to-a-missing-topic row caught it on Apache Kafka)."""
    producer, reports = FakeProducer(), []
    r = runner(echo(refuse={1}), producer, reports)
    letters: list[int] = []
    r._dead_letter = lambda failures: letters.extend(f.record.offset for f in failures)  # type: ignore[method-assign]
    assert r.run(frame(1, 0, 0)) is None
    r.settle()
    assert kinds(reports) == [(1, "DEFERRED")]
    again = r.run(frame(2, 0, 0))
    assert again is not None and again.kind == DONE and again.dead_letters == 1
    assert letters == [1]
    assert sorted(producer.written) == [b"s0o0", b"s0o2"], "each once"


def test_only_a_first_call_on_all_the_records_is_left_in_flight() -> None:
    """On the retry path (the plugin raised once) each delivery is waited for."""
    calls = []

    def process(batch: Sequence[Record]) -> list[Output]:
        calls.append(len(batch))
        if len(calls) == 1:
            raise RuntimeError("flaky")
        return [Output(x.value) for x in batch]

    producer, reports = FakeProducer(), []
    r = runner(Plugin("p", process, None, None), producer, reports)
    result = r.run(frame(1, 0, 0))
    assert result is not None and result.kind == DONE and producer.calls[-1] == "flush"


def test_a_batch_without_outputs_settles_the_one_before_it() -> None:
    producer, reports = FakeProducer(), []
    plugin = Plugin("p", lambda batch: [Output(x.value) for x in batch if x.partition == 0], None, None)
    r = runner(plugin, producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    done = r.run(frame(2, 1, 0))  # no outputs: reported at once, after the one before
    assert done is not None and done.kind == DONE
    assert kinds(reports) == [(1, "DONE")]


def test_the_board_shows_a_batch_in_flight_until_it_is_settled() -> None:
    """Invariant 5: a revocation reads the batch running and the one delivering."""
    board = Board(memoryview(bytearray(BOARD_BYTES)))
    board.reset()
    board.begin(7, 2)
    assert board.in_progress() == [(7, 2)]
    board.hand_over()
    assert board.in_progress() == [(7, 2)] and board.current == (0, -1)
    board.begin(8, 3)
    assert sorted(board.in_progress()) == [(7, 2), (8, 3)]
    board.delivered(3)
    assert board.in_progress() == [(8, 3)] and board.batches == 1 and board.records == 3


def test_outputs_in_flight_when_their_batch_is_deferred_are_written_again_when_it_runs_again() -> None:
    """A record the plugin rejects is dead-lettered after the call: that delivery also waits
    for the outputs left in flight, and an outage there defers the batch. Its next run here
    must not take them for acknowledged (a loss)."""
    from runtime.plugin import Reject

    def process(batch: Sequence[Record]) -> list[Any]:
        return ([Output(x.value) for x in batch if x.offset != 1]
                + [Reject(x, "no") for x in batch if x.offset == 1])

    producer, reports = FakeProducer(), []
    r = runner(Plugin("p", process, None, None), producer, reports)
    producer.fail_next = True  # the letter's delivery, which settles the outputs too
    first = r.run(frame(1, 0, 0))
    assert first is not None and first.kind == DEFERRED
    again = r.run(frame(2, 0, 0))
    assert again is not None and again.kind == DONE
    assert sorted(producer.written) == [b"s0o0", b"s0o1", b"s0o2"]  # s0o1: record 1's dead letter


def test_a_batch_acknowledged_while_the_next_one_is_in_the_plugin_is_reported_then() -> None:
    """The watcher reports it as its acknowledgements arrive: if the next batch then hangs
    (killed after batch_timeout_s) or kills its worker, only that one comes back, not the batch
    before it too (its outputs written twice: the fault matrix's hangs-in-process row, r4-r8,
    when the report waited for the next batch's delivery)."""
    entered, release, reported = threading.Event(), threading.Event(), threading.Event()

    def process(batch: Sequence[Record]) -> list[Output]:
        if batch[0].partition == 1:
            entered.set()
            assert release.wait(10), "the test never released the plugin"
        return [Output(x.value) for x in batch]

    producer, reports = FakeProducer(), []
    r = runner(Plugin("p", process, None, None), producer, reports)
    r.on_settled = lambda result: (reports.append(result), reported.set())
    assert r.run(frame(1, 0, 0)) is None
    second = threading.Thread(target=r.run, args=(frame(2, 1, 0),))
    second.start()
    try:
        assert entered.wait(10)
        producer.acks.set()  # the broker answers while batch 2 is in the plugin
        assert reported.wait(10), "batch 1 was not reported while batch 2 ran"
        assert kinds(reports) == [(1, "DONE")] and not release.is_set()
        assert "flush" not in producer.calls  # the worker's thread did not settle it
    finally:
        release.set()
        second.join(10)
    r.settle()
    assert kinds(reports) == [(1, "DONE"), (2, "DONE")]


def test_a_batch_whose_outputs_were_not_all_taken_is_left_to_the_worker_to_defer() -> None:
    """The watcher reports only what the broker took whole: a refusal is found by the
    worker's own settling, which defers the batch (and isolates the record on its next run)."""
    producer, reports = FakeProducer(), []
    r = runner(echo(refuse={1}), producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    producer.acks.set()
    r.settle()
    assert kinds(reports) == [(1, "DEFERRED")]


def test_the_batch_before_is_settled_before_the_next_ones_dead_letters_are_written() -> None:
    """A batch without outputs but with a letter: its letter's delivery waited for the outputs
    in flight too, and their failure was taken for the letter's; the batch before, settled
    later with nothing left to fail, was reported DONE, its outputs lost."""
    from runtime.plugin import Reject

    def process(batch: Sequence[Record]) -> list[Any]:
        if batch[0].partition == 1:
            return [Reject(batch[0], "no")]
        return [Output(x.value) for x in batch]

    producer, reports = FakeProducer(), []
    r = runner(Plugin("p", process, None, None), producer, reports)
    assert r.run(frame(1, 0, 0)) is None
    producer.fail_next = True  # the outage meets batch 1's outputs, in flight
    second = r.run(frame(2, 1, 0, n=1))
    assert kinds(reports) == [(1, "DEFERRED")]
    assert second is not None and second.kind == DONE and second.dead_letters == 1
