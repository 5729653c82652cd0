"""runtime.redrive.engine and actions against fakes: what is taken and where the run ends, that
nothing is committed past a letter not acknowledged, stops, outages, rebalances, the group kept
alive through long waits with bounded memory; the to-source and through-the-plugin actions."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError as CKError
from confluent_kafka import Message

from runtime.errors import DeliveryFailed
from runtime.execution.deadletter_format import REDRIVE_COUNT, dead_letter_headers
from runtime.execution.run import RetryPolicy
from runtime.kafka.consumer import Fetched
from runtime.kafka.offset_commits import CommitResult
from runtime.kafka.topic_reader import Stored
from runtime.plugin import VERSION_HEADER, Backoff, Output, Plugin, Record, Reject
from runtime.redrive.actions import Outcome, Result, ThroughPlugin, ToSource
from runtime.redrive.engine import Redrive, Stopper
from runtime.redrive.letters import Letter, read_letter
from runtime.redrive.pacing import TokenBucket
from runtime.redrive.report import Ending, Mode, Summary
from runtime.redrive.selection import OffsetBound, Selection, Skip

DLQ = "dlq"
TP0, TP1 = (DLQ, 0), (DLQ, 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStopper(Stopper):
    """Waits move the fake clock; no signal handlers are touched."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def install(self) -> None:
        pass

    def restore(self) -> None:
        pass

    def wait(self, seconds: float) -> bool:
        if self.requested():
            return False
        self.clock.now += max(0.0, seconds)
        return True


def dead(partition: int, offset: int, source_offset: int | None = None, value: bytes = b"v",
         error_type: str = "ValueError") -> Message:
    h = dead_letter_headers([("trace", b"t")], error_type=error_type, message="m", traceback="", topic="in",
                            partition=0, offset=offset if source_offset is None else source_offset,
                            attempts=1, worker="w")
    return Message(topic=DLQ, partition=partition, offset=offset, key=b"k", value=value, headers=h,
                   timestamp=(1, 5))


def fetched(tp: tuple[str, int], *offsets: int, eof: int | None = None) -> Fetched:
    f = Fetched()
    if offsets:
        f.runs[tp] = [dead(tp[1], o) for o in offsets]
        f.count = len(offsets)
    if eof is not None:
        f.eof[tp] = eof
    return f


Step = Fetched | Callable[[], Fetched]


class FakeConsumer:
    def __init__(self, clock: Clock, steps: Iterable[Step] = ()) -> None:
        self.clock = clock
        self.steps: deque[Step] = deque(steps)
        self.commits: list[tuple[dict[tuple[str, int], int], bool]] = []
        self.paused: set[tuple[str, int]] = set()
        self.pauses: list[list[tuple[str, int]]] = []
        self.resumes: list[list[tuple[str, int]]] = []
        self.consumed_at: list[tuple[float, float]] = []  # (called, returned)
        self.empty = 0
        self.refuse: str | None = None  # synchronous commits refused with this error
        self.refuse_async = False  # asynchronous commits refused (the answer comes in consume())
        self._refused_async: dict[tuple[str, int], int] = {}

    def consume(self, max_records: int, timeout_s: float) -> Fetched:
        called = self.clock.now
        self.clock.now += timeout_s
        self.consumed_at.append((called, self.clock.now))
        if not self.steps:
            self.empty += 1
            assert self.empty < 10_000, "the engine never ends"
            return Fetched()
        step = self.steps[0]
        if isinstance(step, Fetched) and step.runs and set(step.runs) <= self.paused:
            return Fetched()  # librdkafka fetches nothing for a paused partition
        self.steps.popleft()
        return step() if callable(step) else step

    def pause(self, tps: Iterable[tuple[str, int]]) -> None:
        tps = list(tps)
        self.pauses.append(tps)
        self.paused.update(tps)

    def resume(self, tps: Iterable[tuple[str, int]]) -> None:
        tps = list(tps)
        self.resumes.append(tps)
        self.paused.difference_update(tps)

    def commit(self, offsets: Mapping[tuple[str, int], int], asynchronous: bool) -> CommitResult:
        self.commits.append((dict(offsets), asynchronous))
        if self.refuse and not asynchronous:  # the broker's answer to a synchronous commit
            return CommitResult(True, {tp: self.refuse for tp in offsets})
        if self.refuse_async and asynchronous:
            self._refused_async.update(offsets)
        return CommitResult(True)

    def take_refused_commits(self) -> dict[tuple[str, int], int]:
        refused, self._refused_async = self._refused_async, {}
        return refused

    def last_commit(self) -> dict[tuple[str, int], int]:
        out: dict[tuple[str, int], int] = {}
        for offsets, _ in self.commits:
            out.update(offsets)
        return out


