"""What a release (a revocation, a loss, the stop) asks of the data path: a narrow contract, as
arroyo's processing strategy's close and join are (runtime/supervisor/group/rebalance.py drives
it, and commits between join and forget).

    fence(tps)         no worker runs a frame of these partitions from now on: each takes a new
                       epoch (invariant 5); what was fetched and not placed is dropped
    join(parts, deadline) -> still busy
                       wait for the batches in progress of these partitions only (up to two a
                       worker: the one it runs, the one whose outputs are in flight), reading every
                       worker's results meanwhile (they are applied: a batch done is committable)
    terminate(workers, why)
                       a worker still busy on them at the deadline is killed
    forget(parts)      the partitions are no longer ours: their slots, lanes and batches in
                       rings go (a late result of one completes nothing)

Runs in: a rebalance callback (inside ``consume()``, on the supervisor's thread) or the stop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic

from runtime.supervisor.datapath.applier import Applier
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.partition.table import PartitionTable
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import H, Handle
from runtime.supervisor.workers.workforce import Workforce
from runtime.tp import TP

log = logging.getLogger("ringmaster.rebalance")

_WAIT_STEP_S = 0.05  # how long one wait for a result lasts, at most, while batches run


class Release(Generic[H]):
    def __init__(self, partitions: PartitionTable, applier: Applier[H], handles: Sequence[H],
                 scheduler: Scheduler, workforce: Workforce[H], clock: Callable[[], float]) -> None:
        self.partitions = partitions
        self.applier = applier
        self.handles = handles
        self.scheduler = scheduler
        self.workforce = workforce
        self.clock = clock

    def fence(self, tps: list[TP]) -> list[Partition]:
        """The held ones among ``tps``, fenced; those held over capacity are let go of (never
        read: nothing to fence, wait for or commit)."""
        self.partitions.let_go_over_capacity(tps)
        parts = [self.partitions[tp] for tp in tps if tp in self.partitions]
        for p in parts:
            p.fence()
        return parts

    def join(self, parts: list[Partition], deadline: float) -> list[int]:
        """Wait until no worker runs a batch of ``parts`` any more, or ``deadline`` (clock
        time): the workers still busy on them then."""
        waits = self._batches_in_progress({p.slot for p in parts})
        # RACE: a worker sends a batch's result before its board says idle, so a worker seen
        # idle here may have finished a batch of these partitions whose result is in its pipe,
        # unread: read it now, or the commit that follows leaves out what its outputs already
        # wrote and the next owner writes them again (seen under KIP-848, CI's members row).
        self.applier.collect()
        while waits and self.clock() < deadline:
            self.applier.collect(min(_WAIT_STEP_S, max(0.0, deadline - self.clock())))
            waits = {i: bids for i, bids in waits.items() if self.handles[i].alive
                     and any(bid == -1 or self.scheduler.out_on(i, bid) for bid in bids)}
        return sorted(waits)

    def terminate(self, workers: list[int], why: str) -> None:
        """INVARIANT (5): no worker touches a record of a released partition after the release
        returns; one that will not let go in time is killed (and restarted later)."""
        for i in workers:
            self.workforce.kill_now(self.handles[i], why)

    def forget(self, parts: list[Partition]) -> None:
        """The last step of a release: the partitions are no longer ours."""
        self.partitions.forget(parts)
        for p in parts:
            self.scheduler.forget(p.tp)  # workers skip these frames (stale epoch)

    def _batches_in_progress(self, slots: set[int]) -> dict[int, list[int]]:
        """Worker index -> its batches of these slots begun and not reported: the one it runs
        and the one whose outputs are in flight (pipelined delivery: up to two a worker);
        [-1]: unknown, the lock was not had in time: wait for the worker to be idle or gone."""
        waits: dict[int, list[int]] = {}
        for h in self.handles:
            if not h.alive:
                continue
            busy = _batches_in_progress(h)
            if busy is None:
                waits[h.index] = [-1]
                continue
            ours = [batch for batch, slot in busy if slot in slots]
            if ours:
                waits[h.index] = ours
        return waits


def _batches_in_progress(h: Handle) -> list[tuple[int, int]] | None:
    """(batch, slot) of the batches the worker has begun and not reported, None if unknown.
    Read under the worker's lock: see the RACE note in runtime/worker/fence.py."""
    if not h.lock.acquire(timeout=1.0):
        return None
    try:
        return h.board.in_progress()
    finally:
        h.lock.release()
