"""The rebalance story: what happens when the group gives this member partitions, takes them
back, or says they are lost. Runs in: rebalance callbacks, which librdkafka runs inside
``consume()`` on the supervisor's thread (and in shutdown, which is a revocation of
everything).

It coordinates rooms and owns no partition state: the rooms act (assignment fences and
forgets, results applies what workers report while we wait, commits commits), and none of
them calls back into another, so a rebalance cannot re-enter a room half-way.

**Revocation is bounded and fenced** (invariant 5): fence (a new epoch in shared memory:
workers skip every frame of the old one), wait only for the batches in progress, commit what
is done, forget; a worker that will not let go within ``revoke_timeout_s`` is killed. Its
time does not grow with how full the rings are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic

from runtime.supervisor.control.operator import OperatorHolds
from runtime.supervisor.datapath.assignment import Assignment
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.flowcontrol import FlowControl
from runtime.supervisor.datapath.results import Results
from runtime.supervisor.group.caught_up import CaughtUp
from runtime.supervisor.group.commits import Committer
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import H, Handle
from runtime.supervisor.workers.workforce import Workforce
from runtime.tp import TP

log = logging.getLogger("ringmaster.rebalance")


class Rebalance(Generic[H]):
    def __init__(self, revoke_timeout_s: float, assignment: Assignment, flow: FlowControl,
                 operator: OperatorHolds, results: Results[H], commits: Committer, caught_up: CaughtUp,
                 scheduler: Scheduler, workforce: Workforce[H], handles: Sequence[H],
                 desk: DeadLetterDesk | None, clock: Callable[[], float]) -> None:
        self.revoke_timeout_s = revoke_timeout_s
        self.assignment = assignment
        self.flow = flow
        self.operator = operator
        self.results = results
        self.commits = commits
        self.caught_up = caught_up
        self.scheduler = scheduler
        self.workforce = workforce
        self.handles = handles
        self.desk = desk
        self.clock = clock
        self.revocations: list[dict[str, Any]] = []  # the last 100, for status and tests
        self._timings: list[float] = []  # seconds each release took, not yet taken (take_timings)
        self.rebalances = 0  # callbacks: assignments, revocations, losses

    def on_assign(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback, after the client assigned tps. A share group's consumer
        announces a partition when its first record comes: no rebalance (nothing is ever
        revoked in a share group), so not counted as one."""
        if not self.assignment.share:
            self.rebalances += 1
        new = self.assignment.assign(tps)
        self.operator.hold_new(new)
        self.flow.new_partitions(new)
        log.info("partitions assigned", extra={"partitions": ",".join(p.label for p in new),
                                               "paused": sum(p.pause.paused for p in new)})

    def on_revoke(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. Fence, wait only for batches in progress, commit."""
        self.rebalances += 1
        self.release(tps, commit=True)

    def on_lost(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. The partitions are already someone else's: fence and
        wait as for a revocation, but commit nothing (it would be refused)."""
        self.rebalances += 1
        self.release(tps, commit=False)

    def release(self, tps: list[TP], commit: bool, why: str = "") -> list[Partition]:
        """Fence, wait for the batches in progress, commit (``commit``), forget. ``why``: what
        the log line says (by default, revoked or lost)."""
        started = self.clock()
        self.assignment.let_go_over_capacity(tps)
        parts = self.assignment.fence(tps)
        if not parts:
            return []
        waits = self._batches_in_progress({p.fence.slot for p in parts})
        # RACE: a worker sends a batch's result before its board says idle, so a worker seen
        # idle here may have finished a batch of these partitions whose result is in its pipe,
        # unread: read it now, or the commit below leaves out what its outputs already wrote
        # and the next owner writes them again (seen under KIP-848, CI's members row).
        self.results.collect()
        deadline = started + self.revoke_timeout_s
        while waits and self.clock() < deadline:
            self.results.collect(min(0.05, max(0.0, deadline - self.clock())))
            waits = {i: bid for i, bid in waits.items() if self.handles[i].alive
                     and (bid == -1 or self.scheduler.out_on(i, bid))}
        for i in waits:
            # INVARIANT (5): no worker touches a record of a revoked partition after this
            # returns; one that will not let go in time is killed (and restarted later).
            self.workforce.kill_now(self.handles[i], (
                f"still busy on a revoked partition after supervisor.revoke_timeout_s "
                f"({self.revoke_timeout_s:g} s)"))
        # What invariant 5 bounds: fencing and the batch in progress. The commit that
        # follows is a broker round trip (slower while the group is rebalancing).
        fenced_ms = round((self.clock() - started) * 1000, 1)
        if commit:
            self.commits.commit(parts, asynchronous=False)
        # What the release left, with the broker's answer per partition (none: lost): a batch
        # run exits 0 only if each was done, or handed over with its commit acknowledged.
        self.caught_up.on_released(parts, self.commits.take_sync_answers())
        self.assignment.forget(parts)
        if self.desk is not None:
            for p in parts:
                self.desk.forget(p.tp)  # its letters are the next owner's to write
        took_ms = round((self.clock() - started) * 1000, 1)
        self._timings.append(took_ms / 1000)
        self.revocations = [*self.revocations[-99:], {
            "ms": took_ms, "fenced_ms": fenced_ms, "end_ns": time.monotonic_ns(), "committed": commit,
            "partitions": [p.label for p in parts]}]
        log.info(why or ("partitions revoked" if commit else "partitions lost"), extra={
            "partitions": ",".join(p.label for p in parts), "took_ms": took_ms})
        self.take_in_over_capacity()
        return parts

    def take_timings(self) -> list[float]:
        """Seconds each release since the last call took (the loop hands them to the metrics'
        histogram; this room knows no metrics)."""
        timings, self._timings = self._timings, []
        return timings

    def take_in_over_capacity(self) -> None:
        """Slots freed by a release go to partitions held over capacity (assignment.py), which
        start as any newly assigned partition does: operator holds and flow control first."""
        adopted = self.assignment.adopt()
        if adopted:
            self.operator.hold_new(adopted)
            self.flow.take_over(adopted)

    def _batches_in_progress(self, slots: set[int]) -> dict[int, int]:
        """Worker index -> the batch of one of these slots it is running (-1: unknown, the
        lock was not had in time: wait for the worker to be idle or gone)."""
        waits: dict[int, int] = {}
        for h in self.handles:
            if not h.alive:
                continue
            busy = _batch_in_progress(h)
            if busy is None or busy[1] in slots:
                waits[h.index] = busy[0] if busy else -1
        return waits


def _batch_in_progress(h: Handle) -> tuple[int, int] | None:
    """(batch, slot) the worker is processing, (0, -1) when idle, None if unknown. Read under
    the worker's lock: see the RACE note in runtime/worker/fence.py."""
    if not h.lock.acquire(timeout=1.0):
        return None
    try:
        return h.board.current
    finally:
        h.lock.release()
