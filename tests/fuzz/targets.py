"""Fuzz targets: the C speedups against their Python twins, and the worker's frame decoder
against hostile bytes. Each target takes the fuzzer's bytes, builds a case from them
deterministically (``Source``), runs it, and raises AssertionError when an oracle is broken;
a crash is the process dying. No atheris here: tests/fuzz/run.py drives these targets with
it (coverage-guided), tests/unit/test_speedups_corpus.py replays the kept corpus without it.

Oracles
-------
``pack_frame``  messages as confluent-kafka gives them (any key, value, headers, offsets,
    timestamps; real messages whose header name is not UTF-8, fresh or already touched; and
    containers with a NULL item built with ctypes). The C packer returns or raises, never
    crashes. Where it returns, the Python packer returns the same bytes, the frame decodes,
    and the worker's two record builders agree. Where it raises UnreadableRecord, the first
    faulty message of the run is unreadable and sits at that index, and Python (run on a
    fresh copy of the same records) raises the same. Where it raises anything else, Python
    raises too, or the input held a type no Kafka client returns.
``build_records``  any decoded columns: equal Records, or both raise. Any record type: C
    returns or raises (a type whose slots are not its own is refused).
``frames``  any bytes: ``decode_frame`` returns a frame or None or raises FrameError;
    ``peek_header`` returns three ints or raises FrameError. Nothing else.
"""

from __future__ import annotations

import ctypes
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tests", ROOT / "tests" / "unit"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from confluent_kafka import Message  # noqa: E402

from runtime.errors import FrameError, UnreadableRecord  # noqa: E402
from runtime.kafka.messages import bind_packer  # noqa: E402
from runtime.plugin import Record  # noqa: E402
from runtime.transport import speedups  # noqa: E402
from runtime.transport.frames import BATCH, decode_frame, peek_header  # noqa: E402
from runtime.transport.packing import _pack_run_py, salvage  # noqa: E402
from runtime.worker.decoding import _records_py, _same_records  # noqa: E402

bind_packer()  # the packers pack confluent-kafka's messages, as the daemon's consumer has them


class Source:
    """The fuzzer's bytes as a stream of choices; zeros once they run out (so every input,
    however short, is a case)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def _take(self, n: int) -> bytes:
        chunk = self.data[self.at:self.at + n]
        self.at += n
        return chunk + b"\0" * (n - len(chunk))

    def int(self, lo: int, hi: int) -> int:
        span = hi - lo + 1
        width = max(1, (span.bit_length() + 7) // 8)
        return lo + int.from_bytes(self._take(width), "little") % span

    def bool(self) -> bool:
        return self.int(0, 1) == 1

    def pick(self, options: list[Any]) -> Any:
        return options[self.int(0, len(options) - 1)]

    def bytes(self, max_len: int) -> bytes:
        return self._take(self.int(0, max_len))

    def int64(self) -> int:
        return self.pick([0, -1, 1, 127, 128, 255, 256, -32, -33, -128, -129, 65535, 65536,
                          -32768, -32769, 2**31, -2**31 - 1, 2**32, 2**63 - 1, -2**63,
                          struct.unpack("<q", self._take(8))[0]])


# ---------------------------------------------------------------------------- ctypes NULLs
_api = ctypes.pythonapi
_api.PyTuple_New.restype = ctypes.py_object
_api.PyTuple_New.argtypes = [ctypes.c_ssize_t]
_api.PyList_New.restype = ctypes.py_object
_api.PyList_New.argtypes = [ctypes.c_ssize_t]
_api.Py_IncRef.argtypes = [ctypes.py_object]
_ITEMS = 3 * ctypes.sizeof(ctypes.c_void_p)  # ob_item after refcount, type and size (CPython)


def half_built(kind: str, size: int, fill: dict[int, Any]) -> Any:
    """A tuple or list with NULL where ``fill`` has no item, as a client that failed half-way
    leaves one. Never touch its missing items from Python (only C may look, and must refuse)."""
    obj = (_api.PyTuple_New if kind == "tuple" else _api.PyList_New)(size)
    items = id(obj) + _ITEMS if kind == "tuple" else ctypes.c_void_p.from_address(id(obj) + _ITEMS).value
    for i, v in fill.items():
        _api.Py_IncRef(v)  # the container owns a reference, as PyTuple_SET_ITEM would take it
        ctypes.c_void_p.from_address(items + i * ctypes.sizeof(ctypes.c_void_p)).value = id(v)
    return obj


# ---------------------------------------------------------------------------- messages
class BadPool:
    """Fresh real messages with a header name that is not UTF-8 (their headers() never
    called), consumed from librdkafka's mock cluster in bulk (tests/unit/mockwire.py)."""

    def __init__(self) -> None:
        self._fresh: list[Any] = []
        self.touched: list[Any] = []

    def take(self) -> Any:
        if not self._fresh:
            from mockwire import consumed
            from wire import RawRecord

            self._fresh = consumed([RawRecord(b"bad", b"k", [(b"ok", b"1"), (b"\xff\xfe", b"2")], 7)] * 200)
        return self._fresh.pop()

    def remember(self, msgs: list[Any]) -> None:
        self.touched = (self.touched + msgs)[-50:]


