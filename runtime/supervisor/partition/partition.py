"""What the supervisor holds for each assigned partition, in parts that each have one writer.

A :class:`Partition` is a record of parts. Each part is owned by the room that writes it
(as Karafka's Coordinator or franz-go's cursor own theirs); other rooms read it and change
it only by calling the owner. ``tests/unit/test_ownership.py`` fails when a module assigns a
field of a part it does not own.

    part      owner (the one writer)   holds
    fence     assignment.py            the slot and epoch in shared memory; rewinding
    intake    intake.py                fetched records not cut yet (and dropped while rewinding),
                                       offsets seen, batch sizing
    tracker   offsets.py (share groups: acknowledgements.py)
                                       spans (registered by intake, completed by results,
                                       discarded by a rewind): every change a checked method
    pause     flowcontrol.py           holds (why it must not fetch), backpressure, what the
                                       client was told
    stats     results.py               records done, outputs, dead letters, back-offs

Batches cut and waiting for a ring, and batches in rings, are the scheduler's
(scheduler.py): the only room that writes frames to rings.

Pause state belongs to the runtime, not to librdkafka (invariant 4): flow control re-applies
it on every assignment and reconciles it with the client continuously.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# PauseReason lives with the status snapshot (ops reads it too); the rooms name it from here.
from runtime.ops.status import PauseReason as PauseReason
from runtime.supervisor.partition.acknowledgements import AckTracker
from runtime.supervisor.partition.offsets import OffsetTracker
from runtime.tp import TP, tp_label

HOLDS = (PauseReason.OPERATOR, PauseReason.BACKOFF, PauseReason.DELIVERY, PauseReason.BLOCKED,
         PauseReason.SEEKING)


@dataclass(slots=True)
class Hold:
    reason: PauseReason
    detail: str
    until: float | None = None  # clock time it ends by itself; None: until released
    since: float = 0.0


@dataclass(slots=True)
class Fence:
    """Written by assignment.py. The epoch is what workers compare a frame's against before
    running it (invariant 5)."""

    slot: int
    epoch: int
    rewinding: bool = False  # fenced; waiting for its batches out there before reading again


@dataclass(slots=True)
class IntakeState:
    """Written by intake.py: what was fetched for the partition and how it is cut."""

    batch_records: int  # records per frame: batch_max_records, fewer for big or slow records
    open_msgs: list[Any] = field(default_factory=list)  # fetched, not yet cut (runtime.transport.packing.Run)
    open_since: float = 0.0
    bytes_per_record: float = 0.0  # moving average over this partition's packed frames
    us_per_record: float = 0.0  # moving average of plugin time per record (from results)
    next_offset: int | None = None
    dropped_from: int | None = None  # rewinding: the lowest offset fetched and dropped since
    first_offset: int | None = None  # first offset fetched since assignment (lag before any commit)
    eof_at: int | None = None
    behind: int = 0  # records in the log not fetched yet, as of the last Intake.lag()
    last_activity: float = 0.0
    consumed: int = 0
    lane_records: dict[int, int] = field(default_factory=dict)  # key ordering: records per bucket
    hot_key: str | None = None


@dataclass(slots=True)
class PauseState:
    """Written by flowcontrol.py: why the partition must not fetch, and what the client was
    last told (librdkafka's own pause state is not to be trusted across rebalances)."""

    holds: dict[PauseReason, Hold] = field(default_factory=dict)
    flow_paused: bool = False  # backpressure: over its share of the host's backlog
    ahead: bool = False  # key/unordered: too many records past the committed offset
    paused: bool = False  # as last sent to the client
    last_resume: float = 0.0


@dataclass(slots=True)
class Stats:
    """Written by results.py."""

    records_done: int = 0
    outputs: int = 0
    dead_letters: int = 0
    discarded: int = 0
    deferrals: int = 0  # consecutive back-offs / delivery failures (exponential waits)
    done_at: float = 0.0  # clock time of the last batch done


@dataclass(eq=False, slots=True)
class Partition:
    """One assigned partition: its parts, each written by its owner only (module docstring)."""

    tp: TP
    fence: Fence
    intake: IntakeState
    tracker: OffsetTracker
    pause: PauseState
    stats: Stats

    @property
    def label(self) -> str:
        return tp_label(self.tp)

    def hold(self, reason: PauseReason) -> Hold | None:
        return self.pause.holds.get(reason)

    @property
    def held(self) -> bool:
        """Held for a reason (operator, back-off, ...) or rewinding: no batch may be cut or
        dispatched, and it must not fetch."""
        return bool(self.pause.holds) or self.fence.rewinding

    @property
    def blocked(self) -> str | None:
        hold = self.pause.holds.get(PauseReason.BLOCKED)
        return hold.detail if hold else None

    def pause_reasons(self) -> list[PauseReason]:
        reasons = list(self.pause.holds)
        if self.pause.ahead:
            reasons.insert(0, PauseReason.AHEAD)
        if self.pause.flow_paused:
            reasons.insert(0, PauseReason.FLOW)
        return reasons


def new_partition(tp: TP, slot: int, epoch: int, batch_records: int, now: float,
                  share: bool = False) -> Partition:
    """``share``: the partition is read through a share group (its records are acknowledged)."""
    tracker = AckTracker() if share else OffsetTracker()
    return Partition(tp, Fence(slot, epoch), IntakeState(batch_records, last_activity=now), tracker,
                     PauseState(last_resume=now), Stats())


Partitions = dict[TP, Partition]
