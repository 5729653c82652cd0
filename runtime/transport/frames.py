"""msgpack encoding of what crosses process boundaries: batch frames on a ring (supervisor →
worker) and result messages on a result pipe (worker → supervisor).

A batch frame is one msgpack array holding its records column by column:

    [BATCH, batch_id, slot, epoch, topic, partition,        ← header (peek_header reads it)
     first_offset, offsets | nil, keys, values, headers | nil, ts_type | ts_types, timestamps]

Columns, not one array per record, because packing and unpacking cost per msgpack object:
a column of 500 values is one C loop, and the usual cases cost nothing per record at all
(offsets ``nil`` when they run first, first+1, ...; headers ``nil`` when no record has any;
one timestamp type for the whole batch). Measured with 500 × 256 B records: packing rows
of six fields cost ~590 ns/record, this layout ~190 ns in Python and ~0.2 µs with the
supervisor's C packer (runtime/transport/_speedups.c, which writes these exact bytes).

A share group's frame (kafka.group_type = "share") has one header field more, after
``partition``: each record's delivery count (a list, one per record).

A **letters** frame (kind ``LETTERS``, the batch layout) holds dead letters rather than
records, each at the offset of the record it is the letter of: the worker writes them to the
dead-letter topic without calling the plugin (exactly-once, docs/exactly-once.md: the letter
of a record that kills its workers commits with its offset in the worker's transaction).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

import msgpack

from runtime.errors import FrameError

BATCH = 1
STOP = 2
LETTERS = 3
FRAME_FIELDS = 13
SHARE_FRAME_FIELDS = FRAME_FIELDS + 1  # ... with the records' delivery counts (share groups)



class ResultKind(enum.IntEnum):
    """What a worker reports about a batch (an int on the wire)."""

    DONE = 1  # batch handled: outputs and dead letters acknowledged by the broker
    FENCED = 2  # batch skipped: its partition was revoked (epoch moved on)
    BLOCKED = 3  # a record failed and no dead-letter topic exists: partition stops there
    FATAL = 4  # the plugin could not start (import or setup failed): sent only before READY
    DEFERRED = 5  # not done, not failed: try the batch again later (outage, plugin Backoff)
    HELLO = 6  # the plugin started: ``detail`` is its version (sent once, before READY)
    EXHAUSTED = 7  # not done: the worker ran out of a resource (descriptors, memory) and exits


DONE, FENCED, BLOCKED, FATAL, DEFERRED, HELLO, EXHAUSTED = tuple(ResultKind)
# EXHAUSTED causes: a worker that had finished batches before ran out ("worn": its own
# leak, nothing counts against the batch), or one that ran out in its very first ("fresh":
# the batch itself exhausts a new worker, so it counts as a crash and may be isolated).
WORN, FRESH = "worn", "fresh"
# DONE cause: the batch was committed in its own transaction (output.guarantee exactly-once).
COMMITTED = "committed"


class _Limits(TypedDict):
    """msgpack's decoding limits, as keyword arguments it can check by name."""

    max_str_len: int
    max_bin_len: int
    max_array_len: int
    max_map_len: int
    max_ext_len: int


# Hostile-input limits for decoding: a frame can never claim more than the ring holds.
_LIMITS = _Limits(max_str_len=2**31 - 1, max_bin_len=2**31 - 1, max_array_len=10_000_000,
                  max_map_len=1_000_000, max_ext_len=0)

Headers = list[tuple[str, bytes | None]]


@dataclass(slots=True)
class Columns:
    """A batch's records in offset order, column by column."""

    first: int  # offset of the first record
    offsets: list[int] | None  # None: the offsets are first, first+1, ... (no gaps)
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[Headers | None] | None  # None: no record has headers
    ts_types: int | list[int]  # one int: every record has this timestamp type
    timestamps: list[int]

    def __len__(self) -> int:
        return len(self.values)

    def offset_list(self) -> Sequence[int]:
        return self.offsets if self.offsets is not None else range(self.first, self.first + len(self))

    @property
    def last(self) -> int:
        return self.offsets[-1] if self.offsets is not None else self.first + len(self) - 1

    def slice(self, start: int, stop: int) -> Columns:
        offsets = None
        if self.offsets is not None:
            offsets = self.offsets[start:stop]
            if offsets[-1] - offsets[0] + 1 == len(offsets):
                offsets = None  # contiguous after all: the canonical form
        first = self.offset_list()[start]
        ts_types = self.ts_types if isinstance(self.ts_types, int) else self.ts_types[start:stop]
        return Columns(first, offsets, self.keys[start:stop], self.values[start:stop],
                       None if self.headers is None else self.headers[start:stop], ts_types,
                       self.timestamps[start:stop])

    def row(self, i: int) -> tuple[int, bytes | None, bytes | None, Headers | None]:
        """(offset, key, value, headers) of the i-th record."""
        return (self.offset_list()[i], self.keys[i], self.values[i],
                None if self.headers is None else self.headers[i])


@dataclass(slots=True)
class BatchFrame:
    batch_id: int
    slot: int
    epoch: int
    topic: str
    partition: int
    columns: Columns
    delivery_counts: list[int] | None = None  # share groups: each record's, this delivery included
    letters: bool = False  # the columns are dead letters to write, not records to run (LETTERS)


