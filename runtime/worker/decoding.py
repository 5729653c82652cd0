"""A batch frame's columns back into the plugin's Records: the worker's twin of the
supervisor's packer (runtime/transport/packing.py). The C version (``build_records`` in
runtime/transport/_speedups.c) fills each Record's slots directly; the Python one calls
Record() per record; the first call in each process runs both and compares them
(runtime/transport/speedups.py).

Runs in: a worker (hot path).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any

from runtime.plugin import Record
from runtime.transport import speedups
from runtime.transport.frames import BatchFrame, Columns


def _records_py(topic: str, partition: int, c: Columns) -> list[Record]:
    _check_shape(c)  # as the C version does: one item per record in every column, or an error
    ts_types = repeat(c.ts_types) if isinstance(c.ts_types, int) else c.ts_types
    stamps = zip(ts_types, c.timestamps, strict=False)  # ts_types may be an endless repeat
    return list(map(Record, repeat(topic), repeat(partition), c.offset_list(), c.keys, c.values,
                    repeat(None) if c.headers is None else c.headers, stamps))


def _check_shape(c: Columns) -> None:
    if not isinstance(c.values, list):
        raise ValueError("frame column values is not a list")
    n = len(c.values)
    columns = [("keys", c.keys), ("timestamps", c.timestamps)]
    columns += [(name, col) for name, col in (("offsets", c.offsets), ("headers", c.headers))
                if col is not None]
    if not isinstance(c.ts_types, int):
        columns.append(("timestamp types", c.ts_types))
    for name, col in columns:
        if not isinstance(col, list) or len(col) != n:
            raise ValueError(f"frame column {name} does not hold one item per record")


def _records_c(topic: str, partition: int, c: Columns) -> list[Record]:
    assert speedups.native is not None
    return speedups.native.build_records(  # type: ignore[no-any-return]
        Record, topic, partition, c.first, c.offsets, c.keys, c.values, c.headers, c.ts_types,
        c.timestamps)


def _same_records(a: list[Record], b: list[Record]) -> bool:
    def fields(r: Record) -> tuple[Any, ...]:
        return r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp
    return len(a) == len(b) and all(fields(x) == fields(y) for x, y in zip(a, b, strict=True))


BUILD_RECORDS = speedups.HotPath("build_records", _records_c if speedups.native is not None else None,
                              _records_py, _same_records)


def records_of(frame: BatchFrame) -> list[Record]:
    """Runs in: a worker (hot path). The Records of one batch frame: in C their slots are
    filled directly (~0.1 µs per record); in Python Record() runs per record (~0.3 µs)."""
    records = BUILD_RECORDS.call(frame.topic, frame.partition, frame.columns)
    if frame.delivery_counts is not None:  # a share group's batch
        for r, n in zip(records, frame.delivery_counts, strict=True):
            r.delivery_count = n
    return records


def frame_records(frame: BatchFrame) -> list[Record]:
    """What a worker runs: the records of a batch frame, or the dead letters of a LETTERS
    frame (``letters_of``). ``records_of`` is looked up here at each call, so a test that
    replaces it (tests/plugins/probe.py) reaches every runner, and never a LETTERS frame."""
    return letters_of(frame) if frame.letters else records_of(frame)


def letters_of(frame: BatchFrame) -> list[Record]:
    """The dead letters of a LETTERS frame (runtime/transport/frames.py) as Records, each at
    its record's offset: built by the plain Python builder, not the hot path's C one, so that
    the code between a record that killed its workers and its letter is the least there is."""
    return _records_py(frame.topic, frame.partition, frame.columns)