class FakeAction:
    """Takes letters; settles each at once (auto) or when told (ack)."""

    def __init__(self, auto: bool = True, on_submit: Callable[[int], None] = lambda n: None) -> None:
        self.auto, self.on_submit = auto, on_submit
        self.taken: list[tuple[tuple[str, int], int]] = []
        self.letters: dict[tuple[tuple[str, int], int], Letter] = {}
        self._done: list[Outcome] = []
        self.error: str | None = None
        self.forgotten: list[set[tuple[str, int]]] = []

    def submit(self, tp: tuple[str, int], letter: Letter, record: Stored) -> None:
        self.taken.append((tp, letter.offset))
        self.letters[(tp, letter.offset)] = letter
        if self.auto:
            self.ack(tp, letter.offset)
        self.on_submit(len(self.taken))

    def ack(self, tp: tuple[str, int], *offsets: int) -> None:
        for o in offsets:
            self._done.append(Outcome(tp, o, "ValueError", "in", Result.REDRIVEN))

    def flush_pending(self) -> None:
        pass

    def poll(self) -> list[Outcome]:
        done, self._done = self._done, []
        return done

    def settle(self, timeout_s: float) -> list[Outcome]:
        return self.poll()

    def forget(self, tps: Iterable[tuple[str, int]]) -> None:
        self.forgotten.append(set(tps))

    def close(self) -> None:
        pass


def engine(consumer: FakeConsumer, action: Any, clock: Clock, ends: dict[int, int], *,
           selection: Selection | None = None, dry_run: bool = False,
           assign: Iterable[tuple[str, int]] = (TP0,),
           **kw: Any) -> Redrive:
    summary = Summary(DLQ, "g.redrive", Mode.TO_SOURCE, dry_run)
    e = Redrive(consumer, action, selection or Selection(["in"]), summary, ends, clock, FakeStopper(clock),
                to_do=kw.pop("to_do", {p for _, p in assign}), **kw)
    if assign:
        e.on_assign(list(assign))
    return e


# ---------------------------------------------------------------------------- ends
def test_every_letter_up_to_the_end_seen_at_start_is_taken_and_the_cursor_moves_after_them() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3, 4, 5, 6)])  # 5, 6: written since the start
    action = FakeAction()
    summary = engine(consumer, action, clock, {0: 5}).run()
    assert summary.ending is Ending.END
    assert [o for _, o in action.taken] == [0, 1, 2, 3, 4]
    assert consumer.last_commit() == {TP0: 5} and consumer.commits[-1][1] is False, "the last commit is sync"
    assert TP0 in consumer.paused, "a partition at its end fetches no more"


class Unreadable:
    """A letter the client cannot read: headers() raises, as confluent-kafka does for a header
    name that is not UTF-8; a second call would touch its broken cache."""

    def __init__(self, offset: int) -> None:
        self._offset, self.header_calls = offset, 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"

    def headers(self) -> None:
        self.header_calls += 1
        assert self.header_calls == 1, "headers() called again after it failed"
        raise SystemError("<built-in method headers> returned a result with an exception set")

    def timestamp(self) -> tuple[int, int]:
        return (1, 5)


