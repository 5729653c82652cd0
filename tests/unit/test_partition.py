"""One partition's life (runtime/supervisor/partition/partition.py): each transition a method of
the partition, and what it tells the epoch table, the scheduler and the client; the table's
slots and partitions over capacity (table.py). And the rebalance as a step of the loop of its
own (runtime/supervisor/group/rebalance.py): an assignment recorded inside consume() is applied
once consume() returned; a revocation is released inside its callback."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import TP0, TP1, assign, assign_in_consume, fetch, make, msgs, report

from runtime.kafka.consumer import Fetched
from runtime.kafka.messages import bind_packer
from runtime.supervisor.datapath.effects import Rewind
from runtime.supervisor.group.rebalance import Assigned, Released
from runtime.supervisor.partition.partition import Outside, Partition, PauseReason
from runtime.supervisor.partition.table import PartitionTable, SlotTable
from runtime.transport.board import EpochTable
from runtime.transport.frames import DEFERRED, Result


class World:
    """What a partition tells: epochs handed out, batches discarded, records handed back, seeks."""

    def __init__(self) -> None:
        self.epoch = 0
        self.discarded: list[Any] = []
        self.released: list[tuple[Any, int]] = []
        self.seeks: list[tuple[Any, int]] = []
        self.refuse_seek = False
        self.now = 100.0

    def fence(self, slot: int) -> int:
        self.epoch += 1
        return self.epoch

    def discard(self, tp: Any) -> list[Any]:
        self.discarded.append(tp)
        return []

    def release(self, tp: Any, run: Any, keep: bool = False) -> None:
        self.released.append((tp, len(run)))

    def seek(self, tp: Any, offset: int) -> bool:
        if self.refuse_seek:
            return False
        self.seeks.append((tp, offset))
        return True


def alone() -> tuple[Partition, World]:
    bind_packer()  # what the partition reads offsets of: confluent-kafka's messages
    w = World()
    return Partition(TP0, 3, 500, Outside(w, w, w, lambda: w.now), w.now), w


def test_a_new_partition_takes_a_fresh_epoch_of_its_slot_and_reads() -> None:
    p, _ = alone()
    assert (p.slot, p.epoch, p.rewinding, p.held, p.seeking) == (3, 1, False, False, False)


def test_a_fence_takes_a_new_epoch_and_drops_what_is_not_in_a_ring_telling_the_scheduler_once() -> None:
    p, w = alone()
    p.fetched(msgs(TP0, 5, 6, 7), w.now)
    p.fence()
    assert p.epoch == 2 and p.intake.open_msgs == []
    assert w.discarded == [TP0] and w.released == [(TP0, 3)], "the client gets the records back"
    assert p.intake.dropped_from == 5, "a rewind must go back at least that far"


def test_a_rewind_holds_fences_once_and_reads_again_from_the_restart_offset() -> None:
    p, w = alone()
    p.register([(1, 0, 9), (2, 10, 19)], w.now)
    p.done(1, 10, 0, 0, 0, w.now)
    p.rewind(PauseReason.DELIVERY, "broker away", until=w.now + 1)
    assert p.rewinding and p.held and p.epoch == 2 and w.discarded == [TP0]
    p.rewind(PauseReason.OPERATOR, "maintenance")
    assert p.epoch == 2, "rewound again: only the holds change"
    assert set(p.pause.holds) == {PauseReason.DELIVERY, PauseReason.OPERATOR}
    w.refuse_seek = True
    assert not p.read_again() and p.rewinding, "the client refused the seek: tried again next tick"
    w.refuse_seek = False
    assert p.read_again() and not p.rewinding
    assert w.seeks[-1] == (TP0, 10), "from the lowest offset not done"
    assert p.tracker.unfinished == 0, "the unfinished spans are gone: their batches complete nothing"


def test_records_fetched_while_rewinding_or_seeking_are_dropped_and_remembered() -> None:
    p, w = alone()
    p.rewind(PauseReason.BACKOFF, "x")
    p.fetched(msgs(TP0, 40, 41), w.now)
    assert p.intake.open_msgs == [] and p.intake.dropped_from == 40
    q, v = alone()
    q.wait_for_start()
    q.fetched(msgs(TP0, 7), v.now)
    assert q.seeking and q.intake.open_msgs == [] and q.intake.dropped_from is None
    assert q.started() and not q.seeking and not q.started(), "released once"


def test_holds_expire_at_their_time_and_a_release_says_whether_it_held() -> None:
    p, w = alone()
    p.hold(PauseReason.BACKOFF, "x", until=w.now + 2)
    p.hold(PauseReason.OPERATOR, "y")
    assert p.expire_holds(w.now + 1) == []
    assert [h.reason for h in p.expire_holds(w.now + 2)] == [PauseReason.BACKOFF]
    assert p.release(PauseReason.OPERATOR) and not p.release(PauseReason.OPERATOR) and not p.held


def test_only_the_hold_reasons_are_holds() -> None:
    p, _ = alone()
    with pytest.raises(AssertionError):
        p.hold(PauseReason.FLOW, "backpressure is flow control's decision, not a hold")


def test_the_table_holds_what_fits_its_slots_and_the_rest_over_capacity_oldest_first() -> None:
    w = World()
    epochs = EpochTable(memoryview(bytearray(8 * 2)))
    table = PartitionTable(SlotTable(epochs), w, w, lambda: w.now, 500, share=False)
    tps = [("t", i) for i in range(4)]
    new, over = table.assign(tps[:3])
    assert [p.tp for p in new] == tps[:2] and over == [tps[2]] and table.assigned_once
    w.now += 1
    assert table.assign(tps[1:]) == ([], [tps[3]]), "held or over capacity already: neither new"
    assert list(table.over_capacity) == [tps[2], tps[3]]
    table.forget([table[tps[0]]])
    (adopted,) = table.adopt()
    assert adopted.tp == tps[2] and list(table.over_capacity) == [tps[3]], "the oldest first"
    table.let_go_over_capacity([tps[3]])
    assert not table.over_capacity and set(table) == {tps[1], tps[2]}


def test_an_assignment_is_recorded_in_the_callback_and_applied_at_the_loops_step() -> None:
    sup, consumer, _clock, _pool = make()
    assign_in_consume(sup, consumer, [TP0])
    assert TP0 not in sup.partitions, "nothing of the room's work inside the callback"
    consumer.next_fetch = lambda n, t: Fetched(runs={TP0: msgs(TP0, 500)}, count=1)  # straddles it
    fetch(sup)
    assert TP0 in sup.partitions and consumer.started[-1] == [TP0], "applied, then started at its commit"
    assert sup.partitions[TP0].intake.open_msgs == [], "what that consume() returned for it is dropped"


def test_a_partition_assigned_and_revoked_within_one_consume_is_never_applied() -> None:
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP1])

    def consume(n: int, t: float) -> Fetched:
        assign_in_consume(sup, consumer, [TP0, TP1])
        sup.rebalance.on_revoke([TP0])
        return Fetched()

    consumer.next_fetch = consume
    fetch(sup)
    assert set(sup.partitions) == {TP1} and not sup.partitions.over_capacity
    assert consumer.commits == [], "never held: nothing fenced, waited for or committed"


def test_a_revocation_is_released_inside_its_callback_and_recorded_for_the_step() -> None:
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0])
    sup.partitions[TP0].register([(1, 0, 9)], 0.0)
    sup.partitions[TP0].done(1, 10, 0, 0, 0, 0.0)
    sup.rebalance.on_revoke([TP0])
    assert TP0 not in sup.partitions and consumer.commits == [{TP0: 10}], "committed before it returned"
    (change,) = sup.rebalance.take()
    assert isinstance(change, Released) and change.tps == (TP0,) and change.answers[TP0].offset == 10
    assert sup.rebalance.take() == [], "taken once"
    sup.rebalance.on_assign([TP1])
    assert sup.rebalance.take() == [Assigned((TP1,))]


def test_results_decide_effects_and_change_nothing_until_they_are_applied() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    from test_supervisor_flow import out

    b = out(sup, TP0, 1, 0, 9)
    (effect,) = sup.results.apply(0, Result(DEFERRED, 1, b.slot, b.epoch, detail="away", cause="delivery"))
    assert isinstance(effect, Rewind) and effect.parts == (p,) and effect.deferred is p
    assert not p.held and p.stats.deferrals == 0, "a decision, not a change"
    sup.applier.apply([effect])
    assert p.rewinding and PauseReason.DELIVERY in p.pause.holds and p.stats.deferrals == 1
    report(pool, 0, Result(DEFERRED, 1, b.slot, b.epoch, detail="again"))
    sup.applier.collect()
    assert p.stats.deferrals == 1, "a report of a batch no longer out decides nothing"