BAD = BadPool()


def _blob(src: Source, foreign: list[bool]) -> Any:
    kind = src.int(0, 9)
    if kind == 0:
        return None
    if kind <= 6:
        return src.bytes(src.pick([0, 31, 40, 300]))
    if kind == 7:
        return b"x" * src.pick([255, 256, 65535, 65536, 70_000])
    foreign.append(True)
    return src.pick(["text", "é" * 40, 7, -2**40, 1.5, True, bytearray(b"ab"), [b"a"], ("t",), {"a": 1},
                     "\udcff", 2**64, Record])


def _headers(src: Source, foreign: list[bool]) -> Any:
    kind = src.int(0, 12)
    if kind <= 3:
        return None
    if kind <= 9:
        out = []
        for _ in range(src.pick([0, 1, 2, 3, 15, 16, 40])):
            name = src.pick(["", "h", "trace-id", "é" * 20, "x" * 300, src.bytes(8).decode("latin-1")])
            out.append((name, None if src.int(0, 3) == 0 else src.bytes(src.pick([0, 8, 300]))))
        return out
    foreign.append(True)
    return src.pick([[("a",)], [("a", b"1", b"2")], [["a", b"1"]], {"a": b"1"}, [("a", "text")], [(1, b"x")],
                     [("\udcff", b"x")], ("a", b"b"), [[[[[[[[[[[b"deep"]]]]]]]]]]], b"raw", 3])


def _message(src: Source, offset: int, foreign: list[bool]) -> Message:
    ts = (src.pick([0, 1, 2, src.int(-2**31, 2**31 - 1)]), src.int64())
    return Message(topic="t", partition=src.int(0, 3), offset=offset, key=_blob(src, foreign),
                   value=_blob(src, foreign), headers=_headers(src, foreign), timestamp=ts)


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # the oracle judges which exceptions are allowed
        return exc


