"""The C speedups (runtime/transport/_speedups.c) against their pure-Python twins: the same
frame bytes from the same consumed messages, the same Records from the same frame, and a safe
fall-back to Python when the C side fails or disagrees."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import UnreadableRecord
from runtime.kafka.messages import bind_packer
from runtime.plugin import Record
from runtime.transport import speedups
from runtime.transport.frames import BATCH, decode_frame
from runtime.transport.packing import _pack_run_py
from runtime.worker.decoding import _records_c, _records_py, _same_records

bind_packer()  # the packer packs confluent-kafka's messages, as the daemon's consumer has it

HEAD = (BATCH, 41, 3, 9, "topic-é", 5)

needs_c = pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")


def test_the_extension_is_built_where_the_tests_run() -> None:
    """CI must exercise the C paths: a silently missing extension would leave them untested."""
    if os.environ.get("RINGMASTER_NO_SPEEDUPS"):
        pytest.skip("RINGMASTER_NO_SPEEDUPS is set")
    assert speedups.native is not None, f"runtime._speedups: {speedups.native_status}"


headers = st.one_of(st.none(), st.lists(st.tuples(st.text(max_size=8),
                                                  st.one_of(st.none(), st.binary(max_size=8))),
                                        max_size=3))
blob = st.one_of(st.none(), st.binary(max_size=40), st.binary(min_size=300, max_size=70_000))
record = st.tuples(blob, blob, headers, st.sampled_from([0, 1, 2]),
                   st.integers(min_value=-2**63, max_value=2**63 - 1))


@st.composite
def runs(draw: Any) -> list[Message]:
    recs = draw(st.lists(record, min_size=1, max_size=40))
    offset = draw(st.integers(min_value=0, max_value=2**62))
    gaps = draw(st.booleans())
    out = []
    for key, value, hdrs, ts_type, ts in recs:
        out.append(Message(topic="topic-é", partition=5, offset=offset, key=key, value=value,
                           headers=hdrs, timestamp=(ts_type, ts)))
        offset += draw(st.integers(min_value=1, max_value=1000)) if gaps else 1
    return out


@needs_c
@settings(max_examples=300, deadline=None)
@given(runs(), st.data())
def test_c_frames_are_the_python_frames_byte_for_byte(msgs: list[Message], data: Any) -> None:
    assert speedups.native is not None
    speedups.native.bind(Message, UnreadableRecord)
    start = data.draw(st.integers(min_value=0, max_value=len(msgs) - 1))
    stop = data.draw(st.integers(min_value=start + 1, max_value=len(msgs)))
    frame = speedups.native.pack_frame(HEAD, msgs, start, stop)
    assert frame == _pack_run_py(HEAD, msgs, start, stop)
    decoded = decode_frame(frame)
    assert decoded is not None and decoded.batch_id == 41 and (decoded.slot, decoded.epoch) == (3, 9)
    records = _records_c(decoded.topic, decoded.partition, decoded.columns)
    assert _same_records(records, _records_py(decoded.topic, decoded.partition, decoded.columns))
    for r, m in zip(records, msgs[start:stop], strict=True):
        assert (r.topic, r.partition, r.offset, r.key, r.value, r.timestamp) == \
            (m.topic(), m.partition(), m.offset(), m.key(), m.value(), m.timestamp())
        assert r.headers == m.headers()


@needs_c
def test_pack_frame_refuses_what_is_not_a_message_run() -> None:
    assert speedups.native is not None
    speedups.native.bind(Message, UnreadableRecord)
    with pytest.raises(TypeError):
        speedups.native.pack_frame(HEAD, [object()], 0, 1)
    with pytest.raises(IndexError):
        speedups.native.pack_frame(HEAD, [], 0, 0)


@needs_c
def test_build_records_refuses_a_type_without_plain_slots() -> None:
    class NotSlots:
        topic = partition = offset = key = value = headers = timestamp = None

    assert speedups.native is not None
    with pytest.raises(TypeError):
        speedups.native.build_records(NotSlots, "t", 0, 0, None, [None], [b"v"], None, 0, [0])


def test_a_failing_c_path_falls_back_to_python_for_good(caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def broken(x: int) -> int:
        calls.append("c")
        raise TypeError("unexpected input")

    path = speedups.HotPath("demo", broken, lambda x: x * 2)
    with caplog.at_level(logging.WARNING, logger="ringmaster.speedups"):
        assert path.call(21) == 42 and path.call(1) == 2
    assert calls == ["c"] and not path.in_c and "unexpected input" in str(path.why_python)
    assert sum("C speedup disabled" in r.message for r in caplog.records) == 1


def test_a_c_path_that_disagrees_is_dropped_on_first_use() -> None:
    path = speedups.HotPath("demo", lambda x: x + 1, lambda x: x * 2)
    assert path.call(3) == 6, "the Python result wins"
    assert not path.in_c
    agreeing = speedups.HotPath("demo", lambda x: x * 2, lambda x: x * 2)
    assert agreeing.call(3) == 6 and agreeing.in_c


def test_records_are_built_the_same_without_the_extension() -> None:
    code = ("from runtime.kafka.messages import bind_packer; bind_packer(); "
            "from runtime.transport import speedups, packing; "
            "from runtime.worker import decoding; "
            "assert speedups.native is None and not packing.PACK.in_c and not decoding.BUILD_RECORDS.in_c; "
            "print(speedups.native_status)")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RINGMASTER_NO_SPEEDUPS="1"),
                         capture_output=True, text=True, check=True)
    assert "RINGMASTER_NO_SPEEDUPS" in out.stdout


def test_python_records_match_the_contract() -> None:
    msgs = [Message(topic="t", partition=1, offset=7, key=None, value=b"x", headers=[("h", None)],
                    timestamp=(1, 5))]
    frame = decode_frame(_pack_run_py((BATCH, 1, 0, 1, "t", 1), msgs, 0, 1))
    assert frame is not None
    (r,) = _records_py("t", 1, frame.columns)
    assert isinstance(r, Record) and (r.offset, r.key, r.value, r.headers, r.timestamp) == \
        (7, None, b"x", [("h", None)], (1, 5))


def test_an_extension_built_from_older_source_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install not rebuilt after a pull: its module lacks functions this code calls.
    Python is used, and the status says why (it used to fail later with an AttributeError)."""
    import types

    stale = types.ModuleType("runtime.transport._speedups")
    for name in ("bind", "pack_frame", "build_records"):
        setattr(stale, name, lambda *a: None)
    import runtime.transport

    monkeypatch.setitem(sys.modules, "runtime.transport._speedups", stale)
    monkeypatch.setattr(runtime.transport, "_speedups", stale, raising=False)
    monkeypatch.delenv("RINGMASTER_NO_SPEEDUPS", raising=False)
    native, status = speedups._load()
    assert native is None
    assert "older source" in status and "load_acquire" in status and "copy_records" in status
