"""The assignment room: which partitions this supervisor holds, and at which epoch.
Runs in: supervisor; ``on_assign``/``on_revoke``/``on_lost`` in rebalance callbacks, which
librdkafka runs inside ``consume()`` on the supervisor's thread.

Creates and deletes PartitionFlows, and is the only writer of their fence (slot, epoch).
Two ways to let go of a partition's work, both fenced (a new epoch in shared memory: the
workers skip every frame of the old one):

* **release** (revocation, loss, shutdown): wait for the batches in progress only, commit,
  forget the partition. Blocking, bounded by ``revoke_timeout_s`` (invariant 5).
* **rewind** (a batch deferred by an outage or a plugin's Backoff, a partition blocked at a
  failing record, an operator pause): hold the partition, and once every batch of it that
  was out in the rings has come back, read it again from its lowest unhandled offset. Not
  blocking: the loop goes on while the batch in progress finishes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from runtime.config import Settings
from runtime.flow import SEEKING, TP, InFlight, PartitionFlow, SlotTable
from runtime.kafka import Fetched, GroupConsumer, offset_of
from runtime.pool import WorkerHandle

log = logging.getLogger("ringmaster.assignment")


class Assignment:
    def __init__(self, settings: Settings, consumer: GroupConsumer, handles: list[WorkerHandle],
                 flows: dict[TP, PartitionFlow], in_flight: InFlight, slots: SlotTable,
                 clock: Callable[[], float], *,
                 collect_results: Callable[[float], None],
                 commit: Callable[[list[PartitionFlow]], None],
                 kill_worker: Callable[[WorkerHandle], None],
                 on_new_flows: Callable[[list[PartitionFlow]], None],
                 on_released: Callable[[list[PartitionFlow]], None]) -> None:
        self.s = settings
        self.consumer = consumer
        self.handles = handles
        self.flows = flows
        self.in_flight = in_flight
        self.slots = slots
        self.clock = clock
        self._collect = collect_results
        self._commit = commit
        self._kill = kill_worker
        self._on_new_flows = on_new_flows
        self._on_released = on_released
        self.touched: set[TP] = set()  # partitions a rebalance callback changed this tick
        self.assigned_once = False
        self.revocations: list[dict[str, Any]] = []  # the last 100, for status and tests
        self.rebalances = 0  # callbacks: assignments, revocations, losses
        self.on_revocation: Callable[[float], None] = lambda seconds: None

    # ------------------------------------------------------------------ rebalances
    def on_assign(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback (inside consume()), after the client assigned tps."""
        self.assigned_once = True
        self.rebalances += 1
        self.touched.update(tps)
        now = self.clock()
        new = []
        owned = [0] * len(self.handles)  # partitions per owner: a new one goes to the least loaded
        for f in self.flows.values():
            owned[f.owner] += 1
        for tp in tps:
            if tp in self.flows:
                continue
            slot = self.slots.acquire()
            owner = min(range(len(self.handles)), key=lambda i: (owned[i], i))
            owned[owner] += 1
            flow = PartitionFlow(tp, slot, self.slots.fence(slot), owner,
                                 batch_records=self.s.workers.batch_max_records,
                                 last_activity=now, last_resume=now)
            self.flows[tp] = flow
            new.append(flow)
        # INVARIANT (4): librdkafka starts every newly assigned partition fetching; the
        # runtime's own decision (backpressure, operator pauses) is applied at once, so a
        # member whose rings are full, or a paused group, gets no batch because of a rebalance.
        self._on_new_flows(new)
        paused = [f for f in new if f.wants_pause()]
        for f in paused:
            f.paused = True
        self.consumer.pause([f.tp for f in paused])
        log.info("partitions assigned", extra={
            "partitions": ",".join(f.label for f in new), "paused": len(paused)})

    def on_revoke(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. Fence, wait only for batches in progress, commit."""
        self.rebalances += 1
        self.release(tps, commit=True)

    def on_lost(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. The partitions are already someone else's: fence
        and wait as for a revocation, but commit nothing (it would be refused)."""
        self.rebalances += 1
        self.release(tps, commit=False)

    def settle(self, fetched: Fetched) -> None:
        """RACE: rebalance callbacks run inside consume(), and the records it returns may
        straddle them (confluent-kafka-python#1013): a partition revoked and assigned again
        during one call gets records fetched under the old assignment (past the commit) and
        then records restarting at the committed offset. Drop what this call returned for
        every partition a callback touched, and start the ones we now own at their committed
        offset; the seek also purges what librdkafka had queued for them. A partition whose
        committed offset cannot be read now is held (SEEKING) and tried again."""
        if not self.touched:
            return
        for tp in self.touched:
            fetched.runs.pop(tp, None)
            fetched.eof.pop(tp, None)
        fetched.count = sum(len(r) for r in fetched.runs.values())
        owned = [tp for tp in self.touched if tp in self.flows]
        self.touched.clear()
        self._seek_to_start(owned)

    def retry_seeks(self) -> None:
        waiting = [f.tp for f in self.flows.values() if SEEKING in f.holds]
        if waiting:
            self._seek_to_start(waiting)

    def _seek_to_start(self, tps: list[TP]) -> None:
        failed = set(self.consumer.seek_to_start(tps))
        now = self.clock()
        for tp in tps:
            flow = self.flows[tp]
            if tp in failed:
                flow.hold(SEEKING, "waiting to read the committed offset", now)
                flow.drop_buffered()
            elif flow.release(SEEKING):
                log.info("partition start offset found", extra={"tp": flow.label})

    # ------------------------------------------------------------------ release
    def release(self, tps: list[TP], commit: bool) -> None:
        started = self.clock()
        self.touched.update(tps)
        flows = [self.flows[tp] for tp in tps if tp in self.flows]
        if not flows:
            return
        for flow in flows:
            flow.epoch = self.slots.fence(flow.slot)
        waits = self._batches_in_progress({f.slot for f in flows})
        deadline = started + self.s.supervisor.revoke_timeout_s
        while waits and self.clock() < deadline:
            self._collect(min(0.05, max(0.0, deadline - self.clock())))
            for i, batch_id in list(waits.items()):
                h = self.handles[i]
                if not h.alive or (batch_id != -1 and not self.in_flight.contains(i, batch_id)):
                    del waits[i]
        for i in waits:
            # INVARIANT (5): no worker touches a record of a revoked partition after this
            # returns; one that will not let go in time is killed (and restarted later).
            h = self.handles[i]
            log.error("worker still busy on a revoked partition after revoke_timeout; killing it",
                      extra={"worker": i, "pid": h.pid})
            self._kill(h)
        # What invariant 5 bounds: fencing and the batch in progress. The commit that
        # follows is a broker round trip (slower while the group is rebalancing).
        fenced_ms = round((self.clock() - started) * 1000, 1)
        if commit:
            self._commit(flows)
        for flow in flows:
            del self.flows[flow.tp]
            self.slots.release(flow.slot)
            self.in_flight.drop_partition(flow.tp)  # the workers skip these frames (stale epoch)
        self._on_released(flows)
        took_ms = round((self.clock() - started) * 1000, 1)
        self.on_revocation(took_ms / 1000)
        self.revocations = [*self.revocations[-99:], {
            "ms": took_ms, "fenced_ms": fenced_ms, "end_ns": time.monotonic_ns(),
            "partitions": [f.label for f in flows]}]
        log.info("partitions revoked" if commit else "partitions lost", extra={
            "partitions": ",".join(f.label for f in flows), "took_ms": took_ms})

    def _batches_in_progress(self, slots: set[int]) -> dict[int, int]:
        """Worker index -> the batch of one of these slots it is running (-1: unknown, the
        lock was not had in time: wait for the worker to be idle or gone)."""
        waits: dict[int, int] = {}
        for h in self.handles:
            if not h.alive:
                continue
            busy = self._batch_in_progress(h)
            if busy is None or busy[1] in slots:
                waits[h.index] = busy[0] if busy else -1
        return waits

    @staticmethod
    def _batch_in_progress(h: WorkerHandle) -> tuple[int, int] | None:
        """(batch, slot) the worker is processing, (0, -1) when idle, None if unknown.
        Read under the worker's lock: see the RACE note in worker.py."""
        if not h.lock.acquire(timeout=1.0):
            return None
        try:
            return h.board.current
        finally:
            h.lock.release()

    # ------------------------------------------------------------------ rewind
    def rewind(self, flow: PartitionFlow, reason: str, detail: str, until: float | None) -> None:
        """Hold the partition and read it again from its lowest unhandled offset once its
        batches out in the rings have come back (advance_rewinds)."""
        now = self.clock()
        flow.hold(reason, detail, now, until)
        if flow.rewinding:
            return
        flow.rewind_from = offset_of(flow.open_msgs[0]) if flow.open_msgs else None
        flow.epoch = self.slots.fence(flow.slot)
        flow.drop_buffered()
        flow.rewinding = True
        if not flow.paused:
            flow.paused = True
            self.consumer.pause([flow.tp])
        log.info("partition held", extra={"tp": flow.label, "reason": reason, "detail": detail})

    def advance_rewinds(self) -> None:
        for flow in list(self.flows.values()):
            if not flow.rewinding or self.in_flight.has(flow.tp):
                continue
            # Every batch of the old epoch is back (done, or skipped by its worker): what is
            # not done is read again. RACE: seeking earlier would let a late DONE move the
            # committable offset past the seek position.
            restart = flow.tracker.restart_offset()
            if restart is None:
                restart = flow.rewind_from  # nothing registered: the first record dropped
            flow.tracker.discard_unfinished()
            if restart is not None and not self.consumer.seek(flow.tp, restart):
                continue  # tried again next tick
            flow.rewinding = False
            flow.rewind_from = None
            flow.next_offset = flow.eof_at = None
            log.debug("partition rewound", extra={"tp": flow.label, "restart": restart})

