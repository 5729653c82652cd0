"""Per-partition state owned by the supervisor: owner worker, epoch, the records not yet
cut into a batch, batches waiting for ring room, and the pause decision.

Pause state belongs to the runtime, not to librdkafka (invariant 4): ``paused`` is what
the runtime wants; the supervisor re-applies it on every assignment and reconciles it
with the client continuously.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from runtime.board import EpochTable
from runtime.errors import RingmasterError
from runtime.offsets import OffsetTracker

TP = tuple[str, int]


@dataclass(eq=False, slots=True)
class Batch:
    batch_id: int
    tp: TP
    slot: int
    epoch: int
    first: int
    last: int
    count: int
    frame: bytes
    crashes: int = 0


@dataclass(eq=False)
class PartitionFlow:
    tp: TP
    slot: int
    epoch: int
    worker: int
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    open_msgs: list[Any] = field(default_factory=list)  # fetched, not yet cut (runtime.kafka.Run)
    batch_records: int = 500  # records per frame: batch_max_records, less for big records
    bytes_per_record: float = 0.0  # moving average over this partition's packed frames
    open_since: float = 0.0
    pending: deque[Batch] = field(default_factory=deque)
    paused: bool = False
    blocked: str | None = None
    eof_at: int | None = None
    next_offset: int | None = None
    last_activity: float = 0.0
    last_resume: float = 0.0
    records_done: int = 0
    consumed: int = 0
    outputs: int = 0
    dead_letters: int = 0

    @property
    def label(self) -> str:
        return f"{self.tp[0]}[{self.tp[1]}]"

    @property
    def pending_bytes(self) -> int:
        return sum(len(b.frame) for b in self.pending)

    @property
    def idle(self) -> bool:
        """Nothing of this partition is buffered, queued or unfinished."""
        return not self.open_msgs and not self.pending and self.tracker.unfinished == 0


def wants_pause(flow: PartitionFlow, backlog_fill: float, pause_above: float,
                resume_below: float) -> bool:
    """The pause rule, with hysteresis so a partition does not flap at the threshold.

    ``backlog_fill`` is the worker's ring fill counting the frames that wait for room in it
    (``pending``), as a fraction of the ring: (bytes in the ring + bytes pending) / capacity.

    INVARIANT (3): the supervisor never blocks on a full ring; frames that found no room
    wait in ``pending``, and since they count towards the fill, the pending backlog of a
    worker stays below about ``pause_above`` of its ring (plus one fetch). A small,
    passing overflow does not pause anything: a pause makes librdkafka drop what it had
    prefetched for the partition and fetch it again on resume, which is what made pausing
    on any pending frame slow (mixed 100 B / 10 KiB records: rings empty, partitions
    pausing every few ticks).
    """
    if flow.blocked is not None:
        return True
    if flow.paused:
        return backlog_fill > resume_below
    return backlog_fill >= pause_above


class SlotTable:
    """Hands out epoch-table slots to assigned partitions, and fresh epochs for them.
    Epochs come from one counter, so a reused slot never revives an old frame."""

    def __init__(self, epochs: EpochTable) -> None:
        self._epochs = epochs
        self._free = list(range(epochs.slots - 1, -1, -1))
        self._next_epoch = 1

    def acquire(self) -> int:
        if not self._free:
            raise RingmasterError(f"more than {self._epochs.slots} partitions assigned; "
                                  "raise supervisor.max_partitions")
        return self._free.pop()

    def fence(self, slot: int) -> int:
        epoch = self._next_epoch
        self._next_epoch += 1
        self._epochs.set(slot, epoch)
        return epoch

    def release(self, slot: int) -> None:
        self._free.append(slot)