@dataclass(slots=True)
class Result:
    kind: ResultKind
    batch_id: int
    slot: int
    epoch: int
    processed: int = 0
    outputs: int = 0
    dead_letters: int = 0
    detail: str = ""
    cause: str = ""  # DEFERRED: "delivery" or "backoff"; EXHAUSTED: WORN or FRESH; DONE: COMMITTED
    delay_ms: int = -1  # DEFERRED: how long to wait (-1: the supervisor's own back-off)
    scope: str = ""  # DEFERRED: "partition" or "all"
    busy_ms: float = 0.0  # DONE: time the batch took in the worker
    discarded: int = 0  # DONE: outputs with no topic to go to (no [output] topic configured)


def batch_head(batch_id: int, slot: int, epoch: int, topic: str, partition: int,
               delivery_counts: list[int] | None = None) -> tuple[object, ...]:
    """A batch frame's header fields (also what the C packer writes first)."""
    if delivery_counts is not None:
        return (BATCH, batch_id, slot, epoch, topic, partition, delivery_counts)
    return (BATCH, batch_id, slot, epoch, topic, partition)


def encode_columns(head: tuple[object, ...], c: Columns) -> bytes:
    return msgpack.packb([*head, c.first, c.offsets, c.keys, c.values, c.headers, c.ts_types,
                          c.timestamps], use_bin_type=True)


def encode_batch(batch_id: int, slot: int, epoch: int, topic: str, partition: int,
                 columns: Columns) -> bytes:
    return encode_columns(batch_head(batch_id, slot, epoch, topic, partition), columns)


def encode_letters(batch_id: int, slot: int, epoch: int, topic: str, partition: int,
                   columns: Columns) -> bytes:
    """A LETTERS frame: ``columns`` are dead letters, each at its record's offset."""
    return encode_columns((LETTERS, batch_id, slot, epoch, topic, partition), columns)


STOP_FRAME = msgpack.packb([STOP], use_bin_type=True)


def decode_frame(data: bytes | memoryview) -> BatchFrame | None:
    """Decode a ring frame; None means STOP. Raises FrameError on anything malformed, and
    nothing else whatever the bytes (tests/fuzz/targets.py, the ``frames`` target): the fields' shapes are
    checked here, so that the worker builds Records from lists of the right length."""
    try:
        obj = msgpack.unpackb(data, raw=False, **_LIMITS)
        if type(obj) is not list or not obj:
            raise ValueError("not a frame")
        if obj[0] == STOP and len(obj) == 1:
            return None
        kind = obj[0]
        if not ((kind == BATCH and len(obj) in (FRAME_FIELDS, SHARE_FRAME_FIELDS))
                or (kind == LETTERS and len(obj) == FRAME_FIELDS)):
            raise ValueError("not a batch frame")
        counts = obj.pop(6) if len(obj) == SHARE_FRAME_FIELDS else None
        _, batch_id, slot, epoch, topic, partition, first, offsets, keys, values, headers, ts_types, \
            timestamps = obj
        if type(topic) is not str \
                or any(type(x) is not int for x in (batch_id, slot, epoch, partition, first)):
            raise ValueError("a header field of the wrong type")
        if type(values) is not list or not values:
            raise ValueError("no records")
        n = len(values)
        if any(type(col) is not list or len(col) != n for col in (keys, timestamps)) \
                or any(col is not None and (type(col) is not list or len(col) != n)
                       for col in (offsets, headers)) \
                or not (type(ts_types) is int or (type(ts_types) is list and len(ts_types) == n)) \
                or (counts is not None and (type(counts) is not list or len(counts) != n
                                            or any(type(c) is not int for c in counts))):
            raise ValueError("columns of different lengths or types")
        if headers is not None:  # msgpack arrays come back as lists; headers are (name, value) pairs
            # One C-level map per record: pairs are not checked one by one (the worker's hot
            # path; checking each pair's types doubled the cost of decoding headers). Only the
            # supervisor writes frames, from the client's own (str, bytes | None) pairs.
            headers = [None if h is None else list(map(tuple, h)) if type(h) is list else _not_headers(h)
                       for h in headers]
        return BatchFrame(batch_id, slot, epoch, topic, partition,
                          Columns(first, offsets, keys, values, headers, ts_types, timestamps), counts,
                          letters=kind == LETTERS)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed frame: {exc}") from None


def _not_headers(h: object) -> Headers:
    raise ValueError(f"a record's headers are a {type(h).__name__}, not a list of pairs")


def peek_header(data: bytes | memoryview) -> tuple[int, int, int]:
    """(batch_id, slot, epoch) without decoding the records: used to skip fenced frames
    cheaply, so that revocation time does not grow with how full the ring is. (0, -1, -1)
    for a frame that is not a batch (STOP); FrameError for one that is malformed."""
    unpacker = msgpack.Unpacker(raw=False, **_LIMITS)
    unpacker.feed(data)
    try:
        n = unpacker.read_array_header()
        kind = unpacker.unpack()
        if kind not in (BATCH, LETTERS) or n not in (FRAME_FIELDS, SHARE_FRAME_FIELDS):
            return (0, -1, -1)
        head = (unpacker.unpack(), unpacker.unpack(), unpacker.unpack())
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed frame header: {exc}") from None
    if any(type(x) is not int for x in head):
        raise FrameError("malformed frame header: batch id, slot and epoch must be integers")
    return head


def encode_result(result: Result) -> bytes:
    return msgpack.packb([int(result.kind), result.batch_id, result.slot, result.epoch,
                          result.processed, result.outputs, result.dead_letters, result.detail,
                          result.cause, result.delay_ms, result.scope, result.busy_ms,
                          result.discarded])


def decode_result(data: bytes) -> Result:
    try:
        r = Result(*msgpack.unpackb(data, raw=False, **_LIMITS))
        r.kind = ResultKind(r.kind)
        return r
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed result message: {exc}") from None
