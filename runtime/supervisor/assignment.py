"""The assignment room: which partitions this supervisor holds, at which epoch, and where
each is read from. Runs in: supervisor (rebalance callbacks run inside ``consume()`` on the
supervisor's thread; the rebalance story that calls this room is rebalance.py).

Owns the partition table (it adds and removes partitions) and each partition's ``fence``
part: its slot in the epoch table in shared memory and its epoch. Fencing a partition gives
it a new epoch; workers skip every frame of an older one (invariant 5). Two ways to let go
of a partition's work, both fenced:

* **release** (revocation, loss, shutdown): rebalance.py waits for the batches in progress
  only, commits, and this room forgets the partition. Bounded by ``revoke_timeout_s``.
* **rewind** (a batch deferred by an outage or a plugin's Backoff, a partition blocked at a
  failing record, an operator pause): hold the partition, and once every batch of it that
  was out in the rings has come back, read it again from its lowest unhandled offset. Not
  blocking: the loop goes on while the batch in progress finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from runtime.config import Settings
from runtime.errors import RingmasterError
from runtime.kafka.consumer import Fetched
from runtime.supervisor.flowcontrol import FlowControl
from runtime.supervisor.intake import Intake
from runtime.supervisor.partitions import Partition, Partitions, PauseReason, new_partition
from runtime.supervisor.scheduler import Scheduler
from runtime.supervisor.seams import Consumer
from runtime.tp import TP
from runtime.transport.board import EpochTable

log = logging.getLogger("ringmaster.assignment")


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


class Assignment:
    def __init__(self, settings: Settings, consumer: Consumer, partitions: Partitions, slots: SlotTable,
                 intake: Intake, scheduler: Scheduler, flow: FlowControl, clock: Callable[[], float]) -> None:
        self.s = settings
        self.consumer = consumer
        self.partitions = partitions
        self.slots = slots
        self.intake = intake
        self.scheduler = scheduler
        self.flow = flow
        self.clock = clock
        self.touched: set[TP] = set()  # partitions a rebalance callback changed this tick
        self.assigned_once = False

    # ------------------------------------------------------------------ rebalances
    def assign(self, tps: Iterable[TP]) -> list[Partition]:
        """Runs in: rebalance callback. The partitions new to this member."""
        self.assigned_once = True
        self.touched.update(tps)
        now = self.clock()
        new = []
        for tp in tps:
            if tp not in self.partitions:
                slot = self.slots.acquire()
                p = new_partition(tp, slot, self.slots.fence(slot), self.s.workers.batch_max_records, now)
                self.partitions[tp] = p
                new.append(p)
        return new

    def fence(self, tps: Iterable[TP]) -> list[Partition]:
        """Runs in: rebalance callback (or shutdown). First step of a release: workers skip
        every frame of these partitions from now on; what was not cut is dropped."""
        self.touched.update(tps)
        parts = [self.partitions[tp] for tp in tps if tp in self.partitions]
        for p in parts:
            p.fence.epoch = self.slots.fence(p.fence.slot)
            self.intake.drop(p)
            self.scheduler.drop_pending(p.tp)
        return parts

    def forget(self, parts: Iterable[Partition]) -> None:
        """Last step of a release: the partitions are no longer ours."""
        for p in parts:
            del self.partitions[p.tp]
            self.slots.release(p.fence.slot)
            self.scheduler.forget(p.tp)  # workers skip these frames (stale epoch)

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
        owned = [tp for tp in self.touched if tp in self.partitions]
        self.touched.clear()
        self._seek_to_start(owned)

    def retry_seeks(self) -> None:
        waiting = [tp for tp, p in self.partitions.items() if PauseReason.SEEKING in p.pause.holds]
        if waiting:
            self._seek_to_start(waiting)

    def _seek_to_start(self, tps: list[TP]) -> None:
        failed = set(self.consumer.seek_to_start(tps))
        for tp in tps:
            p = self.partitions[tp]
            if tp in failed:
                self.flow.hold(p, PauseReason.SEEKING, "waiting to read the committed offset")
                self.intake.drop(p)
                self.scheduler.drop_pending(tp)
            else:
                self.intake.rewound(p)
                if self.flow.release(p, PauseReason.SEEKING):
                    log.info("partition start offset found", extra={"tp": p.label})

    # ------------------------------------------------------------------ rewind
    def rewind(self, p: Partition, reason: PauseReason, detail: str, until: float | None) -> None:
        """Hold the partition and read it again from its lowest unhandled offset once its
        batches out in the rings have come back (advance_rewinds)."""
        self.flow.hold(p, reason, detail, until)
        if p.fence.rewinding:
            return
        p.fence.epoch = self.slots.fence(p.fence.slot)
        p.fence.rewinding = True
        self.intake.drop(p)
        self.scheduler.drop_pending(p.tp)
        log.info("partition held", extra={"tp": p.label, "reason": reason.value, "detail": detail})

    def advance_rewinds(self) -> None:
        for p in list(self.partitions.values()):
            if not p.fence.rewinding or self.scheduler.has_out(p.tp):
                continue
            # Every batch of the old epoch is back (done, or skipped by its worker): what is
            # not done is read again. RACE: seeking earlier would let a late DONE move the
            # committable offset past the seek position.
            restart = p.tracker.restart_offset()
            if restart is None:
                restart = p.intake.dropped_from  # nothing registered: the first record dropped
            p.tracker.discard_unfinished()
            if restart is not None and not self.consumer.seek(p.tp, restart):
                continue  # tried again next tick
            p.fence.rewinding = False
            self.intake.rewound(p)
            log.debug("partition rewound", extra={"tp": p.label, "restart": restart})
