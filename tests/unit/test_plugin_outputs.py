"""The output contract of runtime.plugin: what process() may return, what each form becomes,
and the TypeError (naming the type and the fix) for everything outside it. Also Backoff's
own validation."""

from __future__ import annotations

import math
import types
from typing import Any

import pytest

from runtime.plugin import Backoff, Output, Record, Reject, collect_outputs, normalize_output

REC = Record("in", 0, 7, b"k", b"v", None, (1, 0))


# ---------------------------------------------------------------------- accepted forms
@pytest.mark.parametrize(("item", "expected"), [
    (b"raw", Output(b"raw")),
    (bytearray(b"ba"), Output(b"ba")),
    (memoryview(b"mv"), Output(b"mv")),
    ("text é", Output("text é".encode())),
    (("key", "value"), Output(b"value", b"key")),
    ((b"key", b"value"), Output(b"value", b"key")),
    ((None, b"value"), Output(b"value", None)),
    ((b"key", None), Output(None, b"key")),
    ((bytearray(b"k"), memoryview(b"v")), Output(b"v", b"k")),
], ids=["bytes", "bytearray", "memoryview", "str", "str-pair", "bytes-pair", "null-key",
        "tombstone", "buffer-pair"])
def test_each_plain_output_form_normalises_to_an_output(item: Any, expected: Output) -> None:
    out = normalize_output(item)
    assert out == expected
    assert type(out.value) in (bytes, type(None)) and type(out.key) in (bytes, type(None))


def test_an_output_has_its_str_value_and_key_encoded_and_its_topic_kept() -> None:
    out = normalize_output(Output("välue", "kéy", None, "elsewhere"))
    assert out == Output("välue".encode(), "kéy".encode(), None, "elsewhere")


def test_output_headers_may_be_a_list_of_pairs_or_a_dict_and_values_become_bytes() -> None:
    as_list = normalize_output(Output(b"v", headers=[("a", b"1"), ("b", "2"), ("c", None),
                                                     ["d", bytearray(b"4")]]))
    assert as_list.headers == [("a", b"1"), ("b", b"2"), ("c", None), ("d", b"4")]
    as_dict = normalize_output(Output(b"v", headers={"a": b"1", "b": "2", "c": None}))
    assert as_dict.headers == [("a", b"1"), ("b", b"2"), ("c", None)]
    as_tuple = normalize_output(Output(b"v", headers=(("a", b"1"),)))
    assert as_tuple.headers == [("a", b"1")]
    assert normalize_output(Output(b"v", headers=[])).headers == []


def test_a_reject_is_kept_with_its_record_and_its_reason_as_text() -> None:
    out = normalize_output(Reject(REC, 404))  # type: ignore[arg-type]
    assert isinstance(out, Reject) and out.record is REC and out.reason == "404"


@pytest.mark.parametrize("produced", [
    lambda: [b"a", "b", (b"k", b"c")],
    lambda: (x for x in [b"a", "b", (b"k", b"c")]),
    lambda: iter([b"a", "b", (b"k", b"c")]),
    lambda: ({b"a": 1} | {"b": 2} | {(b"k", b"c"): 3}).keys(),
], ids=["list", "generator", "iterator", "dict-keys"])
def test_collect_outputs_takes_any_iterable_of_outputs(produced: Any) -> None:
    """Each a fresh one per run: a generator in the parameters would be spent after one."""
    assert collect_outputs(produced()) == [Output(b"a"), Output(b"b"), Output(b"c", b"k")]


def test_collect_outputs_of_none_or_an_empty_iterable_is_nothing() -> None:
    assert collect_outputs(None) == []
    assert collect_outputs([]) == []
    assert collect_outputs(x for x in ()) == []


# ---------------------------------------------------------------------- refused: returned whole
@pytest.mark.parametrize("returned", [
    "text", {"k": "v"}, 3, 2.5, True, b"bytes", bytearray(b"ba"), memoryview(b"mv"),
    Output(b"v"), Reject(REC, "r"), object(),
], ids=["str", "dict", "int", "float", "bool", "bytes", "bytearray", "memoryview", "Output", "Reject",
        "object"])
