"""msgpack encoding of what crosses process boundaries: batch frames on a ring (supervisor →
worker) and result messages on a result pipe (worker → supervisor).

A batch frame is one msgpack array; records are plain arrays, so the supervisor packs a
whole batch with one ``packb`` call and the worker unpacks it with one ``unpackb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from runtime.errors import FrameError

BATCH = 1
STOP = 2

# Result kinds
DONE = 1  # batch handled: outputs and dead letters acknowledged by the broker
FENCED = 2  # batch skipped: its partition was revoked (epoch moved on)
BLOCKED = 3  # a record failed and no dead-letter topic exists: partition stops there
FATAL = 4  # the worker cannot go on (plugin setup failed...): payload says why

# Hostile-input limits for decoding: a frame can never claim more than the ring holds.
_LIMITS = dict(max_str_len=2**31 - 1, max_bin_len=2**31 - 1, max_array_len=10_000_000,
               max_map_len=1_000_000, max_ext_len=0)


@dataclass(slots=True)
class BatchFrame:
    batch_id: int
    slot: int
    epoch: int
    topic: str
    partition: int
    # each record: [offset, key, value, headers | None, timestamp_type, timestamp_ms]
    records: list[list[Any]]


@dataclass(slots=True)
class Result:
    kind: int
    batch_id: int
    slot: int
    epoch: int
    processed: int = 0
    outputs: int = 0
    dead_letters: int = 0
    detail: str = ""


def encode_batch(batch_id: int, slot: int, epoch: int, topic: str, partition: int,
                 records: list[list[Any]]) -> bytes:
    return msgpack.packb([BATCH, batch_id, slot, epoch, topic, partition, records],
                         use_bin_type=True)


STOP_FRAME = msgpack.packb([STOP], use_bin_type=True)


def decode_frame(data: bytes | memoryview) -> BatchFrame | None:
    """Decode a ring frame; None means STOP. Raises FrameError on anything malformed."""
    try:
        obj = msgpack.unpackb(data, raw=False, **_LIMITS)
        if obj[0] == STOP:
            return None
        _, batch_id, slot, epoch, topic, partition, records = obj
        if obj[0] != BATCH or not isinstance(records, list):
            raise ValueError("not a batch frame")
        return BatchFrame(batch_id, slot, epoch, topic, partition, records)
    except (ValueError, TypeError, IndexError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed frame: {exc}") from None


def peek_header(data: bytes | memoryview) -> tuple[int, int, int]:
    """(batch_id, slot, epoch) without decoding the records: used to skip fenced frames
    cheaply, so that revocation time does not grow with how full the ring is."""
    unpacker = msgpack.Unpacker(raw=False, **_LIMITS)
    unpacker.feed(data)
    try:
        n = unpacker.read_array_header()
        kind = unpacker.unpack()
        if kind != BATCH or n != 7:
            return (0, -1, -1)
        return (unpacker.unpack(), unpacker.unpack(), unpacker.unpack())
    except (ValueError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed frame header: {exc}") from None


def encode_result(result: Result) -> bytes:
    return msgpack.packb([result.kind, result.batch_id, result.slot, result.epoch,
                          result.processed, result.outputs, result.dead_letters, result.detail])


def decode_result(data: bytes) -> Result:
    try:
        return Result(*msgpack.unpackb(data, raw=False, **_LIMITS))
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise FrameError(f"malformed result message: {exc}") from None
