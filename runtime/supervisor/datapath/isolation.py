"""Crash isolation: what becomes of a batch whose worker died while running it.

A batch that crashed its worker fewer than ``max_crashes`` times is delivered again as it
is. Then it is bisected: each half goes again (counted one crash short of the limit, so a
half that crashes once more is bisected at once), down to a single record that is
dead-lettered with the cause of death (invariant 8). A record is never dropped: the halves
replace the batch in the partition's offset tracker, and the single record counts as
handled only once its dead letter is acknowledged.

Runs in: supervisor. Pure: the caller applies the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.supervisor.datapath.batches import Batch
from runtime.transport.frames import Columns, batch_head, decode_frame, encode_columns


@dataclass
class Isolation:
    requeue: list[Batch] = field(default_factory=list)  # in offset order
    split: list[tuple[int, int, int]] | None = None  # the tracker's new parts for the batch
    dead_letter: tuple[int, bytes | None, bytes | None, Any] | None = None  # (offset, key, value, headers)


def isolate(batch: Batch, max_crashes: int, next_id: Callable[[], int]) -> Isolation:
    if batch.crashes < max_crashes:
        return Isolation(requeue=[batch])
    frame = decode_frame(batch.frame)
    assert frame is not None
    cols, counts = frame.columns, frame.delivery_counts
    if len(cols) == 1:
        return Isolation(dead_letter=cols.row(0))
    mid = len(cols) // 2
    halves = [_part(batch, cols.slice(0, mid), counts and counts[:mid], next_id(), max_crashes),
              _part(batch, cols.slice(mid, len(cols)), counts and counts[mid:], next_id(), max_crashes)]
    return Isolation(requeue=halves, split=[(h.batch_id, h.first, h.last) for h in halves])


def _part(batch: Batch, cols: Columns, counts: list[int] | None, batch_id: int, max_crashes: int) -> Batch:
    head = batch_head(batch_id, batch.slot, batch.epoch, batch.tp[0], batch.tp[1], counts)
    frame = encode_columns(head, cols)
    return Batch(batch_id, batch.tp, batch.slot, batch.epoch, cols.first, cols.last, len(cols), frame,
                 batch.bucket, crashes=max_crashes - 1, buckets=batch.buckets)
