"""Per-partition state owned by the supervisor, and the rules that read it.

A **partition flow** is what the supervisor holds for one assigned partition. Its parts
have one writer each (the rooms of the supervisor, see supervisor.py):

* fence (``slot``, ``epoch``) – assignment.py: the epoch in shared memory that workers check;
* intake (``open_msgs``, ``lanes``, ``next_offset``, ...) – intake.py: fetched records and
  the batch frames cut from them, waiting for room in a ring;
* ``tracker`` – registered by intake.py, completed as results and dead letters arrive;
* pause state – ``holds`` (reasons set by the room that found them: operator, back-off,
  delivery, blocked, seeking) and ``flow_paused`` (flowcontrol.py's backpressure decision);
  ``paused`` is what was last applied to the client.

Pause state belongs to the runtime, not to librdkafka (invariant 4): the supervisor
re-applies it on every assignment and reconciles it with the client continuously.

A **lane** is a queue of batch frames bound for one worker's ring: ``partition`` ordering
has one lane (the owner), ``key`` ordering one per worker (records spread by key hash, so
each key stays on one worker, in offset order), ``unordered`` one lane (key ``None``) that
any worker with room takes from.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from runtime.board import EpochTable
from runtime.errors import RingmasterError
from runtime.offsets import OffsetTracker

TP = tuple[str, int]
ANY_WORKER = None  # the lane key of unordered flows

# Hold reasons, by the room that sets them (flow control's own decision is separate).
OPERATOR = "operator"  # `ringmaster pause` (control.py)
BACKOFF = "backoff"  # the plugin raised Backoff
DELIVERY = "delivery"  # outputs or dead letters could not be delivered
BLOCKED = "blocked"  # a record failed and there is no dead-letter topic
SEEKING = "seeking"  # the start offset could not be read yet after a rebalance
FLOW = "flow"  # backpressure: the rings it feeds are full
AHEAD = "uncommitted"  # key/unordered: max_uncommitted_records past the committed offset


def tp_label(tp: TP) -> str:
    return f"{tp[0]}[{tp[1]}]"


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
    lane: int | None  # the worker it must go to; None: any worker (unordered)
    crashes: int = 0


@dataclass(slots=True)
class Hold:
    reason: str
    detail: str
    until: float | None = None  # clock time it ends by itself; None: until released
    since: float = 0.0


@dataclass(eq=False)
class PartitionFlow:
    tp: TP
    slot: int
    epoch: int
    owner: int  # the worker of partition ordering (and of null keys in key ordering)
    tracker: OffsetTracker = field(default_factory=OffsetTracker)
    # intake
    open_msgs: list[Any] = field(default_factory=list)  # fetched, not yet cut (runtime.kafka.Run)
    open_since: float = 0.0
    batch_records: int = 500  # records per frame: batch_max_records, less for big records
    bytes_per_record: float = 0.0  # moving average over this partition's packed frames
    lanes: dict[int | None, deque[Batch]] = field(default_factory=dict)
    next_offset: int | None = None
    first_offset: int | None = None  # first offset fetched since assignment (lag before any commit)
    eof_at: int | None = None
    last_activity: float = 0.0
    last_resume: float = 0.0
    # pause state
    holds: dict[str, Hold] = field(default_factory=dict)
    flow_paused: bool = False  # backpressure: its worker(s) have no room
    ahead: bool = False  # key/unordered: too many records past the committed offset
    paused: bool = False
    rewinding: bool = False  # fenced; waiting for its batches out there before reading again
    rewind_from: int | None = None  # rewinding: the lowest offset fetched and dropped since
    deferrals: int = 0  # consecutive back-offs / delivery failures (exponential waits)
    # counters
    records_done: int = 0
    consumed: int = 0
    outputs: int = 0
    dead_letters: int = 0
    discarded: int = 0
    lane_records: dict[int, int] = field(default_factory=dict)  # key ordering: records per lane
    hot_key: str | None = None

    @property
    def label(self) -> str:
        return tp_label(self.tp)

    def pending(self) -> int:
        return sum(len(q) for q in self.lanes.values())

    def pending_bytes_by_lane(self) -> dict[int | None, int]:
        return {lane: sum(len(b.frame) for b in q) for lane, q in self.lanes.items() if q}

    @property
    def idle(self) -> bool:
        """Nothing of this partition is buffered, queued or unfinished."""
        return not self.open_msgs and not self.pending() and self.tracker.unfinished == 0

    @property
    def blocked(self) -> str | None:
        hold = self.holds.get(BLOCKED)
        return hold.detail if hold else None

    def hold(self, reason: str, detail: str, now: float, until: float | None = None) -> None:
        old = self.holds.get(reason)
        self.holds[reason] = Hold(reason, detail, until, old.since if old else now)

    def release(self, reason: str) -> bool:
        return self.holds.pop(reason, None) is not None

    def expire_holds(self, now: float) -> list[Hold]:
        ended = [h for h in self.holds.values() if h.until is not None and now >= h.until]
        for h in ended:
            del self.holds[h.reason]
        return ended

    def wants_pause(self) -> bool:
        return self.flow_paused or self.ahead or bool(self.holds) or self.rewinding

    def pause_reasons(self) -> list[str]:
        reasons = list(self.holds)
        if self.ahead:
            reasons.insert(0, AHEAD)
        if self.flow_paused:
            reasons.insert(0, FLOW)
        return reasons

    def drop_buffered(self) -> None:
        """Forget fetched records and queued frames (a fence made them stale)."""
        self.open_msgs = []
        for q in self.lanes.values():
            q.clear()


def wants_flow_pause(paused: bool, backlog_fill: float, pause_above: float, resume_below: float) -> bool:
    """The backpressure rule, with hysteresis so a partition does not flap at the threshold.

    ``backlog_fill`` is the fill of the worker(s) the partition feeds, counting the frames
    that wait for room (pending): (bytes in the ring + bytes pending) / capacity.

    INVARIANT (3): the supervisor never blocks on a full ring; frames that found no room
    wait in their lane, and since they count towards the fill, the pending backlog of a
    worker stays below about ``pause_above`` of its ring (plus one fetch). A small,
    passing overflow does not pause anything: a pause makes librdkafka drop what it had
    prefetched for the partition and fetch it again on resume, which is what made pausing
    on any pending frame slow (mixed 100 B / 10 KiB records: rings empty, partitions
    pausing every few ticks).
    """
    if paused:
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


class InFlight:
    """Batches written to a worker's ring and not reported back yet, per worker, in ring
    order. Dispatch adds; results, deaths and releases take away (through these methods)."""

    def __init__(self, workers: int) -> None:
        self._by_worker: list[dict[int, Batch]] = [{} for _ in range(workers)]

    def add(self, worker: int, batch: Batch) -> None:
        self._by_worker[worker][batch.batch_id] = batch

    def pop(self, worker: int, batch_id: int) -> Batch | None:
        return self._by_worker[worker].pop(batch_id, None)

    def take_all(self, worker: int) -> list[Batch]:
        batches = list(self._by_worker[worker].values())
        self._by_worker[worker] = {}
        return batches

    def count(self, worker: int) -> int:
        return len(self._by_worker[worker])

    def has(self, tp: TP) -> bool:
        return any(b.tp == tp for batches in self._by_worker for b in batches.values())

    def contains(self, worker: int, batch_id: int) -> bool:
        return batch_id in self._by_worker[worker]

    def drop_partition(self, tp: TP) -> None:
        """The partition was released: its frames in rings are stale (the worker skips them),
        and a late result of one completes nothing."""
        for batches in self._by_worker:
            for bid in [bid for bid, b in batches.items() if b.tp == tp]:
                del batches[bid]
