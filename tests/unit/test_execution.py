"""runtime.execution.run.run_batch: the failure model of one batch (invariant 8).

Retries, then bisection down to the records at fault; SystemExit / KeyboardInterrupt /
a wrong return type / a refused output are failures of the records; a deferral (the
plugin's Backoff, an outage) is nobody's fault and leaves run_batch untouched."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest

from runtime.errors import DeliveryFailed, OutputRejected
from runtime.execution.run import (
    COPY_RECORDS,
    PHASE_CALL,
    PHASE_DELIVER,
    PHASE_IDLE,
    PHASE_WAIT,
    Outcome,
    RetryPolicy,
    _copy_records_py,
    copy_records,
    run_batch,
)
from runtime.plugin import Backoff, Output, Plugin, Record, Reject
from runtime.transport import speedups

POLICY = RetryPolicy(max_attempts=2, backoff_s=0, backoff_max_s=0)


def no_sleep(_s: float) -> None:
    return None


def records(n: int, first: int = 0) -> list[Record]:
    return [Record("in", 0, first + i, f"k{first + i}".encode(), f"v{first + i}".encode(), None, (1, 0))
            for i in range(n)]


class Spy:
    """A plugin whose process() records every call (the offsets it saw) and maps each record
    through ``per_record``; ``on_call`` may raise or replace the whole return value."""

    def __init__(self, per_record: Callable[[Record], Any] | None = None,
                 on_call: Callable[[list[int]], Any] | None = None) -> None:
        self.calls: list[list[int]] = []
        self.per_record = per_record or (lambda r: b"out-" + r.value)
        self.on_call = on_call

    def process(self, batch: Sequence[Record]) -> Iterable[Any] | None:
        offsets = [r.offset for r in batch]
        self.calls.append(offsets)
        if self.on_call is not None:
            replaced = self.on_call(offsets)
            if replaced is not None:
                return replaced
        return [self.per_record(r) for r in batch]

    def plugin(self) -> Plugin:
        return Plugin("spy", self.process, None, None)


def run(spy: Spy, batch: list[Record], **kw: Any) -> Outcome:
    kw.setdefault("sleep", no_sleep)
    return run_batch(spy.plugin(), batch, POLICY, "w-test", **kw)


def output_values(outcome: Outcome) -> list[bytes | None]:
    return sorted(o.value for o in outcome.outputs_before())  # type: ignore[type-var]


def raise_on(offset: int, exc: BaseException) -> Callable[[list[int]], None]:
    def on_call(offsets: list[int]) -> None:
        if offset in offsets:
            raise exc
    return on_call


# ---------------------------------------------------------------------- isolation
def test_a_record_whose_processing_raises_is_isolated_and_every_other_record_keeps_its_output() -> None:
    spy = Spy(on_call=raise_on(5, ValueError("bad record five")))
    outcome = run(spy, records(10))
    assert [f.record.offset for f in outcome.failures] == [5]
    failure = outcome.failures[0]
    assert failure.error_type == "ValueError"
    assert failure.message == "bad record five"
    assert "ValueError: bad record five" in failure.traceback and "Traceback" in failure.traceback
    assert failure.attempts == POLICY.max_attempts
    assert output_values(outcome) == sorted(f"out-v{i}".encode() for i in range(10) if i != 5)
    assert not outcome.stopped_early
    # The single record was really tried on its own, max_attempts times.
    assert spy.calls.count([5]) == POLICY.max_attempts


def test_a_batch_that_succeeds_on_retry_has_no_failures_and_is_not_bisected() -> None:
    attempts = []

    def flaky(offsets: list[int]) -> None:
        attempts.append(offsets)
        if len(attempts) == 1:
            raise RuntimeError("transient")

    spy = Spy(on_call=flaky)
    outcome = run(spy, records(4))
    assert outcome.failures == []
    assert spy.calls == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert outcome.output_count == 4


@pytest.mark.parametrize("code", [0, 3, None, "bye"])
def test_sys_exit_in_a_plugin_fails_the_batch_instead_of_killing_the_worker(code: Any) -> None:
    def exits(offsets: list[int]) -> None:
        if 2 in offsets:
            sys.exit(code)

    outcome = run(Spy(on_call=exits), records(4))  # must not raise SystemExit
    assert [f.record.offset for f in outcome.failures] == [2]
    f = outcome.failures[0]
    assert f.error_type == "SystemExit"
    assert f.message == f"plugin code called sys.exit({code!r})"
    assert output_values(outcome) == [b"out-v0", b"out-v1", b"out-v3"]


def test_keyboard_interrupt_in_a_plugin_counts_as_a_failure_of_the_record() -> None:
    outcome = run(Spy(on_call=raise_on(1, KeyboardInterrupt())), records(3))
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(1, "KeyboardInterrupt")]
    assert f"{outcome.failures[0].message}" == "KeyboardInterrupt()", "an empty message shows the repr"
    assert output_values(outcome) == [b"out-v0", b"out-v2"]


def test_an_exception_while_iterating_a_generator_fails_the_records_like_one_from_process() -> None:
    def gen(batch: Sequence[Record]) -> Iterable[bytes]:
        for r in batch:
            if r.offset == 3:
                raise LookupError("no such thing")
            yield r.value or b""

    outcome = run_batch(Plugin("gen", gen, None, None), records(6), POLICY, sleep=no_sleep)
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(3, "LookupError")]
    assert outcome.output_count == 5


# ---------------------------------------------------------------------- deferral
@pytest.mark.parametrize("deferral", [Backoff(5, "downstream down"), DeliveryFailed("broker away"),
                                      Backoff(1, scope="all")])
def test_a_deferral_from_the_plugin_leaves_run_batch_untouched(deferral: Exception) -> None:
    spy = Spy(on_call=raise_on(0, deferral))
    phases: list[int] = []
    with pytest.raises(type(deferral)) as caught:
        run(spy, records(4), phase=phases.append)
    assert caught.value is deferral
    assert spy.calls == [[0, 1, 2, 3]], "a deferral is not retried nor bisected"
    assert phases[-1] == PHASE_IDLE


@pytest.mark.parametrize("deferral", [Backoff(2), DeliveryFailed("outage")])
def test_a_deferral_raised_in_the_middle_of_a_bisection_still_propagates(deferral: Exception) -> None:
    # Record 6 fails: the batch is bisected. The right half's first call meets a deferral.
    def on_call(offsets: list[int]) -> None:
        if len(spy.calls) > POLICY.max_attempts and offsets[0] == 4:
            raise deferral
        if 6 in offsets:
            raise ValueError("bad six")

    spy = Spy(on_call=on_call)
    delivered: list[list[Output]] = []
    with pytest.raises(type(deferral)) as caught:
        run(spy, records(8), deliver=delivered.append)
    assert caught.value is deferral
    assert spy.calls == [[0, 1, 2, 3, 4, 5, 6, 7]] * 2 + [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(delivered) == 1, "only the left half had been delivered when the deferral came"


# ---------------------------------------------------------------------- delivery
def test_deliver_is_called_once_per_successful_call_with_that_calls_outputs() -> None:
    spy = Spy(on_call=raise_on(1, ValueError("x")))
    delivered: list[list[Output]] = []
    outcome = run(spy, records(4), deliver=delivered.append)
    # calls: [0..3] x2 fail, [0,1] x2 fail, [0] ok, [1] x2 fail, [2,3] ok
    assert spy.calls == [[0, 1, 2, 3]] * 2 + [[0, 1]] * 2 + [[0]] + [[1]] * 2 + [[2, 3]]
    assert [[o.value for o in outs] for outs in delivered] == [[b"out-v0"], [b"out-v2", b"out-v3"]]
    assert [(last, [o.value for o in outs]) for last, outs in outcome.outputs] == \
        [(0, [b"out-v0"]), (3, [b"out-v2", b"out-v3"])]


def test_an_output_the_broker_refuses_fails_the_record_that_produced_it() -> None:
    def deliver(outputs: list[Output]) -> None:
        if any(o.value == b"out-v2" for o in outputs):
            raise OutputRejected("the output to 'out' was refused: Broker: Message size too large")

    spy = Spy()
    outcome = run(spy, records(5), deliver=deliver)
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(2, "OutputRejected")]
    assert "Message size too large" in outcome.failures[0].message
    assert output_values(outcome) == [b"out-v0", b"out-v1", b"out-v3", b"out-v4"]
    assert spy.calls.count([2]) == POLICY.max_attempts


def test_a_delivery_outage_propagates_out_of_run_batch() -> None:
    outage = DeliveryFailed("delivery failed: out: Local: Message timed out")

    def deliver(outputs: list[Output]) -> None:
        raise outage

    spy = Spy()
    with pytest.raises(DeliveryFailed) as caught:
        run(spy, records(3), deliver=deliver)
    assert caught.value is outage
    assert spy.calls == [[0, 1, 2]], "an outage is not retried inside run_batch"


# ---------------------------------------------------------------------- stop at first failure
def test_stop_at_first_failure_runs_nothing_after_the_failing_record() -> None:
    spy = Spy(on_call=raise_on(5, ValueError("bad five")))
    outcome = run(spy, records(10), stop_at_first_failure=True)
    assert outcome.stopped_early
    assert [f.record.offset for f in outcome.failures] == [5]
    final = spy.calls.index([5]) + POLICY.max_attempts - 1
    assert spy.calls[final] == [5]
    assert spy.calls[final + 1:] == [], "records after the failing one were run once it was known"
    assert [6] not in spy.calls and [7, 8, 9] not in spy.calls, "the right halves never ran"
    first = outcome.first_failure
    assert first is not None and first.record.offset == 5
    assert sorted(o.value for o in outcome.outputs_before(first.record.offset)) == \
        [f"out-v{i}".encode() for i in range(5)]  # type: ignore[type-var]


def test_stop_at_first_failure_does_not_run_the_right_half_after_a_reject() -> None:
    def per_record(r: Record) -> Any:
        return Reject(r, "no good") if r.offset == 1 else b"ok"

    spy = Spy(per_record=per_record, on_call=raise_on(6, ValueError("six")))
    outcome = run(spy, records(8), stop_at_first_failure=True)
    # [0..7] x2 fail (6), bisect: [0..3] returns a Reject of 1 -> stop; [4..7] never runs.
    assert spy.calls == [list(range(8))] * 2 + [[0, 1, 2, 3]]
    assert outcome.stopped_early
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(1, "Rejected")]
    assert outcome.outputs_before(1) == [], "outputs of the rejecting call are not before offset 1"


def test_without_stop_at_first_failure_every_record_runs() -> None:
    spy = Spy(on_call=raise_on(0, ValueError("zero")))
    outcome = run(spy, records(4))
    assert not outcome.stopped_early
    assert [2, 3] in spy.calls
    assert output_values(outcome) == [b"out-v1", b"out-v2", b"out-v3"]


# ---------------------------------------------------------------------- Reject
def test_rejected_items_become_failures_and_the_rest_of_the_call_goes_on() -> None:
    def per_record(r: Record) -> Any:
        return Reject(r, f"invalid {r.offset}") if r.offset in (1, 3) else r.value

    spy = Spy(per_record=per_record)
    delivered: list[list[Output]] = []
    outcome = run(spy, records(5), deliver=delivered.append)
    assert spy.calls == [[0, 1, 2, 3, 4]], "a Reject is not an exception: no retry, no bisection"
    assert [(f.record.offset, f.error_type, f.message, f.attempts) for f in outcome.failures] == \
        [(1, "Rejected", "invalid 1", 1), (3, "Rejected", "invalid 3", 1)]
    assert [[o.value for o in outs] for outs in delivered] == [[b"v0", b"v2", b"v4"]]


# ---------------------------------------------------------------------- phases
def test_phases_follow_the_plugin_the_broker_and_the_retry_waits() -> None:
    events: list[Any] = []

    def on_call(offsets: list[int]) -> None:
        events.append(("call", offsets))
        if offsets == [0, 1] and sum(1 for e in events if e == ("call", [0, 1])) == 1:
            raise RuntimeError("once")

    def deliver(outputs: list[Output]) -> None:
        events.append("deliver")

    def sleep(s: float) -> None:
        events.append(("sleep", s))

    policy = RetryPolicy(max_attempts=2, backoff_s=0.25, backoff_max_s=1)
    run_batch(Spy(on_call=on_call).plugin(), records(2), policy, deliver=deliver,
              phase=events.append, sleep=sleep)
    assert events == [PHASE_CALL, ("call", [0, 1]), PHASE_WAIT, ("sleep", 0.25),
                      PHASE_CALL, ("call", [0, 1]), PHASE_DELIVER, "deliver", PHASE_IDLE]


def test_retry_waits_double_up_to_the_cap_and_restart_for_each_half() -> None:
    sleeps: list[float] = []
    policy = RetryPolicy(max_attempts=4, backoff_s=1, backoff_max_s=3)
    spy = Spy(on_call=raise_on(0, ValueError("zero")))
    run_batch(spy.plugin(), records(2), policy, sleep=sleeps.append)
    # [0,1]: 1, 2, 3 ; [0]: 1, 2, 3 ; [1] succeeds at once
    assert sleeps == [1, 2, 3, 1, 2, 3]


def test_the_phase_ends_idle_even_when_a_deferral_escapes() -> None:
    phases: list[int] = []
    with pytest.raises(Backoff):
        run(Spy(on_call=raise_on(0, Backoff(1))), records(1), phase=phases.append)
    assert phases == [PHASE_CALL, PHASE_IDLE]


# ---------------------------------------------------------------------- wrong return types
@pytest.mark.parametrize("returned", ["a string", {"k": "v"}, 0], ids=["str", "dict", "int"])
def test_a_wrong_return_type_fails_every_record_of_the_batch_as_a_type_error(returned: Any) -> None:
    spy = Spy(on_call=lambda offsets: returned)
    outcome = run(spy, records(3))
    assert [f.record.offset for f in outcome.failures] == [0, 1, 2]
    assert {f.error_type for f in outcome.failures} == {"TypeError"}
    assert all(type(returned).__name__ in f.message for f in outcome.failures)
    assert outcome.output_count == 0


@pytest.mark.parametrize("returned", ["a string", {"k": "v"}, 0], ids=["str", "dict", "int"])
def test_a_wrong_return_type_for_one_record_is_isolated_to_exactly_that_record(returned: Any) -> None:
    spy = Spy(on_call=lambda offsets: returned if 2 in offsets else None)
    # None from on_call: fall through to the normal outputs
    outcome = run(spy, records(5))
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(2, "TypeError")]
    assert "process() returned" in outcome.failures[0].message
    assert output_values(outcome) == [b"out-v0", b"out-v1", b"out-v3", b"out-v4"]


def test_a_wrong_item_type_is_a_type_error_naming_the_item() -> None:
    spy = Spy(per_record=lambda r: 42 if r.offset == 1 else r.value)
    outcome = run(spy, records(3))
    assert [(f.record.offset, f.error_type) for f in outcome.failures] == [(1, "TypeError")]
    assert "process() yielded int" in outcome.failures[0].message


# ---------------------------------------------------------------------- known gaps
def test_a_plugin_that_consumes_its_batch_list_in_place_still_gets_every_record_handled() -> None:
    def drain(batch: list[Record]) -> list[bytes]:
        out = []
        while batch:
            out.append(batch.pop(0).value or b"")
        return out

    batch = records(4)
    outcome = run_batch(Plugin("drain", drain, None, None), batch, POLICY, sleep=no_sleep)  # type: ignore[arg-type]
    assert outcome.failures == []
    assert sorted(o.value for o in outcome.outputs_before()) == [b"v0", b"v1", b"v2", b"v3"]  # type: ignore[type-var]


# ---------------------------------------------------------------------- found by mutation testing
def test_a_batch_is_tried_exactly_max_attempts_times_before_it_is_bisected() -> None:
    spy = Spy(on_call=raise_on(5, ValueError("boom")))
    outcome = run(spy, records(1, first=5))
    assert spy.calls == [[5], [5]], "max_attempts (2) calls, no more"
    (failure,) = outcome.failures
    assert failure.attempts == 2


def test_a_dead_letter_from_the_worker_says_where_the_record_was_and_who_failed_it() -> None:
    spy = Spy(on_call=raise_on(5, ValueError("boom")))
    (failure,) = run(spy, records(1, first=5)).failures
    letter = failure.dead_letter("worker-1.2", 1_000_000, plugin_version="3.0")
    h = dict(letter.headers)
    assert (letter.key, letter.value) == (b"k5", b"v5")
    assert h["ringmaster.source.topic"] == b"in" and h["ringmaster.source.partition"] == b"0"
    assert h["ringmaster.source.offset"] == b"5" and h["ringmaster.attempts"] == b"2"
    assert h["ringmaster.worker"] == b"worker-1.2" and h["ringmaster.plugin.version"] == b"3.0"
    assert h["ringmaster.error.type"] == b"ValueError"


def test_outputs_before_a_failing_record_are_those_of_records_before_it_only() -> None:
    spy = Spy(on_call=raise_on(3, ValueError("boom")))
    outcome = run(spy, records(6), stop_at_first_failure=True)
    assert outcome.first_failure is not None and outcome.first_failure.record.offset == 3
    assert sorted(o.value for o in outcome.outputs_before(3)) == [b"out-v0", b"out-v1", b"out-v2"]  # type: ignore[type-var]


# ---------------------------------------------------------------------- records the plugin changes (issue 29)
def with_headers(batch: list[Record]) -> list[Record]:
    for r in batch:
        r.headers = [("trace", b"t%d" % r.offset)]
    return batch


def mutate_all(batch: Sequence[Record]) -> None:
    """Everything a careless plugin does to what it was given, before it fails on offset 5."""
    for r in batch:
        r.value = json_like(r.value)  # type: ignore[assignment]
        r.key = None
        r.headers.append(("int", 7))  # type: ignore[union-attr, arg-type]
        r.offset, r.topic, r.partition = 0, "elsewhere", 99
    if any(r.value == "v5" for r in batch):
        raise ValueError("bad record five")


def json_like(v: bytes | None) -> str:
    return (v or b"").decode()


def test_a_plugin_that_changes_its_records_changes_nothing_the_runtime_knows() -> None:
    seen: list[list[tuple[Any, ...]]] = []

    def process(batch: list[Record]) -> list[bytes]:
        seen.append([(r.topic, r.partition, r.offset, r.key, r.value, list(r.headers or [])) for r in batch])
        mutate_all(batch)
        batch[0] = Record("x", 9, 9, None, None, None, (0, 0))  # replaces a list item too
        return [b"ok"]

    originals = with_headers(records(8))
    outcome = run_batch(Plugin("mutant", process, None, None), originals, POLICY, sleep=no_sleep)  # type: ignore[arg-type]
    # Every call, retries and bisection halves included, saw the bytes and coordinates read from Kafka.
    for call in seen:
        for topic, partition, offset, key, value, headers in call:
            assert (topic, partition, key, value, headers) == \
                ("in", 0, b"k%d" % offset, b"v%d" % offset, [("trace", b"t%d" % offset)])
    (failure,) = outcome.failures  # only the poison record: no good record dead-lettered
    assert failure.record is originals[5] and failure.error_type == "ValueError"
    letter = failure.dead_letter("worker-0.1", 1_000_000)
    h = dict(letter.headers)
    assert (letter.key, letter.value) == (b"k5", b"v5")
    assert h["trace"] == b"t5" and "int" not in h
    source = [h[f"ringmaster.source.{f}"] for f in ("topic", "partition", "offset")]
    assert source == [b"in", b"0", b"5"]
    assert [(r.topic, r.offset, r.value, r.headers) for r in originals] == \
        [("in", i, b"v%d" % i, [("trace", b"t%d" % i)]) for i in range(8)], "the caller's records untouched"


def test_a_reject_of_a_changed_record_dead_letters_the_record_as_read() -> None:
    def process(batch: list[Record]) -> list[Any]:
        out: list[Any] = []
        for r in batch:
            r.value = json_like(r.value)  # type: ignore[assignment]
            r.offset += 1000
            r.headers = [("n", 1)]  # type: ignore[list-item]
            out.append(Reject(r, "no") if r.value == "v2" else r.value.encode())  # type: ignore[union-attr]
        return out

    batch = records(4)
    outcome = run_batch(Plugin("mutant", process, None, None), batch, POLICY, sleep=no_sleep)  # type: ignore[arg-type]
    (failure,) = outcome.failures
    assert failure.record is batch[2] and failure.error_type == "Rejected"
    letter = failure.dead_letter("w", 1_000_000)
    assert letter.value == b"v2" and dict(letter.headers)["ringmaster.source.offset"] == b"2"


def test_a_reject_of_a_record_not_in_the_call_fails_the_call_as_a_type_error() -> None:
    stranger = Record("in", 0, 2, b"k", b"forged", None, (0, 0))

    def process(batch: list[Record]) -> list[Any]:
        return [Reject(stranger, "not mine") if r.offset == 2 else r.value for r in batch]

    outcome = run_batch(Plugin("forger", process, None, None), records(4), POLICY, sleep=no_sleep)  # type: ignore[arg-type]
    (failure,) = outcome.failures
    assert failure.record.value == b"v2" and failure.error_type == "TypeError"
    assert "Reject.record must be one of the records" in failure.message
    assert sorted(o.value for o in outcome.outputs_before()) == [b"v0", b"v1", b"v3"]  # type: ignore[type-var]


@pytest.mark.parametrize("version", ["c", "python"])
def test_copies_are_new_objects_with_equal_fields_and_headers_of_their_own(version: str) -> None:
    originals = with_headers(records(3)) + records(1, first=3)
    if version == "c":
        if speedups.native is None:
            pytest.skip("the C speedups are not built")
        copies = speedups.native.copy_records(Record, originals)
    else:
        copies = _copy_records_py(Record, originals)
    for c, r in zip(copies, originals, strict=True):
        assert c is not r and type(c) is Record
        assert (c.topic, c.partition, c.offset, c.key, c.value, c.headers, c.timestamp) == \
            (r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp)
        assert c.headers is None or c.headers is not r.headers


def test_the_plugins_copies_come_from_c_where_it_is_built() -> None:
    if speedups.native is None:
        pytest.skip("the C speedups are not built")
    copy_records(records(2))
    assert COPY_RECORDS.in_c, COPY_RECORDS.why_python


def test_copying_a_record_with_an_unset_field_fails_alike_in_c_and_python() -> None:
    hollow = Record.__new__(Record)
    with pytest.raises(AttributeError):
        _copy_records_py(Record, [hollow])
    if speedups.native is not None:
        with pytest.raises(AttributeError):
            speedups.native.copy_records(Record, [hollow])