def test_a_poisoned_letter_is_passed_over_counted_and_committed_past_and_the_run_goes_on() -> None:
    """Issue 29: one letter whose headers hold numbers no Kafka type takes (a 5,000-digit redrive
    count, a source partition of 2**32) or that the client cannot read stops nothing."""
    clock = Clock()
    huge_count = dead(0, 1)
    huge_count.set_headers([*huge_count.headers(), (REDRIVE_COUNT, b"9" * 5000)])
    wide = dead(0, 2)
    wide.set_headers([(k, str(2**32).encode() if k.endswith("source.partition") else v)
                      for k, v in wide.headers()])
    unreadable = Unreadable(3)
    f = Fetched()
    f.runs[TP0] = [dead(0, 0), huge_count, wide, unreadable, dead(0, 4)]
    consumer = FakeConsumer(clock, [f])
    action = FakeAction()
    summary = engine(consumer, action, clock, {0: 5}).run()
    assert summary.ending is Ending.END
    assert [o for _, o in action.taken] == [0, 4], "the good letters on both sides are redriven"
    assert summary.skipped[Skip.MALFORMED] == 3
    assert consumer.last_commit() == {TP0: 5}, "the cursor moves past the malformed letters"
    assert "redrive.count" in summary.examples[Skip.MALFORMED]


def test_a_final_commit_the_broker_refuses_is_reported_not_counted_as_done() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2)])
    consumer.refuse = "REBALANCE_IN_PROGRESS"
    summary = engine(consumer, FakeAction(), clock, {0: 3}).run()
    assert summary.committed is False, "the summary says the next run may redo some"


def test_an_asynchronous_commit_the_broker_refused_is_sent_again_by_the_final_commit() -> None:
    # The periodic commit of 3 is refused (NOT_COORDINATOR, a rebalance): nothing moves after
    # it, and yet the final commit must carry 3, or the next run redrives 0-2 again.
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2), *[Fetched() for _ in range(10)],
                                    fetched(TP0, eof=4)])
    consumer.refuse_async = True
    summary = engine(consumer, FakeAction(), clock, {0: 4}).run()
    assert summary.ending is Ending.END and summary.committed
    assert ({TP0: 3}, True) in consumer.commits, "the periodic commit was sent (and refused)"
    assert consumer.commits[-1] == ({TP0: 3}, False)


def test_the_end_of_a_partition_reported_with_its_last_records_comes_after_them() -> None:
    # Offset 3 was compacted away: only the end-of-partition event says the end (4) is reached.
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, eof=4)])
    action = FakeAction()
    assert engine(consumer, action, clock, {0: 4}).run().ending is Ending.END
    assert [o for _, o in action.taken] == [0, 1, 2]
    assert consumer.last_commit() == {TP0: 3}


def test_a_partition_already_at_its_end_ends_at_its_first_end_event() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, eof=7)])
    action = FakeAction()
    summary = engine(consumer, action, clock, {0: 7}).run()
    assert summary.ending is Ending.END and action.taken == [] and consumer.commits == []


def test_to_ends_the_partition_there_and_the_cursor_stays_before_it() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3, 4)])
    action = FakeAction()
    to = Selection(["in"], end=OffsetBound(every=3))
    summary = engine(consumer, action, clock, {0: 5}, selection=to).run()
    assert [o for _, o in action.taken] == [0, 1, 2] and consumer.last_commit() == {TP0: 3}
    assert summary.ending is Ending.END


def test_partitions_another_member_holds_make_the_run_say_so() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, eof=1)])
    summary = engine(consumer, FakeAction(), clock, {0: 1, 1: 3}, to_do={0, 1}).run()
    assert summary.ending is Ending.NO_PARTITIONS


