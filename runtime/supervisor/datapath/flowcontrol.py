"""The flow-control room: why each partition must not fetch, and every pause/resume sent to
the client. Runs in: supervisor.

Owns each partition's ``pause`` part (partitions.py): the holds other rooms ask for (through
``hold``/``release``: operator, back-off, delivery, blocked, seeking), its own backpressure
decisions, and what the client was last told. A partition fetches when nothing holds it, it
is not rewinding, and its backlog is within its share.

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
resumed by that step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from runtime.config import WorkerSettings
from runtime.supervisor.datapath.intake import Intake
from runtime.supervisor.partition.partition import HOLDS, Hold, Partition, Partitions, PauseReason
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
    def __init__(self, w: WorkerSettings, consumer: Consumer, partitions: Partitions, intake: Intake,
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

    # ------------------------------------------------------------------ holds (other rooms ask)
    def hold(self, p: Partition, reason: PauseReason, detail: str, until: float | None = None) -> None:
        """Hold the partition (it stops fetching at once) until released or ``until``."""
        assert reason in HOLDS, reason
        old = p.pause.holds.get(reason)
        p.pause.holds[reason] = Hold(reason, detail, until, old.since if old else self.clock())
        self.pause_now(p)

    def release(self, p: Partition, reason: PauseReason) -> bool:
        """True if it was held for this reason (it fetches again at the next reconcile if
        nothing else holds it)."""
        return p.pause.holds.pop(reason, None) is not None

    def pause_now(self, p: Partition) -> None:
        """Stop fetching the partition now (a fence or a hold): not at the next reconcile."""
        if not p.pause.paused:
            p.pause.paused = True
            self.consumer.pause([p.tp])

    def new_partitions(self, parts: list[Partition]) -> None:
        """Runs in: rebalance callback. INVARIANT (4): librdkafka starts every newly assigned
        partition fetching; the runtime's own decision is applied at once, so a member with a
        full backlog, or a paused group, gets no batch because of a rebalance."""
        self.decide(parts)
        paused = [p for p in parts if self._wants_pause(p)]
        for p in paused:
            p.pause.paused = True
        self.consumer.pause([p.tp for p in paused])

    def take_over(self, parts: list[Partition]) -> None:
        """Partitions held over capacity (paused in the client, assignment.py) that now have a
        slot: the same decision as for new ones, and the others resumed at once."""
        self.new_partitions(parts)
        self.consumer.resume([p.tp for p in parts if not p.pause.paused])

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
            pause.flow_paused = wants_flow_pause(pause.flow_paused, backlogs.get(p.tp, 0.0), share,
                                                 self.w.pause_above, self.w.resume_below)
            if self.w.ordering != "partition":
                # Bounded run-ahead: a slow lane lets the others go on only this far past the
                # committed offset, then the partition waits. Half the bound to resume.
                ahead = p.tracker.uncommitted_records + len(p.intake.open_msgs)
                limit = self.w.max_uncommitted_records
                pause.ahead = ahead > limit // 2 if pause.ahead else ahead >= limit

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
        """Expire timed holds, decide, and apply pause/resume; repair what the client lost."""
        now = self.clock()
        for p in self.partitions.values():
            for hold in [h for h in p.pause.holds.values() if h.until is not None and now >= h.until]:
                del p.pause.holds[hold.reason]
                log.info("hold ended; resuming", extra={"tp": p.label, "reason": hold.reason.value})
        self.decide()
        pause: set[TP] = set()
        resume: set[TP] = set()
        for p in self.partitions.values():
            want = self._wants_pause(p)
            if want != p.pause.paused:
                p.pause.paused = want
                (pause if want else resume).add(p.tp)
                if not want:
                    p.pause.last_resume = now
        if now - self._last_reconcile >= _RECONCILE_S:
            self._last_reconcile = now
            for p in self.partitions.values():
                if p.pause.paused:
                    pause.add(p.tp)
                elif (p.intake.eof_at is None and p.tp not in resume
                      and now - p.intake.last_activity >= _RECONCILE_S
                      and now - p.pause.last_resume >= _RECONCILE_S):
                    p.pause.last_resume = now
                    resume.add(p.tp)
        self.consumer.pause(sorted(pause))
        self.consumer.resume(sorted(resume))

    @staticmethod
    def _wants_pause(p: Partition) -> bool:
        return p.pause.flow_paused or p.pause.ahead or p.held

    def pause_all(self) -> None:
        """Shutdown: stop fetching everything."""
        for p in self.partitions.values():
            p.pause.paused = True
        self.consumer.pause(list(self.partitions))
