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

**More partitions than slots** (``supervisor.max_partitions``, the size of the epoch table
in shared memory) is a state the member lives with, never an exit (issue 29: one member's
clean stop handed the survivor 12 partitions against 8 slots, and it exited 1 into the same
rebalance for ever). A consumer group cannot decline a partition: the group's assignor gave
it, and it stays this member's until the next rebalance. So the partitions that find no slot
are held **over capacity**: paused in the client at once (nothing fetched, nothing
committed; their committed offset stays where the last owner left it), re-paused every tick
(librdkafka's pause state is not trusted across rebalances, invariant 4), reported (status
``over_capacity``, ``ringmaster_partitions_over_capacity``, a warning naming them) and taken
in, oldest first, as soon as a release frees a slot. Their lag grows meanwhile: the cure is
a larger ``max_partitions``, more members, or fewer partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from runtime.backoff import backoff_s
from runtime.errors import RingmasterError
from runtime.kafka.consumer import Fetched
from runtime.supervisor.datapath.flowcontrol import FlowControl
from runtime.supervisor.datapath.intake import Intake
from runtime.supervisor.partition.partition import Partition, Partitions, PauseReason, new_partition
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer
from runtime.tp import TP, tp_label
from runtime.transport.board import EpochTable

# The first wait before a held partition's start is tried again, and the longest.
_SEEK_RETRY_S = 0.1
_SEEK_RETRY_MAX_S = 2.0

log = logging.getLogger("ringmaster.assignment")


class SlotTable:
    """Hands out epoch-table slots to assigned partitions, and fresh epochs for them.
    Epochs come from one counter, so a reused slot never revives an old frame."""

    def __init__(self, epochs: EpochTable) -> None:
        self._epochs = epochs
        self._free = list(range(epochs.slots - 1, -1, -1))
        self._next_epoch = 1

    @property
    def size(self) -> int:
        return self._epochs.slots

    def free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        """A free slot. The caller checks ``free()`` first (Assignment holds the partitions
        that find none over capacity): none free here is a bug."""
        if not self._free:
            raise RingmasterError(f"no free slot of {self._epochs.slots} (a bug: the assignment room "
                                  "holds partitions over supervisor.max_partitions over capacity)")
        return self._free.pop()

    def fence(self, slot: int) -> int:
        epoch = self._next_epoch
        self._next_epoch += 1
        self._epochs.set(slot, epoch)
        return epoch

    def release(self, slot: int) -> None:
        self._free.append(slot)


class Assignment:
    def __init__(self, batch_max_records: int, share: bool, consumer: Consumer, partitions: Partitions,
                 slots: SlotTable, intake: Intake, scheduler: Scheduler, flow: FlowControl,
                 clock: Callable[[], float]) -> None:
        """``batch_max_records``: workers.batch_max_records; ``share``: a share group's."""
        self.batch_max_records = batch_max_records
        self.share = share
        self.consumer = consumer
        self.partitions = partitions
        self.slots = slots
        self.intake = intake
        self.scheduler = scheduler
        self.flow = flow
        self.clock = clock
        self.touched: set[TP] = set()  # partitions a rebalance callback changed this tick
        # Held partitions' starts are tried again with a back-off, not on every turn of the
        # loop: each try reads committed offsets from a coordinator that may be overloaded,
        # and librdkafka refuses the seek itself for as long as its own read of them is
        # unanswered (socket.timeout.ms, 60 s by default).
        self._seek_failures = 0
        self._seek_again_at = 0.0
        self.assigned_once = False
        # Assigned by the group, held by nobody: no slot was free. TP -> clock time since. Paused
        # in the client; taken in (adopt) when a release frees a slot. Written here only.
        self.over_capacity: dict[TP, float] = {}

    # ------------------------------------------------------------------ rebalances
    def assign(self, tps: Iterable[TP]) -> list[Partition]:
        """Runs in: rebalance callback. The partitions new to this member."""
        self.assigned_once = True
        self.touched.update(tps)
        now = self.clock()
        new = []
        over = []
        for tp in tps:
            if tp in self.partitions or tp in self.over_capacity:
                continue
            if not self.slots.free():
                self.over_capacity[tp] = now
                over.append(tp)
                continue
            new.append(self._take(tp, now))
        if over:
            # INVARIANT (4): librdkafka starts every new assignment fetching; these must not.
            self.consumer.pause(over)
            log.warning(f"more partitions assigned than supervisor.max_partitions "
                        f"({self.slots.size}): {len(self.over_capacity)} held over capacity, not read "
                        "(paused: their lag grows) until a slot frees up; raise supervisor.max_partitions "
                        "or add members", extra={"partitions": ",".join(tp_label(tp) for tp in over)})
        return new

    def _take(self, tp: TP, now: float) -> Partition:
        slot = self.slots.acquire()
        p = new_partition(tp, slot, self.slots.fence(slot), self.batch_max_records, now,
                          share=self.share)
        self.partitions[tp] = p
        return p

    def adopt(self) -> list[Partition]:
        """Runs in: rebalance callback (after a release) or the loop. Partitions held over
        capacity that now find a slot, oldest first: new to this member's table, to be read
        from their committed offset (``touched``: settle seeks them there) once flow control
        and operator holds have had their say (rebalance.py)."""
        now = self.clock()
        new = []
        for tp in sorted(self.over_capacity, key=self.over_capacity.__getitem__):
            if not self.slots.free():
                break
            del self.over_capacity[tp]
            self.touched.add(tp)
            new.append(self._take(tp, now))
        if new:
            log.info("partitions held over capacity taken in", extra={
                "partitions": ",".join(p.label for p in new), "still_over_capacity": len(self.over_capacity)})
        return new

    def let_go_over_capacity(self, tps: Iterable[TP]) -> None:
        """Runs in: rebalance callback. Revoked or lost while over capacity: never read, so
        nothing to fence, wait for or commit."""
        for tp in tps:
            self.over_capacity.pop(tp, None)

    def tick(self) -> None:
        """The loop's step for this room: rewinds whose batches are back read again, and
        partitions over capacity paused again (what the client was told about them is not
        trusted across rebalances, invariant 4)."""
        self.advance_rewinds()
        if self.over_capacity:
            self.consumer.pause(list(self.over_capacity))

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
        if waiting and self.clock() >= self._seek_again_at:
            self._seek_to_start(waiting)

    def _seek_to_start(self, tps: list[TP]) -> None:
        failed = set(self.consumer.seek_to_start(tps))
        if failed:
            wait_s = backoff_s(_SEEK_RETRY_S, self._seek_failures, _SEEK_RETRY_MAX_S)
            self._seek_again_at = self.clock() + wait_s
            self._seek_failures += 1
        else:
            self._seek_failures = 0
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