def test_no_assignment_at_all_ends_the_run_after_the_assign_timeout() -> None:
    clock = Clock()
    summary = engine(FakeConsumer(clock), FakeAction(), clock, {0: 3}, assign=(), to_do={0},
                     assign_timeout_s=5).run()
    assert summary.ending is Ending.NO_PARTITIONS


# ---------------------------------------------------------------------------- at-least-once
def test_nothing_is_committed_past_a_letter_whose_copy_is_not_acknowledged() -> None:
    clock = Clock()
    action = FakeAction(auto=False, on_submit=lambda n: action.ack(TP0, 0, 2, 3) if n == 4 else None)
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3)])  # 1 is never acknowledged
    summary = engine(consumer, action, clock, {0: 4}, commit_interval_s=0.1).run()
    assert summary.ending is Ending.END
    assert consumer.last_commit() == {TP0: 1}
    assert all(offsets[TP0] <= 1 for offsets, _ in consumer.commits)


def test_a_stop_finishes_what_is_in_flight_commits_it_and_takes_nothing_more() -> None:
    clock = Clock()
    stopper: list[Stopper] = []
    action = FakeAction(on_submit=lambda n: stopper[0].request() if n == 2 else None)
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3, 4)])
    e = engine(consumer, action, clock, {0: 5})
    stopper.append(e.stopper)
    summary = e.run()
    assert summary.ending is Ending.STOPPED
    assert [o for _, o in action.taken] == [0, 1] and consumer.last_commit() == {TP0: 2}


def test_an_outage_stops_the_run_with_the_cursor_at_the_last_acknowledged_letter() -> None:
    clock = Clock()
    action = FakeAction(auto=False)

    def outage(n: int) -> None:
        if n < 3:
            action.ack(TP0, n - 1)
        else:
            action.error = "delivery to in[0] failed: broker down"

    action.on_submit = outage
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3, 4)])
    summary = engine(consumer, action, clock, {0: 5}).run()
    assert summary.ending is Ending.FAILED and "broker down" in (summary.error or "")
    assert consumer.last_commit() == {TP0: 2}


def test_a_dry_run_commits_nothing() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2)])
    summary = engine(consumer, FakeAction(), clock, {0: 3}, dry_run=True).run()
    assert summary.redriven_total == 3 and consumer.commits == []


# ---------------------------------------------------------------------------- rebalances
def test_a_revoked_partition_commits_what_is_settled_and_is_let_go_a_lost_one_commits_nothing() -> None:
    clock = Clock()
    action = FakeAction(auto=False)
    holder: list[Redrive] = []

    def rebalance() -> Fetched:
        action.ack(TP0, 0)
        action.ack(TP1, 0, 1)
        holder[0].on_revoke([TP1])
        holder[0].on_lost([TP0])
        return fetched(TP0, 3)  # queued before the loss: not taken

    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1), fetched(TP1, 0, 1, 2), rebalance])
    e = engine(consumer, action, clock, {0: 5, 1: 5}, assign=(TP0, TP1), assign_timeout_s=2)
    holder.append(e)
    e.run()
    assert ({TP1: 2}, False) in consumer.commits, "revoked: a sync commit of its settled prefix"
    assert all(TP0 not in offsets for offsets, _ in consumer.commits), "lost: nothing committed"
    assert (TP0, 3) not in action.taken and {TP0} in action.forgotten and {TP1} in action.forgotten


def test_a_partition_revoked_during_a_wait_takes_no_more_of_the_run_in_hand() -> None:
    clock = Clock()
    holder: list[Redrive] = []
    consumer = FakeConsumer(clock, [fetched(TP0, 0, 1, 2, 3)])
    action = FakeAction()

    def revoke_once_waiting() -> Fetched:
        holder[0].on_revoke([TP0])
        return Fetched()

    consumer.steps.append(revoke_once_waiting)
    e = engine(consumer, action, clock, {0: 4}, bucket=TokenBucket(1, clock), assign_timeout_s=5)
    holder.append(e)
    e.run()
    assert [o for _, o in action.taken] == [0], "the wait for letter 1 served the revocation"
    assert consumer.last_commit() == {TP0: 1}


