"""Consumed messages into batch frames: runs of one partition, split by key, packed column
by column (runtime/transport/frames.py). Runs in: supervisor (hot path).

The transport knows no Kafka client. The adapter binds the client's message type once, when
a consumer is made (``bind(Message)``, runtime/kafka/messages.py): its no-argument methods
``offset``, ``key``, ``value``, ``headers`` and ``timestamp`` are all the packer uses, from
Python or from C (runtime/transport/_speedups.c calls them through the type's method table).

A record whose fields the client cannot give (confluent-kafka raises ``SystemError`` from
``headers()`` for a header name that is not UTF-8, and caches a list holding a tuple whose
name is NULL) makes both packers raise UnreadableRecord naming its index in the run; the
supervisor packs the rest of the run around it and dead-letters what ``salvage`` can still
read of it. INVARIANT: after a field method failed on a message, nothing here calls it in a
way that could touch the broken object again (``salvage`` checks every item first).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any
from zlib import crc32

from runtime.errors import UnreadableRecord
from runtime.transport import speedups
from runtime.transport.frames import Columns, Headers, batch_head, encode_columns

log = logging.getLogger(__name__)

# A run of consumed messages of one partition in offset order. Outside the adapter the
# messages are opaque: use offset_of, fields_of and pack_run.
Run = list[Any]


def _unbound(_m: Any) -> Any:
    raise RuntimeError("runtime.transport.packing: no message type bound "
                       "(runtime.kafka.messages.bind_packer)")


_offset: Callable[[Any], int] = _unbound
_key: Callable[[Any], bytes | None] = _unbound
_value: Callable[[Any], bytes | None] = _unbound
_headers: Callable[[Any], Headers | None] = _unbound
_timestamp: Callable[[Any], tuple[int, int]] = _unbound


def _native_pack(message_type: type) -> Callable[..., bytes] | None:
    if speedups.native is None:
        return None
    try:
        speedups.native.bind(message_type, UnreadableRecord)
    except TypeError as exc:  # a client whose message methods are not plain C methods
        log.warning("C frame packer unavailable", extra={"why": str(exc)})
        return None
    return speedups.native.pack_frame  # type: ignore[no-any-return]


def bind(message_type: type) -> None:
    """Pack messages of this type (called once by the Kafka adapter)."""
    global _offset, _key, _value, _headers, _timestamp
    _offset, _key, _value = message_type.offset, message_type.key, message_type.value  # type: ignore[attr-defined]
    _headers, _timestamp = message_type.headers, message_type.timestamp  # type: ignore[attr-defined]
    PACK.use_c(_native_pack(message_type))


def offset_of(m: Any) -> int:
    return _offset(m)


def split_by_key(msgs: Run, lanes: int, null_lane: int) -> dict[int, Run]:
    """Key ordering: a run's messages by lane, each lane in offset order. A key's lane is a
    stable hash of its bytes (CRC-32: the same on every host and after every restart);
    records without a key stay together on null_lane, in partition order."""
    out: dict[int, Run] = {}
    for m, k in zip(msgs, map(_key, msgs), strict=True):
        lane = null_lane if k is None else crc32(k) % lanes
        bucket = out.get(lane)
        if bucket is None:
            out[lane] = [m]
        else:
            bucket.append(m)
    return out


def keys_of(msgs: Run) -> list[bytes | None]:
    return list(map(_key, msgs))


def fields_of(m: Any) -> tuple[int, bytes | None, bytes | None, Headers | None]:
    """(offset, key, value, headers) of one message: for the rare record the supervisor
    handles itself (dead-lettering one that fits in no ring)."""
    return _offset(m), _key(m), _value(m), _headers(m)


Row = tuple[int, bytes | None, bytes | None, Headers | None]


def salvage(m: Any, why: UnreadableRecord) -> tuple[Row, str]:
    """Runs in: supervisor (rare). What can still be read of a record a packer found
    unreadable, and a sentence saying what could not: ((offset, key, value, headers), why).

    The headers are read again only through ``_intact_headers``: confluent-kafka returns
    the list it cached on the failed call, which holds a tuple with a NULL item that any
    ordinary access would dereference. The offset must be readable (it is a C integer in
    every client); without it the record could not be placed, and that error propagates."""
    offset = _offset(m)
    lost: list[str] = []
    key = _read_or_none(_key, m, "key", lost)
    value = _read_or_none(_value, m, "value", lost)
    try:
        raw = _headers(m)
    except Exception:  # the first call's failure again, or a client that does not cache
        try:
            raw = _headers(m)
        except Exception:
            raw = None
            lost.append("headers")
    headers, broken = _intact_headers(raw)
    what = f"the Kafka client cannot read this record's {why.field}"
    names = _undecodable_names(why)
    if broken:
        total = len(raw) if isinstance(raw, list) else len(broken)
        positions = ", ".join(str(i + 1) for i in broken[:10]) + (" ..." if len(broken) > 10 else "")
        what += f": header{'s' if len(broken) > 1 else ''} {positions} of {total}"
        what += " (a name that is not UTF-8" + (f": {', '.join(names)})" if names else ")")
        what += f"; the other {len(headers or [])} kept" if headers else ""
    else:
        what += f" ({why.cause})" if not names else f" (a name that is not UTF-8: {', '.join(names)})"
    if lost:
        what += f"; also unreadable: {', '.join(lost)}"
    return (offset, key, value, headers), what


def _read_or_none(fn: Callable[[Any], Any], m: Any, field: str, lost: list[str]) -> Any:
    try:
        v = fn(m)
    except Exception:
        lost.append(field)
        return None
    if v is None or type(v) is bytes:
        return v
    lost.append(field)
    return None


def _intact_headers(raw: Any) -> tuple[Headers | None, list[int]]:
    """(the (name, value) pairs that are whole, positions of the broken ones). An item of a
    list or tuple that the client left NULL is invisible to gc.get_referents() (it visits
    only what is there), so comparing counts finds one without touching it."""
    if raw is None:
        return None, []
    if type(raw) is not list or len(gc.get_referents(raw)) != len(raw):
        return None, list(range(len(raw))) if isinstance(raw, list) else [0]
    kept: Headers = []
    broken: list[int] = []
    for i, pair in enumerate(raw):  # every item is there (checked above)
        if type(pair) is tuple and len(pair) == 2 and len(gc.get_referents(pair)) == 2:
            name, value = pair
            if type(name) is str and (value is None or type(value) is bytes):
                kept.append((name, value))
                continue
        broken.append(i)
    return (kept or None), broken


def _undecodable_names(exc: BaseException) -> list[str]:
    """The raw bytes of header names the client could not decode, from the error chain
    (UnicodeDecodeError keeps the bytes it failed on), as repr() for a log or a header."""
    out: list[str] = []
    for e in _chain(exc):
        if isinstance(e, UnicodeDecodeError) and isinstance(e.object, bytes):
            shown = repr(e.object[:64]) + ("..." if len(e.object) > 64 else "")
            if shown not in out:
                out.append(shown)
    return out[:5]


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and every cause and context behind it (bounded, cycles cut)."""
    todo: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while todo and len(seen) < 32:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo += [e.__context__, e.__cause__]