def test_a_single_value_returned_whole_is_a_type_error_naming_its_type_and_the_fix(returned: Any) -> None:
    with pytest.raises(TypeError) as caught:
        collect_outputs(returned)
    message = str(caught.value)
    assert f"process() returned {type(returned).__name__};" in message
    assert "return an iterable of outputs" in message and "or None" in message


# ---------------------------------------------------------------------- refused: items
@pytest.mark.parametrize(("item", "named"), [
    ({"k": "v"}, "dict"), (7, "int"), (1.5, "float"), (None, "NoneType"),
    ((b"k", b"v", b"x"), "a tuple of 3"), ((b"v",), "a tuple of 1"), ([b"k", b"v"], "list"),
])
def test_an_item_outside_the_contract_is_a_type_error_naming_it_and_the_accepted_forms(item: Any,
                                                                                        named: str) -> None:
    with pytest.raises(TypeError) as caught:
        collect_outputs([b"fine", item])
    message = str(caught.value)
    assert f"process() yielded {named};" in message
    assert "expected bytes, str, a (key, value) tuple, Output or Reject" in message


@pytest.mark.parametrize(("item", "fragments"), [
    (Output({"a": 1}), ["Output.value must be bytes, str or None, not dict", "json.dumps"]),  # type: ignore[arg-type]
    (Output(b"v", key=7), ["Output.key must be bytes, str or None, not int", "serialise it first"]),  # type: ignore[arg-type]
    (Output(b"v", headers="x"), ["Output.headers must be a list of (name, value) pairs, not str"]),  # type: ignore[arg-type]
    (Output(b"v", headers=[("a",)]), ["each header must be a (str, bytes) pair", "('a',)"]),  # type: ignore[list-item]
    (Output(b"v", headers=[(1, b"x")]), ["each header must be a (str, bytes) pair", "(1, b'x')"]),  # type: ignore[list-item]
    (Output(b"v", headers=[("a", 5)]), ["the value of header 'a' must be bytes, str or None, not int"]),  # type: ignore[list-item]
    (Output(b"v", topic=""), ["Output.topic must be a non-empty str or None, not ''"]),
    (Output(b"v", topic=3), ["Output.topic must be a non-empty str or None, not 3"]),  # type: ignore[arg-type]
    (Reject("x", "why"), ["Reject.record must be the input Record, not str"]),  # type: ignore[arg-type]
    ((b"k", {"v": 1}), ["the value of a (key, value) output must be bytes, str or None, not dict"]),
    ((7, b"v"), ["the key of a (key, value) output must be bytes, str or None, not int"]),
], ids=["value-dict", "key-int", "headers-str", "header-1-tuple", "header-int-name", "header-int-value",
        "topic-empty", "topic-int", "reject-str", "pair-dict-value", "pair-int-key"])
def test_a_malformed_output_is_a_type_error_that_says_what_is_wrong(item: Any, fragments: list[str]) -> None:
    with pytest.raises(TypeError) as caught:
        normalize_output(item)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_one_bad_item_fails_the_whole_collection() -> None:
    seen = []

    def gen() -> Any:
        for x in (b"a", 7, b"c"):
            seen.append(x)
            yield x

    with pytest.raises(TypeError):
        collect_outputs(gen())
    assert seen == [b"a", 7], "collection stops at the bad item"


# ---------------------------------------------------------------------- Backoff
def test_backoff_carries_its_wait_scope_and_reason() -> None:
    b = Backoff(2, "db down", scope="all")
    assert (b.seconds, b.delay_s, b.scope, b.reason, b.cause) == (2.0, 2.0, "all", "db down", "backoff")
    assert "2" in Backoff(2).reason and Backoff(0).seconds == 0.0
    assert Backoff(1).scope == "partition"


@pytest.mark.parametrize("scope", ["topic", "", "ALL", None])
def test_backoff_refuses_an_unknown_scope(scope: Any) -> None:
    with pytest.raises(ValueError, match="scope"):
        Backoff(1, scope=scope)