# ---------------------------------------------------------------------------- the group kept alive
def test_a_slow_rate_still_consumes_every_half_second_and_keeps_what_arrives_in_order() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, *range(0, 10)), fetched(TP0, *range(10, 20))])
    action = FakeAction()
    summary = engine(consumer, action, clock, {0: 20}, bucket=TokenBucket(2, clock), max_records=10).run()
    assert summary.ending is Ending.END and [o for _, o in action.taken] == list(range(20))
    gaps = [b[0] - a[1] for a, b in zip(consumer.consumed_at, consumer.consumed_at[1:], strict=False)]
    assert clock.now - 1000 >= 9 and max(gaps) <= 0.5 + 1e-6, "consume() at least every 0.5 s"


def test_fetching_pauses_while_a_batch_or_more_waits_and_resumes_when_it_is_handled() -> None:
    clock = Clock()
    consumer = FakeConsumer(clock, [fetched(TP0, *range(n, n + 10)) for n in range(0, 40, 10)])
    action = FakeAction()
    e = engine(consumer, action, clock, {0: 40}, bucket=TokenBucket(2, clock), max_records=10)
    most: list[int] = []
    real_poll = e._poll

    def poll(timeout_s: float) -> None:
        real_poll(timeout_s)
        most.append(e._stashed)

    e._poll = poll  # type: ignore[method-assign]
    e.run()
    assert [o for _, o in action.taken] == list(range(40))
    assert consumer.pauses and consumer.pauses[0] == [TP0], "paused while the stash held over a batch"
    assert consumer.resumes and consumer.resumes[0] == [TP0], "resumed once it was handled"
    assert max(most) == 20, "never more than two batches kept"


# ---------------------------------------------------------------------------- actions
class FakeProducer:
    """Stands in for runtime.kafka.producer.OutputProducer."""

    def __init__(self, fate: Callable[[str, bytes | None], Any] = lambda t, v: None) -> None:
        self.fate = fate
        self.sent: list[dict[str, Any]] = []
        self._reports: list[tuple[Callable[[Any, Any], None] | None, Any]] = []
        self.fatal: str | None = None
        self.deliveries = 0
        self.undelivered: list[Any] | None = None  # as OutputProducer: unknown
        self.discarded = False

    @property
    def broken(self) -> bool:
        return self.fatal is not None

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, headers: Any = None,
                on_delivery: Callable[[Any, Any], None] | None = None, queue_wait_s: float = 30.0,
                partition: int | None = None) -> None:
        self.sent.append({"topic": topic, "value": value, "key": key, "headers": headers,
                          "partition": partition})
        self._reports.append((on_delivery, self.fate(topic, value)))

    def poll(self, timeout_s: float = 0.0) -> None:
        reports, self._reports = self._reports, []
        for cb, err in reports:
            if cb is not None:
                cb(err, None)

    def flush(self, timeout_s: float) -> int:
        self.poll()
        return 0

    def deliver(self, timeout_s: float, beat: Callable[[], None] = lambda: None) -> None:
        self.deliveries += 1
        errors = [err for _, err in self._reports if err is not None]
        self._reports = []
        if errors:
            raise DeliveryFailed(f"delivery failed: {errors[0]}")

    def note(self, err: Any) -> None:
        pass

    def discard(self) -> None:
        self.discarded = True


def letter_of(offset: int, value: bytes = b"v", count: int = 0, source_partition: int = 2) -> Letter:
    original = [("trace", b"t"), ("n", None)] + ([(REDRIVE_COUNT, str(count).encode())] if count else [])
    h = dead_letter_headers(original, error_type="ValueError", message="m", traceback="", topic="in",
                            partition=source_partition, offset=100 + offset, attempts=1, worker="w")
    return read_letter(0, offset, b"k", value, h, (1, 5))