_ts_type, _ts_ms = itemgetter(0), itemgetter(1)


def _column(fn: Callable[[Any], Any], msgs: Run, field: str, base: int) -> list[Any]:
    """fn over the run. A failing message raises UnreadableRecord naming it (its index is how
    far the list got: list.extend keeps what it appended) without calling fn on it again."""
    out: list[Any] = []
    try:
        out.extend(map(fn, msgs))
    except Exception as exc:
        # The client's own error, as the C packer reports it (not SystemError's wrapper).
        root: BaseException = exc
        while root.__cause__ is not None and root.__cause__ is not exc:
            root = root.__cause__
        raise UnreadableRecord(base + len(out), field, f"{type(root).__name__}: {root}") from exc
    return out


def columns_of(msgs: Run, base: int = 0) -> Columns:
    """A run's records as frame columns. The canonical forms (no offsets when contiguous,
    no headers when none, one timestamp type when shared) are the C packer's too. Raises
    UnreadableRecord (index ``base`` + position) for a record the client cannot read."""
    read_offsets: list[int] = _column(_offset, msgs, "offset", base)
    first = read_offsets[0]
    # Offsets in a run strictly increase, so equal ends mean no gaps.
    offsets = None if read_offsets[-1] - first + 1 == len(read_offsets) else read_offsets
    read_headers: list[Headers | None] = _column(_headers, msgs, "headers", base)
    headers = None if read_headers.count(None) == len(read_headers) else read_headers
    stamps = _column(_timestamp, msgs, "timestamp", base)
    types = list(map(_ts_type, stamps))
    ts_types: int | list[int] = types[0] if types.count(types[0]) == len(types) else types
    return Columns(first, offsets, _column(_key, msgs, "key", base), _column(_value, msgs, "value", base),
                   headers, ts_types, list(map(_ts_ms, stamps)))


def _pack_run_py(head: tuple[Any, ...], msgs: Run, start: int, stop: int) -> bytes:
    if not 0 <= start < stop <= len(msgs):  # as the C version: a slice would quietly clip it
        raise IndexError("empty or out-of-range run")
    return encode_columns(head, columns_of(msgs[start:stop], start))


# An unreadable record is the input's fault, raised alike by both twins: it passes through
# (C stays in use, and Python is never run again over a message whose method failed).
PACK = speedups.HotPath("pack_frame", None, _pack_run_py, why_python="no message type bound yet",
                        input_faults=(UnreadableRecord,))


def pack_run(batch_id: int, slot: int, epoch: int, topic: str, partition: int, msgs: Run,
             start: int, stop: int, delivery_counts: list[int] | None = None) -> bytes:
    """Runs in: supervisor (hot path). msgs[start:stop] as one batch frame (runtime.transport.frames):
    in C, about 0.2 µs per record; in Python, about 0.8 µs. Raises UnreadableRecord (its
    ``index`` in msgs) for a record the client cannot read: pack around it."""
    head = batch_head(batch_id, slot, epoch, topic, partition, delivery_counts)
    return PACK.call(head, msgs, start, stop)