def pack_frame_case(data: bytes) -> None:
    native = speedups.native
    if native is None:
        return
    native.bind(Message, UnreadableRecord)
    src = Source(data)
    n = src.int(1, 24)
    offset = src.pick([0, 5, 2**31, 2**62, 2**63 - 30])
    gaps = src.bool()
    foreign: list[bool] = []
    msgs_c: list[Any] = []
    msgs_py: list[Any] = []
    kinds: list[str] = []  # per message: "" or its fault: unreadable, broken, offset
    for _ in range(n):
        kind = src.int(0, 19)
        if kind == 0:  # a real unreadable record, fresh: each twin gets its own copy
            c_msg, py_msg, fault = BAD.take(), BAD.take(), "unreadable"
        elif kind == 1 and BAD.touched:  # one whose headers() already failed (cached NULL)
            c_msg = py_msg = src.pick(BAD.touched)
            fault = "broken"
        elif kind == 2:  # a half-built headers container
            bad = src.pick([
                lambda: [half_built("tuple", 2, {1: b"v"})],
                lambda: [half_built("tuple", 2, {0: "n"})],
                lambda: half_built("list", src.int(1, 3), {}),
                lambda: [("ok", b"1"), [half_built("list", 2, {0: b"x"})]],
            ])()
            c_msg = py_msg = Message(topic="t", partition=0, offset=offset, key=None, value=b"v",
                                     headers=bad, timestamp=(1, 0))
            fault = "broken"
        elif kind == 3:
            c_msg = py_msg = Message(topic="t", partition=0, offset=-1, value=b"v")  # offset() is None
            fault = "offset"
            foreign.append(True)  # no consumed record has one: Python only checks the run's ends
        else:
            c_msg = py_msg = _message(src, offset, foreign)
            fault = ""
        msgs_c.append(c_msg)
        msgs_py.append(py_msg)
        kinds.append(fault)
        offset = min(offset + (src.int(1, 1000) if gaps else 1), 2**63 - 1)  # the client's int64
    start = src.int(0, n - 1)
    stop = src.int(start + 1, n)
    if src.int(0, 30) == 0:
        start, stop = src.pick([(0, 0), (-1, 1), (0, n + 1), (n, n)])
    heads = [(BATCH, 1, 0, 1, "t", 0), (BATCH, 2**63 - 1, 7, 2**32, "tópico", 2**31 - 1),
             (BATCH, 1, 0, 1, "\udcff", 0), (BATCH, 2**64, 0, 0, "t", 0), ()]
    head = src.pick(heads)
    if head not in heads[:2]:
        foreign.append(True)  # not a head the supervisor writes
    valid = 0 <= start < stop <= n
    faults = [i for i in range(start, stop) if kinds[i]] if valid else []

    c = _outcome(lambda: native.pack_frame(head, msgs_c, start, stop))
    # C reads rows in order and stops at the first faulty one: the real unreadable ones it
    # reached now hold the client's broken cached list (material for "broken" cases).
    reached = range(start, (faults[0] + 1) if faults else stop) if valid else range(0)
    BAD.remember([msgs_c[i] for i in reached if kinds[i] == "unreadable"])

    if isinstance(c, bytes):
        assert valid and not faults, "C packed a run with a faulty record in it"
        assert _pack_run_py(head, msgs_py, start, stop) == c, "the C frame differs from the Python frame"
        _check_frame(c, msgs_c[start:stop], in_contract=not foreign)
        return
    assert isinstance(c, Exception)
    if faults:
        first = faults[0]
        if kinds[first] == "offset":
            assert not isinstance(c, UnreadableRecord), repr(c)
        else:
            assert isinstance(c, UnreadableRecord), f"{kinds[first]} record {first}: C raised {c!r}"
            assert (c.index, c.field) == (first, "headers"), (c.index, c.field, first)
    else:
        assert not isinstance(c, UnreadableRecord), f"C found an unreadable record in a clean run: {c!r}"
    slice_kinds = set(kinds[start:stop]) if valid else set()
    if "broken" in slice_kinds or (not valid and any(kinds)):
        return  # Python is never run over a message whose headers are already broken
    py = _outcome(lambda: _pack_run_py(head, msgs_py, start, stop))
    BAD.remember([msgs_py[i] for i in range(n) if kinds[i] == "unreadable" and msgs_py[i] is not msgs_c[i]])
    assert isinstance(py, Exception) or foreign, f"C raised {c!r} where Python packed a frame"
    if isinstance(c, UnreadableRecord) and kinds[c.index] == "unreadable" and "offset" not in slice_kinds:
        assert isinstance(py, UnreadableRecord) and (py.index, py.field) == (c.index, c.field), repr(py)
        row_c, why_c = salvage(msgs_c[c.index], c)
        row_py, why_py = salvage(msgs_py[py.index], py)
        # The two copies are two records of the pool (their offsets differ), alike in all else.
        assert (row_c[1:], why_c) == (row_py[1:], why_py), (row_c, row_py, why_c, why_py)


def _check_frame(frame: bytes, msgs: list[Any], in_contract: bool) -> None:
    try:
        decoded = decode_frame(frame)
    except FrameError:
        assert not in_contract, "a frame of well-formed messages does not decode"
        return
    assert decoded is not None
    if in_contract:
        for m, off, key, value, ts_type, ts in zip(msgs, decoded.columns.offset_list(), decoded.columns.keys,
                                                   decoded.columns.values, _types(decoded.columns),
                                                   decoded.columns.timestamps, strict=True):
            assert (off, key, value, (ts_type, ts)) == (m.offset(), m.key(), m.value(), m.timestamp())
    build_records_compare(decoded.topic, decoded.partition, decoded.columns)