def stored(letter: Letter) -> Stored:
    return Stored(letter.key, letter.value, letter.headers, (1, 5))


def test_to_source_sends_the_original_to_its_partition_with_the_count_raised() -> None:
    producer = FakeProducer()
    action = ToSource(producer, 1.0)  # type: ignore[arg-type]
    one = letter_of(0, count=2)
    action.submit(TP0, one, stored(one))
    assert producer.sent == [{"topic": "in", "value": b"v", "key": b"k", "partition": 2,
                              "headers": [("trace", b"t"), ("n", None), (REDRIVE_COUNT, b"3")]}]
    assert action.poll() == [Outcome(TP0, 0, "ValueError", "in", Result.REDRIVEN)]


def test_to_source_a_refused_copy_is_passed_over_and_an_outage_stops_without_settling() -> None:
    producer = FakeProducer(lambda t, v: CKError(CKError.MSG_SIZE_TOO_LARGE) if v == b"big" else
                            CKError(CKError._MSG_TIMED_OUT) if v == b"away" else None)
    action = ToSource(producer, 1.0)  # type: ignore[arg-type]
    for n, value in enumerate([b"big", b"ok", b"away"]):
        lt = letter_of(n, value)
        action.submit(TP0, lt, stored(lt))
    outcomes = action.settle(1.0)
    assert [(o.offset, o.result) for o in outcomes] == [(0, Result.REFUSED), (1, Result.REDRIVEN)]
    assert action.error is not None and "timed out" in action.error.lower()


class Scripted:
    """A plugin whose process() follows a script: Backoff once, fail values starting with
    b"bad", output the others."""

    def __init__(self, backoffs: int = 0) -> None:
        self.backoffs = backoffs
        self.calls: list[list[bytes | None]] = []

    def process(self, batch: list[Record]) -> list[Any]:
        self.calls.append([r.value for r in batch])
        if self.backoffs:
            self.backoffs -= 1
            raise Backoff(2.0, "downstream away")
        out: list[Any] = []
        for r in batch:
            if (r.value or b"").startswith(b"bad"):
                out.append(Reject(r, "still bad"))
            else:
                out.append(Output(b"out:" + (r.value or b""), key=r.key))
        return out


def through(plugin: Scripted, producer: FakeProducer, waits: list[float],
            stop_after: int = 99) -> ThroughPlugin:
    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return len(waits) < stop_after
    return ThroughPlugin(Plugin("scripted", plugin.process, None, None), RetryPolicy(1, 0, 0),  # type: ignore[arg-type]
                         lambda: producer, "out", DLQ, 1_000_000, 1.0, 100, 0.5, wait,  # type: ignore[arg-type,return-value]
                         version="2.0")


def test_through_the_plugin_outputs_go_out_failures_go_back_with_the_count_and_backoff_waits() -> None:
    plugin, producer, waits = Scripted(backoffs=1), FakeProducer(), []
    action = through(plugin, producer, waits)
    letters = [letter_of(0, b"good", count=1), letter_of(1, b"bad")]
    for lt in letters:
        action.submit(TP0, lt, stored(lt))
    assert action.poll() == [], "a batch waits for more records (or a flush)"
    action.flush_pending()
    assert waits == [2.0], "the plugin's Backoff is waited out"
    assert len(plugin.calls) == 2 and plugin.calls[0] == plugin.calls[1], "then the same batch runs again"
    assert [(o.offset, o.result) for o in action.poll()] == [(0, Result.REDRIVEN), (1, Result.FAILED_AGAIN)]
    out = [s for s in producer.sent if s["topic"] == "out"]
    again = [s for s in producer.sent if s["topic"] == DLQ]
    assert [s["value"] for s in out] == [b"out:good"]
    assert dict(out[0]["headers"])[VERSION_HEADER] == b"2.0", "an output says which code made it"
    assert len(again) == 1 and again[0]["value"] == b"bad"
    h = dict(again[0]["headers"])
    assert h["ringmaster.plugin.version"] == b"2.0", "so does a dead letter"
    assert h[REDRIVE_COUNT] == b"1" and h["ringmaster.error.type"] == b"Rejected" and h["trace"] == b"t"
    assert h["ringmaster.source.offset"] == b"101", "the dead letter still says where the record came from"


