"""The flow-control room: whether each partition fetches, and every pause/resume sent to the
client. Runs in: supervisor.

Decides each partition's backpressure (the partition keeps the decision, its ``pause`` part:
runtime/supervisor/partition/partition.py) and is the one room that tells the client: pauses
for partitions held (operator, back-off, delivery, blocked, seeking: holds the partitions keep
themselves), over their share of the backlog, too far ahead, rewinding or held over capacity
(the partition table's), and resumes for the rest. A partition fetches when nothing holds it,
it is not rewinding, and its backlog is within its share. ``tests/unit/test_claims.py`` fails
when another module calls the client's pause or resume.

**Backpressure** (invariant 3). The host's budget is ``pause_above`` of all rings together;
a partition's backlog is what was fetched for it and not yet processed, in the supervisor
(records not cut, batches waiting for a ring) and in rings. A partition pauses when its
backlog reaches its fair share of the budget (the budget over the partitions that have a
backlog), and resumes below ``resume_below / pause_above`` of that share: hysteresis, since
a pause makes librdkafka drop what it had prefetched for the partition and fetch it again on
resume. Shares, not one shared pool: a partition that is far behind cannot take the whole
budget and leave the others waiting. ``key``/``unordered`` also bound the records run ahead
of the committed offset (``max_uncommitted_records``): memory, and duplicates after a
rebalance.

**Pause state belongs to the runtime, not to librdkafka** (invariant 4): desired state is
re-applied every second, and a partition that should fetch but has shown no activity for a
second is resumed again (librdkafka#5591, the pause-assign-resume race); holds are never
resumed by that step. Partitions held over capacity are paused again every tick.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from runtime.config import WorkerSettings
from runtime.supervisor.datapath.intake import Intake
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.partition.table import PartitionTable
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer
from runtime.tp import TP

log = logging.getLogger("ringmaster.flowcontrol")

_RECONCILE_S = 1.0  # invariant 4: a runnable partition is fetching again within this
_MAX_RECORDS_PER_TICK = 2_000  # one consume() call, at most: 2-4 ms of the supervisor before it places again
_MIN_RECORDS_PER_TICK = 100  # ... and at least, even with no room (amortises a tick)


def wants_flow_pause(paused: bool, backlog: float, share: float, pause_above: float,
                     resume_below: float) -> bool:
    """The backpressure rule, with hysteresis so a partition does not flap at the threshold:
    pause at ``share``, resume below ``share * resume_below / pause_above``."""
    if paused:
        return backlog > share * resume_below / pause_above
    return backlog >= share


class FlowControl:
    def __init__(self, w: WorkerSettings, consumer: Consumer, partitions: PartitionTable, intake: Intake,
                 scheduler: Scheduler, ring_capacity: int, clock: Callable[[], float]) -> None:
        self.w = w
        self.consumer = consumer
        self.partitions = partitions
        self.intake = intake
        self.scheduler = scheduler
        self.ring_capacity = ring_capacity
        self.budget = self.w.pause_above * ring_capacity * self.w.processes
        self.clock = clock
        self._last_reconcile = 0.0

    # ------------------------------------------------------------------ assignments
    def assigned(self, new: list[Partition], over: list[TP]) -> None:
        """At the loop's rebalance step, for what the group just assigned. INVARIANT (4):
        librdkafka starts every newly assigned partition fetching; the runtime's own decision
        is applied before anything is fetched again, so a member with a full backlog, or a
        paused group, gets no batch because of a rebalance. Partitions held over capacity
        (the table's) must not fetch at all."""
        if over:
            self.consumer.pause(over)
        self.new_partitions(new)

    def new_partitions(self, parts: list[Partition]) -> None:
        """Newly held partitions: paused at once where the runtime wants them paused."""
        self.decide(parts)
        paused = [p for p in parts if p.wants_pause]
        for p in paused:
            p.told(paused=True)
        self.consumer.pause([p.tp for p in paused])

    def take_over(self, parts: list[Partition]) -> None:
        """Partitions held over capacity (paused in the client) that now have a slot: the same
        decision as for new ones, and the others resumed at once."""
        self.new_partitions(parts)
        self.consumer.resume([p.tp for p in parts if not p.pause.paused])

    def pause_held(self) -> None:
        """Partitions just held (an operator's pause) stop fetching now, not at the next
        reconcile: a pause means "stop now"."""
        held = [p for p in self.partitions.values() if p.held and not p.pause.paused]
        for p in held:
            p.told(paused=True)
        if held:
            self.consumer.pause([p.tp for p in held])

    def resize(self, workers: int) -> None:
        """The pool now aims at this many workers (a resize): the host's budget follows."""
        self.budget = self.w.pause_above * self.ring_capacity * workers

    # ------------------------------------------------------------------ backpressure
    def backlog(self, p: Partition) -> float:
        return self.intake.buffered_bytes(p) + self.scheduler.backlog_bytes(p.tp)

    def decide(self, parts: Iterable[Partition] | None = None) -> None:
        """Backpressure decisions for these partitions (all by default)."""
        backlogs = {tp: self.backlog(p) for tp, p in self.partitions.items()}
        busy = sum(1 for b in backlogs.values() if b > 0)
        share = self.budget / max(1, busy)
        for p in self.partitions.values() if parts is None else parts:
            pause = p.pause
            flow_paused = wants_flow_pause(pause.flow_paused, backlogs.get(p.tp, 0.0), share,
                                           self.w.pause_above, self.w.resume_below)
            ahead = pause.ahead
            if self.w.ordering != "partition":
                # Bounded run-ahead: a slow lane lets the others go on only this far past the
                # committed offset, then the partition waits. Half the bound to resume.
                run_ahead = p.tracker.uncommitted_records + len(p.intake.open_msgs)
                limit = self.w.max_uncommitted_records
                ahead = run_ahead > limit // 2 if pause.ahead else run_ahead >= limit
            p.decided(flow_paused, ahead)

    def records_wanted(self) -> int:
        """How many records one consume() may return: up to a batch per assigned partition,
        but not much more than the budget has room for (what comes beyond it waits in the
        supervisor, and a pause makes librdkafka drop what it had prefetched). With 10 KiB
        records a tick of 4,000 records was 20 MB against 8 MiB rings."""
        want = min(_MAX_RECORDS_PER_TICK, self.w.batch_max_records * max(1, len(self.partitions)))
        per_record = self.intake.bytes_per_record
        if per_record:
            backlog = self.scheduler.total_backlog_bytes() + sum(
                self.intake.buffered_bytes(p) for p in self.partitions.values())
            room = max(0.0, self.budget - backlog)
            want = min(want, max(_MIN_RECORDS_PER_TICK, int(room / per_record)))
        return want

    # ------------------------------------------------------------------ the tick
    def reconcile(self) -> None:
        """Pause again what is held over capacity (what the client was told about it is not
        trusted across rebalances, invariant 4); expire timed holds, decide, and apply
        pause/resume; repair what the client lost."""
        if self.partitions.over_capacity:
            self.consumer.pause(list(self.partitions.over_capacity))
        now = self.clock()
        for p in self.partitions.values():
            for hold in p.expire_holds(now):
                log.info("hold ended; resuming", extra={"tp": p.label, "reason": hold.reason.value})
        self.decide()
        pause: set[TP] = set()
        resume: set[TP] = set()
        for p in self.partitions.values():
            want = p.wants_pause
            if want != p.pause.paused:
                p.told(want, None if want else now)
                (pause if want else resume).add(p.tp)
        if now - self._last_reconcile >= _RECONCILE_S:
            self._last_reconcile = now
            for p in self.partitions.values():
                if p.pause.paused:
                    pause.add(p.tp)
                elif (p.intake.eof_at is None and p.tp not in resume
                      and now - p.intake.last_activity >= _RECONCILE_S
                      and now - p.pause.last_resume >= _RECONCILE_S):
                    p.told(False, now)
                    resume.add(p.tp)
        self.consumer.pause(sorted(pause))
        self.consumer.resume(sorted(resume))

    def pause_all(self) -> None:
        """Shutdown: stop fetching everything."""
        for p in self.partitions.values():
            p.told(paused=True)
        self.consumer.pause(list(self.partitions))