@pytest.mark.parametrize("seconds", [-1, -0.001, math.nan])
def test_backoff_refuses_a_negative_or_nan_wait(seconds: float) -> None:
    with pytest.raises(ValueError, match="seconds"):
        Backoff(seconds)


@pytest.mark.parametrize("seconds", [math.inf, 1e300], ids=["inf", "1e300"])
def test_an_endless_backoff_is_refused_or_deferred_but_never_crashes_the_worker(seconds: float) -> None:
    from runtime.plugin import Plugin
    from runtime.transport.board import BOARD_BYTES, Board
    from runtime.transport.frames import DEFERRED, BatchFrame, Columns, encode_result
    from runtime.worker.batch_runner import BatchRunner
    from runtime.worker.spec import WorkerSpec

    try:
        endless = Backoff(seconds, "wait for the operator")
    except ValueError:
        return  # refused up front: fine
    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1)

    def process(batch: Any) -> None:
        raise endless

    board = Board(memoryview(bytearray(BOARD_BYTES)))
    producer = types.SimpleNamespace(broken=False)
    runner = BatchRunner(Plugin("p", process, None, None), spec, board, producer)  # type: ignore[arg-type]
    frame = BatchFrame(1, 0, 1, "in", 0, Columns(0, None, [None], [b"v"], None, 0, [0]))
    result = runner.run(frame)
    assert result.kind == DEFERRED
    encode_result(result)  # what the worker sends next must be encodable too


class _Producer:
    """Accepts every output (the delivery path without a broker)."""

    broken = False

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes]] = []

    def produce(self, topic: str, value: bytes, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
        self.produced.append((topic, value))

    def deliver(self, timeout_s: float, beat: Any = None) -> None:
        pass


@pytest.mark.parametrize(("inputs", "route", "warned"), [
    (("in",), "in", True), (("^rx\\..*",), "rx.retry", True), (("in",), "elsewhere", False),
    (("^rx\\.in$",), "rx.retry", False)])
def test_an_output_routed_into_an_input_topic_is_delivered_with_one_warning_per_topic(
        caplog: pytest.LogCaptureFixture, inputs: tuple[str, ...], route: str, warned: bool) -> None:
    """Issue 17.7: a plugin's Output(topic=...) into a topic the group reads is allowed (a
    deliberate re-queue) and named once per worker and topic, never per record."""
    from runtime.plugin import Output, Plugin
    from runtime.transport.board import BOARD_BYTES, Board
    from runtime.transport.frames import DONE, BatchFrame, Columns
    from runtime.worker.batch_runner import BatchRunner
    from runtime.worker.spec import WorkerSpec

    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1,
                      input_topics=inputs)

    def process(batch: Any) -> Any:
        return [Output(b"again", topic=route) for _ in batch]

    producer = _Producer()
    runner = BatchRunner(Plugin("p", process, None, None), spec, Board(memoryview(bytearray(BOARD_BYTES))),
                         producer)  # type: ignore[arg-type]
    frame = BatchFrame(1, 0, 1, "in", 0, Columns(0, None, [None, None], [b"v", b"w"], None, 0, [0, 0]))
    with caplog.at_level("WARNING", logger="ringmaster.worker"):
        assert runner.run(frame).kind == DONE
        assert runner.run(frame).kind == DONE
    assert producer.produced == [(route, b"again")] * 4, "delivered, not refused"
    loops = [r for r in caplog.records if "routes outputs into a topic this group reads" in r.getMessage()]
    assert len(loops) == (1 if warned else 0)


class _Bytes(bytes):
    """A bytes subclass: not the fast path's exact type, normalized to plain bytes."""


def test_collect_outputs_gives_what_normalize_output_gives_item_by_item() -> None:
    """collect_outputs takes exact bytes on a fast path: the same Outputs as the checked one."""
    items: list[Any] = [b"raw", _Bytes(b"sub"), bytearray(b"ba"), "s", (b"k", b"v"), Output(b"o", b"k")]
    collected = collect_outputs(items)
    assert collected == [normalize_output(i) for i in items]
    assert all(type(o.value) is bytes for o in collected if isinstance(o, Output))
