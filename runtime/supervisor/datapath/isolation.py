"""Crash isolation: what becomes of a batch whose worker died while running it.

A batch that crashed its worker fewer than ``max_crashes`` times is delivered again as it
is. Then it is bisected: each half goes again (counted one crash short of the limit, so a
half that crashes once more is bisected at once), down to a single record that is
dead-lettered with the cause of death (invariant 8). A record is never dropped: the halves
replace the batch in the partition's offset tracker, and the single record counts as
handled only once its dead letter is acknowledged.

In a share group (``singles``) the batch is split into its records at once instead of halved:
each record is under an acquisition lock, and a bisection (a worker's death per level: 35 s
for ~400 records, issue 44) outlived it, the broker handed the records to another member
meanwhile, and both isolated the record: up to four dead letters for one. One record a batch,
the crashing one is found at its next death; the others are accepted as they finish.

Under exactly-once the dead letter is not the supervisor's to write (``letters_batch``): it
goes back into the partition's lane as a one-letter batch in the record's place, and the
worker that runs it writes the letter and commits the offset past the record in one
transaction, fenced like any batch's (docs/exactly-once.md).

Runs in: supervisor. Pure: the caller applies the decision.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.execution.deadletter_format import DeadLetter, reference_dead_letter
from runtime.supervisor.scheduling.batches import Batch
from runtime.tp import TP
from runtime.transport.frames import Columns, batch_head, decode_frame, encode_columns, encode_letters


@dataclass
class Isolation:
    requeue: list[Batch] = field(default_factory=list)  # in offset order
    split: list[tuple[int, int, int]] | None = None  # the tracker's new parts for the batch
    dead_letter: tuple[int, bytes | None, bytes | None, Any] | None = None  # (offset, key, value, headers)
    delivery_count: int | None = None  # a share group's record's, for its dead letter


def isolate(batch: Batch, max_crashes: int, next_id: Callable[[], int], singles: bool = False) -> Isolation:
    """``singles``: split into one batch per record rather than in halves (a share group's)."""
    if batch.crashes < max_crashes:
        return Isolation(requeue=[batch])
    frame = decode_frame(batch.frame)
    assert frame is not None
    cols, counts = frame.columns, frame.delivery_counts
    if len(cols) == 1:
        return Isolation(dead_letter=cols.row(0), delivery_count=counts[0] if counts else None)
    bounds = [(i, i + 1) for i in range(len(cols))] if singles else \
        [(0, len(cols) // 2), (len(cols) // 2, len(cols))]
    parts = [_part(batch, cols.slice(lo, hi), counts and counts[lo:hi], next_id(), max_crashes)
             for lo, hi in bounds]
    return Isolation(requeue=parts, split=[(h.batch_id, h.first, h.last) for h in parts])


def _part(batch: Batch, cols: Columns, counts: list[int] | None, batch_id: int, max_crashes: int) -> Batch:
    head = batch_head(batch_id, batch.slot, batch.epoch, batch.tp[0], batch.tp[1], counts)
    frame = encode_columns(head, cols)
    return Batch(batch_id, batch.tp, batch.slot, batch.epoch, cols.first, cols.last, len(cols), frame,
                 batch.bucket, crashes=max_crashes - 1, buckets=batch.buckets)


# A letter in a LETTERS frame is fitted to the frame limit less this: the frame's own fields
# (topic, offsets) and msgpack's per-field bytes, which fit_dead_letter does not count.
_LETTER_FRAME_MARGIN = 4096

LetterAt = Callable[[int], DeadLetter]  # the letter made to fit a limit in bytes


def letters_batch(batch: Batch, letter_at: LetterAt, max_bytes: int, max_frame: int) -> Batch:
    """The one-record ``batch``'s dead letter as a batch of its own, in its place: same id
    (the tracker completes it when the worker reports the transaction committed), lane, fence
    and offset; the letter fitted as ``fitted_letter_batch`` fits it.

    INVARIANT: its transaction commits the offset after the record, which is right only if
    every record before it is committed by then: the letter batch stands where the record's
    batch stood in the partition's lane, and a lane's batches run one after the other, in
    order, on one worker at a time (scheduler.py, invariant 2), each committing before it
    reports. So only a partition-ordered lane may get one (exactly-once allows no other
    ordering: runtime/config/checks.py, guarantee_problem)."""
    if batch.count != 1 or batch.bucket is not None or batch.buckets is not None:
        raise ValueError("a letter batch stands for one record of a partition-ordered lane")
    return fitted_letter_batch(batch.batch_id, batch.tp, batch.slot, batch.epoch, batch.first, letter_at,
                               max_bytes, max_frame, batch.crashes)


def fitted_letter_batch(batch_id: int, tp: TP, slot: int, epoch: int, offset: int, letter_at: LetterAt,
                        max_bytes: int, max_frame: int, crashes: int = 0) -> Batch:
    """A LETTERS batch whose letter fits both the dead-letter topic (``max_bytes``, its
    producer's message.max.bytes) and a ring's frame (``max_frame``): a frame larger than
    every ring could never be placed, and its partition would wait for it for good. The
    letter of a record near either limit is cut (``ringmaster.value.truncated`` says how
    large the value was); at worst it only says where the record is. The one place both
    kinds of letter batch are fitted: a record that kept crashing workers (results.py) and a
    record set aside at intake (intake.py)."""
    letter = letter_at(min(max_bytes, max_frame - _LETTER_FRAME_MARGIN))
    batch = letter_batch(batch_id, tp, slot, epoch, offset, letter, crashes)
    if len(batch.frame) > max_frame:  # headers fit_dead_letter cannot cut
        batch = letter_batch(batch_id, tp, slot, epoch, offset,
                             reference_dead_letter(letter, tp[0], tp[1], offset), crashes)
    return batch


def letter_batch(batch_id: int, tp: TP, slot: int, epoch: int, offset: int, letter: DeadLetter,
                 crashes: int = 0) -> Batch:
    """A LETTERS batch of one ``letter``, of the record at ``offset`` (the same invariant as
    ``letters_batch``: it must stand in the record's place in a partition-ordered lane)."""
    cols = Columns(offset, None, [letter.key], [letter.value], [list(letter.headers)], 0, [-1])
    frame = encode_letters(batch_id, slot, epoch, tp[0], tp[1], cols)
    return Batch(batch_id, tp, slot, epoch, offset, offset, 1, frame, None, crashes=crashes, letters=True)