def _types(c: Any) -> list[int]:
    return [c.ts_types] * len(c) if isinstance(c.ts_types, int) else c.ts_types


def build_records_compare(topic: Any, partition: Any, c: Any, record_type: type = Record) -> None:
    native = speedups.native
    if native is None:
        return
    out_c = _outcome(lambda: native.build_records(record_type, topic, partition, c.first, c.offsets, c.keys,
                                                  c.values, c.headers, c.ts_types, c.timestamps))
    if record_type is not Record:
        assert isinstance(out_c, list | Exception)
        return
    out_py = _outcome(lambda: _records_py(topic, partition, c))
    if isinstance(out_c, Exception) or isinstance(out_py, Exception):
        assert isinstance(out_c, Exception) and isinstance(out_py, Exception), (out_c, out_py)
        return
    assert _same_records(out_c, out_py), "C and Python built different records"


# ---------------------------------------------------------------------------- build_records
class _Columns:
    """Columns as any decoded frame could hold them (no checks: decode_frame's are skipped)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def offset_list(self) -> Any:
        return self.offsets if self.offsets is not None else range(self.first, self.first + len(self.values))

    def __len__(self) -> int:
        return len(self.values)


def _anything(src: Source, depth: int = 0) -> Any:
    kind = src.int(0, 9)
    if kind == 0 or depth > 3:
        return None
    if kind <= 3:
        return src.bytes(12)
    if kind == 4:
        return src.int64()
    if kind == 5:
        return src.pick(["s", "", 1.5, True, 2**70, -2**70])
    if kind == 6:
        return [_anything(src, depth + 1) for _ in range(src.int(0, 3))]
    if kind == 7:
        return {"k": _anything(src, depth + 1)}
    return src.pick([[("h", b"v")], [("h", None), ("", b"")], []])


def _column(src: Source, n: int) -> Any:
    kind = src.int(0, 12)
    if kind <= 8:
        return [_anything(src) for _ in range(n)]
    return src.pick([None, [None] * max(n - 1, 0), [None] * (n + 1), "x" * n, (None,) * n, b"x" * n, 5])


class _Slots:
    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")


class _Copied:
    topic = Record.topic  # a member descriptor of another class: its offsets mean nothing here
    partition, offset, key, value, headers, timestamp = (Record.partition, Record.offset, Record.key,
                                                          Record.value, Record.headers, Record.timestamp)


class _Sub(Record):
    __slots__ = ("extra",)


def build_records_case(data: bytes) -> None:
    src = Source(data)
    n = src.int(0, 20)
    c = _Columns(first=src.pick([0, 7, -5, 2**63 - 1, 2**63 - 3, 2**64 + 3, -2**63, "x", None, 1.5, True]),
                 offsets=None if src.bool() else _column(src, n), keys=_column(src, n),
                 values=([_anything(src) for _ in range(n)] if src.int(0, 9)
                         else src.pick([None, "abc", (1,)])),
                 headers=None if src.bool() else _column(src, n),
                 ts_types=src.pick([0, 1, 2, True, 2**70]) if src.bool() else _column(src, n),
                 timestamps=_column(src, n))
    record_type = src.pick([Record] * 8 + [_Slots, _Copied, _Sub, int, Message])
    topic, partition = src.pick(["t", "", None, 5]), src.pick([0, -1, 2**70, "p"])
    build_records_compare(topic, partition, c, record_type)


# ---------------------------------------------------------------------------- frames
def frames_case(data: bytes) -> None:
    try:
        frame = decode_frame(data)
        assert frame is None or frame.columns is not None
    except FrameError:
        pass
    try:
        head = peek_header(data)
        assert len(head) == 3 and all(type(x) is int for x in head)
    except FrameError:
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "pack_frame": pack_frame_case, "build_records": build_records_case, "frames": frames_case,
}
