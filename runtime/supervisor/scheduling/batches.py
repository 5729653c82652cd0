"""The unit the data path moves: a :class:`Batch`, one frame cut from one lane of a partition.

Intake cuts batches (intake.py); the scheduler queues them in their lanes and places them in
rings (scheduler.py); a dead worker's batches go back to the front of their lanes
(results.py), and one that keeps crashing its worker is split in two (isolation.py).
Runs in: supervisor.
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.tp import TP

Bucket = int | None  # a lane within a partition: a key bucket (key ordering) or None


@dataclass(eq=False, slots=True)
class Batch:
    """A frame cut from one lane of one partition, in offset order. Immutable once cut, but
    for ``crashes`` (results.py: how many workers died running it)."""

    batch_id: int
    tp: TP
    slot: int
    epoch: int
    first: int
    last: int
    count: int
    frame: bytes
    bucket: Bucket
    crashes: int = 0
    # Key ordering: the buckets a frame holds when one frame carries several (a small cut,
    # intake.py); it is in each of their lanes (scheduler.py). None: just ``bucket``.
    buckets: tuple[int, ...] | None = None
    # A LETTERS frame (isolation.py, letters_batch): the dead letter of a record that kept
    # crashing workers, which a worker writes in its transaction; no plugin runs it.
    letters: bool = False