def test_through_the_plugin_a_stop_during_a_backoff_settles_nothing() -> None:
    plugin, producer, waits = Scripted(backoffs=5), FakeProducer(), []
    action = through(plugin, producer, waits, stop_after=1)
    lt = letter_of(0)
    action.submit(TP0, lt, stored(lt))
    action.flush_pending()
    assert action.poll() == [] and producer.sent == [] and action.error is None


def test_through_the_plugin_an_outage_stops_the_run_without_settling() -> None:
    plugin, waits = Scripted(), []
    producer = FakeProducer(lambda t, v: CKError(CKError._MSG_TIMED_OUT))
    action = through(plugin, producer, waits)
    lt = letter_of(0)
    action.submit(TP0, lt, stored(lt))
    action.flush_pending()
    assert action.poll() == [] and action.error is not None


def test_through_the_plugin_a_producer_that_broke_is_let_go_of_for_a_new_one() -> None:
    """Its threads and connections go with it (OutputProducer.discard), not at the next run of
    the cyclic collector."""
    plugin, waits = Scripted(), []
    broken = FakeProducer(lambda t, v: CKError(CKError._FENCED))
    broken.fatal = "Local: This instance has been fenced by a newer instance"
    fresh = FakeProducer()
    made = [broken, fresh]
    action = ThroughPlugin(Plugin("scripted", plugin.process, None, None), RetryPolicy(1, 0, 0),  # type: ignore[arg-type]
                           lambda: made.pop(0), "out", DLQ, 1_000_000, 1.0, 100, 0.5,  # type: ignore[arg-type,return-value]
                           lambda s: waits.append(s) or True, version="2.0")
    lt = letter_of(0)
    action.submit(TP0, lt, stored(lt))
    action.flush_pending()
    assert broken.discarded and action._producer is fresh


def test_through_the_plugin_batches_hold_one_source_partition() -> None:
    plugin, producer, waits = Scripted(), FakeProducer(), []
    action = through(plugin, producer, waits)
    for n, part in enumerate([2, 2, 3, 3, 2]):
        lt = letter_of(n, f"v{n}".encode(), source_partition=part)
        action.submit(TP0, lt, stored(lt))
    action.flush_pending()
    assert plugin.calls == [[b"v0", b"v1"], [b"v2", b"v3"], [b"v4"]]


class Mutating(Scripted):
    """Scripted, after changing every record it was given: value to str, an int header,
    another offset and topic (issue 29)."""

    def process(self, batch: list[Record]) -> list[Any]:
        out = super().process(batch)
        for r in batch:
            r.value = (r.value or b"").decode()  # type: ignore[assignment]
            r.headers = [*(r.headers or []), ("added", 7)]  # type: ignore[list-item]
            r.offset, r.topic = r.offset + 1000, "elsewhere"
        return out


def test_through_the_plugin_a_plugin_that_changes_its_records_redrives_and_fails_them_as_read() -> None:
    plugin, producer, waits = Mutating(), FakeProducer(), []
    action = through(plugin, producer, waits)
    letters = [letter_of(0, b"good"), letter_of(1, b"bad")]
    for lt in letters:
        action.submit(TP0, lt, stored(lt))
    action.flush_pending()
    assert [(o.offset, o.result) for o in action.poll()] == [(0, Result.REDRIVEN), (1, Result.FAILED_AGAIN)]
    (again,) = [s for s in producer.sent if s["topic"] == DLQ]
    h = dict(again["headers"])
    assert again["value"] == b"bad" and "added" not in h
    assert h["ringmaster.source.offset"] == b"101" and h["ringmaster.source.topic"] != b"elsewhere"
