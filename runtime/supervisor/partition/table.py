"""The partitions this supervisor holds: which ones, in which slot of the epoch table, and the
ones assigned that found no slot. Runs in: supervisor (changed at the loop's rebalance step
and by a release, runtime/supervisor/group/rebalance.py).

The table adds and forgets partitions; each partition changes itself (partition.py). Other
rooms read it as a mapping of topic-partition to :class:`Partition`.

**More partitions than slots** (``supervisor.max_partitions``, the size of the epoch table
in shared memory) is a state the member lives with, never an exit (issue 29: one member's
clean stop handed the survivor 12 partitions against 8 slots, and it exited 1 into the same
rebalance for ever). A consumer group cannot decline a partition: the group's assignor gave
it, and it stays this member's until the next rebalance. So the partitions that find no slot
are held **over capacity**: paused in the client (nothing fetched, nothing committed; their
committed offset stays where the last owner left it, flow control pauses them again every
tick: invariant 4), reported (status ``over_capacity``,
``ringmaster_partitions_over_capacity``, a warning naming them) and taken in, oldest first,
as soon as a release frees a slot (``adopt``). Their lag grows meanwhile: the cure is a
larger ``max_partitions``, more members, or fewer partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping

from runtime.errors import RingmasterError
from runtime.supervisor.partition.partition import Client, Discards, Outside, Partition
from runtime.tp import TP, tp_label
from runtime.transport.board import EpochTable

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
        """A free slot. The caller checks ``free()`` first (the table holds the partitions
        that find none over capacity): none free here is a bug."""
        if not self._free:
            raise RingmasterError(f"no free slot of {self._epochs.slots} (a bug: the partition table "
                                  "holds partitions over supervisor.max_partitions over capacity)")
        return self._free.pop()

    def fence(self, slot: int) -> int:
        epoch = self._next_epoch
        self._next_epoch += 1
        self._epochs.set(slot, epoch)
        return epoch

    def release(self, slot: int) -> None:
        self._free.append(slot)


class PartitionTable(Mapping[TP, Partition]):
    """The partitions held, by topic-partition."""

    def __init__(self, slots: SlotTable, client: Client, scheduler: Discards, clock: Callable[[], float],
                 batch_max_records: int, share: bool) -> None:
        """What every partition's changes reach (partition.py): the epoch table's ``slots``,
        the ``client``, the ``scheduler``. ``batch_max_records``: workers.batch_max_records (a
        new partition's batch size until it learns its records); ``share``: a share group's
        partitions (acknowledged)."""
        self._slots = slots
        self._outside = Outside(slots, client, scheduler, clock)
        self._batch_max_records = batch_max_records
        self._share = share
        self._held: dict[TP, Partition] = {}
        # Assigned by the group, held by nobody: no slot was free. TP -> clock time since. Paused
        # in the client (flow control); taken in (adopt) when a release frees a slot.
        self._over: dict[TP, float] = {}
        self.assigned_once = False

    # ------------------------------------------------------------------ the mapping
    def __getitem__(self, tp: TP) -> Partition:
        return self._held[tp]

    def __iter__(self) -> Iterator[TP]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def over_capacity(self) -> Mapping[TP, float]:
        """Partitions assigned and held by nobody (no slot was free), with the clock time since."""
        return self._over

    @property
    def slots(self) -> int:
        return self._slots.size

    # ------------------------------------------------------------------ changes
    def assign(self, tps: Iterable[TP]) -> tuple[list[Partition], list[TP]]:
        """The group assigned ``tps``: (the partitions new to this member, those of them held
        over capacity). A partition already held, or already over capacity, is neither."""
        self.assigned_once = True
        now = self._outside.clock()
        new: list[Partition] = []
        over: list[TP] = []
        for tp in tps:
            if tp in self._held or tp in self._over:
                continue
            if not self._slots.free():
                self._over[tp] = now
                over.append(tp)
                continue
            new.append(self._take(tp, now))
        if over:
            log.warning(f"more partitions assigned than supervisor.max_partitions "
                        f"({self._slots.size}): {len(self._over)} held over capacity, not read "
                        "(paused: their lag grows) until a slot frees up; raise supervisor.max_partitions "
                        "or add members", extra={"partitions": ",".join(tp_label(tp) for tp in over)})
        return new, over

    def adopt(self) -> list[Partition]:
        """Partitions held over capacity that now find a slot, oldest first: new to this
        member's table, to be read from their committed offset once flow control and operator
        holds have had their say."""
        now = self._outside.clock()
        new = []
        for tp in sorted(self._over, key=self._over.__getitem__):
            if not self._slots.free():
                break
            del self._over[tp]
            new.append(self._take(tp, now))
        if new:
            log.info("partitions held over capacity taken in", extra={
                "partitions": ",".join(p.label for p in new), "still_over_capacity": len(self._over)})
        return new

    def let_go_over_capacity(self, tps: Iterable[TP]) -> None:
        """Revoked or lost while over capacity: never read, so nothing to fence, wait for or
        commit."""
        for tp in tps:
            self._over.pop(tp, None)

    def forget(self, parts: Iterable[Partition]) -> None:
        """The last step of a release: the partitions are no longer ours, their slots free."""
        for p in parts:
            del self._held[p.tp]
            self._slots.release(p.slot)

    def _take(self, tp: TP, now: float) -> Partition:
        p = Partition(tp, self._slots.acquire(), self._batch_max_records, self._outside, now, self._share)
        self._held[tp] = p
        return p
