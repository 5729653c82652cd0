"""Invariant 4 with fakes: the runtime owns pause state. A fake client that, like
librdkafka, starts every new assignment fetching and can lose a resume."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from runtime.board import EpochTable
from runtime.config import Settings
from runtime.flow import SlotTable
from runtime.supervisor import Supervisor

TP0, TP1 = ("t", 0), ("t", 1)


def msgs(tp: Any, *offsets: int) -> list[Message]:
    """Consumed messages as librdkafka hands them out (confluent-kafka's test constructor)."""
    return [Message(topic=tp[0], partition=tp[1], offset=o, value=b"v", timestamp=(1, 0)) for o in offsets]


@dataclass
class FakeRing:
    fill_value: float = 0.0
    capacity: int = 1000

    def fill(self) -> float:
        return self.fill_value

    def used_bytes(self) -> int:
        return int(self.fill_value * self.capacity)


@dataclass(eq=False)
class FakeHandle:
    index: int
    ring: FakeRing = field(default_factory=FakeRing)
    partitions: set[Any] = field(default_factory=set)
    in_flight: dict[int, Any] = field(default_factory=dict)
    accepting: bool = True
    alive: bool = False


@dataclass
class FakePool:
    handles: list[FakeHandle]


class FakeConsumer:
    """Records the client's actual pause state as librdkafka would hold it."""

    def __init__(self) -> None:
        self.paused: set[Any] = set()
        self.calls: list[tuple[str, list[Any]]] = []
        self.ignore_next_resume = False
        self.commits: list[dict[Any, int]] = []
        self.refused: dict[Any, int] = {}

    def pause(self, tps: Any) -> None:
        tps = list(tps)
        self.calls.append(("pause", tps))
        self.paused |= set(tps)

    def resume(self, tps: Any) -> None:
        tps = list(tps)
        self.calls.append(("resume", tps))
        if self.ignore_next_resume and tps:
            self.ignore_next_resume = False  # the pause-assign-resume race: lost
            return
        self.paused -= set(tps)

    def commit(self, offsets: dict[Any, int], asynchronous: bool) -> bool:
        self.commits.append(dict(offsets))
        return True

    def take_refused_commits(self) -> dict[Any, int]:
        refused, self.refused = self.refused, {}
        return refused

    def assign(self, tps: list[Any]) -> None:
        self.paused -= set(tps)  # a (re)assigned partition starts fetching


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make(fill: float = 0.0) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    settings = Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1}})
    clock = Clock()
    sup = Supervisor(settings, clock=clock)
    pool = FakePool([FakeHandle(0, FakeRing(fill))])
    consumer = FakeConsumer()
    sup.pool = pool  # type: ignore[assignment]
    sup.consumer = consumer  # type: ignore[assignment]
    sup.slots = SlotTable(EpochTable(memoryview(bytearray(8 * 16))))
    return sup, consumer, clock, pool


def assign(sup: Supervisor, consumer: FakeConsumer, tps: list[Any]) -> None:
    consumer.assign(tps)
    sup.on_assign(tps)


def test_assignment_to_a_full_ring_is_paused_at_once() -> None:
    sup, consumer, _, _ = make(fill=0.95)
    assign(sup, consumer, [TP0, TP1])
    assert consumer.paused == {TP0, TP1}
    assert all(f.paused for f in sup.flows.values())


def test_incremental_assignment_keeps_existing_pauses_and_pauses_the_new() -> None:
    sup, consumer, _, _pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    consumer.paused.clear()  # the client forgot the pause across the rebalance
    assign(sup, consumer, [TP1])
    assert TP1 in consumer.paused
    sup.clock.now += 1.5  # type: ignore[attr-defined]
    sup.reconcile_flow()
    assert consumer.paused == {TP0, TP1}, "the periodic reconcile re-applies forgotten pauses"


def test_resume_on_drain_with_hysteresis() -> None:
    sup, consumer, _clock, pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    pool.handles[0].ring.fill_value = 0.5
    sup.reconcile_flow()
    assert TP0 in consumer.paused, "between the watermarks: still paused"
    pool.handles[0].ring.fill_value = 0.1
    sup.reconcile_flow()
    assert TP0 not in consumer.paused


def test_frames_waiting_for_a_ring_count_towards_its_fill() -> None:
    """Invariant 3: the pending backlog is bounded because it counts as ring fill; a small
    overflow (a frame that did not fit yet) pauses nothing, since a pause makes librdkafka
    drop and later refetch what it had prefetched."""
    from runtime.flow import Batch

    sup, consumer, _clock, pool = make(fill=0.5)
    assign(sup, consumer, [TP0, TP1])
    sup.flows[TP0].pending.append(Batch(1, TP0, 0, 1, 0, 9, 10, b"f" * 100))  # 0.5 + 0.1 of the ring
    sup.reconcile_flow()
    assert not consumer.paused, "below pause_above with the backlog: keep fetching"
    sup.flows[TP0].pending.append(Batch(2, TP0, 0, 1, 10, 19, 10, b"f" * 250))  # 0.85 with the backlog
    sup.reconcile_flow()
    assert consumer.paused == {TP0, TP1}, "the worker's backlog is over pause_above: all its partitions"
    pool.handles[0].ring.fill_value = 0.1
    sup.reconcile_flow()
    assert consumer.paused == {TP0, TP1}, "0.1 + 0.35 pending is still above resume_below"
    pool.handles[0].ring.fill_value = 0.0
    sup.reconcile_flow()
    assert not consumer.paused, "0.35 with the backlog: below resume_below, resumed"


def test_a_fetch_asks_for_no_more_than_the_rings_can_take() -> None:
    sup, consumer, _clock, pool = make(fill=0.5)
    assign(sup, consumer, [TP0, TP1])
    assert sup._records_wanted() == 1000, "nothing learnt yet: a batch per partition"
    sup._bytes_per_record = 2.0  # room: (0.8 - 0.5) * 1000 bytes = 150 records of 2 bytes
    assert sup._records_wanted() == 150
    pool.handles[0].ring.fill_value = 0.95
    assert sup._records_wanted() == 100, "full rings: still a minimal fetch, never zero"


def test_the_batch_a_revocation_waits_for_is_committed_with_it() -> None:
    """Invariants 1 and 5: the fence bumps the epoch before waiting for the batch in
    progress; that batch's DONE comes back with the old epoch and must still count, or the
    revocation commits nothing of what it waited for (and a result of a partition already
    released must count for nothing)."""
    from runtime.flow import Batch
    from runtime.frames import DONE, Result, encode_result

    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    flow = sup.flows[TP0]
    old_epoch = flow.epoch
    flow.tracker.register(7, 0, 9)
    pool.handles[0].in_flight[7] = Batch(7, TP0, flow.slot, old_epoch, 0, 9, 10, b"")
    flow.epoch = sup.slots.fence(flow.slot)  # what _release_partitions does first
    sup._on_result(pool.handles[0], encode_result(Result(DONE, 7, flow.slot, old_epoch, processed=10)))
    assert flow.tracker.committable == 10, "the batch in progress at the fence is committed"
    late = encode_result(Result(DONE, 8, flow.slot, old_epoch, processed=5))  # no longer in flight
    flow.tracker.register(8, 10, 14)
    sup._on_result(pool.handles[0], late)
    assert flow.tracker.committable == 10, "a batch that is not in flight completes nothing"


def test_a_lost_resume_is_repaired_within_a_second() -> None:
    sup, consumer, clock, pool = make(fill=0.95)
    assign(sup, consumer, [TP0])
    pool.handles[0].ring.fill_value = 0.0
    consumer.ignore_next_resume = True
    sup.reconcile_flow()
    assert TP0 in consumer.paused, "the fake client lost the resume"
    clock.now += 1.0
    sup.reconcile_flow()
    assert TP0 not in consumer.paused, "a runnable partition is fetching again within 1 s"


def test_an_idle_partition_at_its_end_is_not_poked() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    sup.flows[TP0].eof_at = 10
    consumer.calls.clear()
    clock.now += 5
    sup.reconcile_flow()
    assert ("resume", [TP0]) not in consumer.calls


def test_a_refused_asynchronous_commit_is_sent_again_even_without_progress() -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    tracker = sup.flows[TP0].tracker
    tracker.register(1, 0, 9)
    tracker.complete(1)
    sup._commit(list(sup.flows.values()), asynchronous=True)
    assert consumer.commits == [{TP0: 10}]
    consumer.refused = {TP0: 10}  # e.g. REBALANCE_IN_PROGRESS, reported by on_commit
    sup._commit(list(sup.flows.values()), asynchronous=True)
    assert consumer.commits[-1] == {TP0: 10}, "the refused offset is committed again"
    sup._commit(list(sup.flows.values()), asynchronous=True)
    assert len(consumer.commits) == 2, "and only until it is accepted"


def test_rows_and_eof_in_the_same_consume_mean_caught_up() -> None:
    """One consume() may return a partition's last records and its EOF event together."""
    from runtime.kafka import Fetched

    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])
    fetched = Fetched(runs={TP0: msgs(TP0, 0, 1)}, eof={TP0: 2}, count=2)
    consumer.consume = lambda n, t: fetched  # type: ignore[attr-defined]
    sup.fetch()
    assert sup.flows[TP0].eof_at == 2
    stale = Fetched(runs={TP0: msgs(TP0, 2)}, eof={TP0: 2}, count=1)
    consumer.consume = lambda n, t: stale  # type: ignore[attr-defined]
    sup.fetch()
    assert sup.flows[TP0].eof_at is None, "an EOF older than the newest record does not count"


def test_records_straddling_a_rebalance_are_dropped_and_the_partition_restarts_at_its_commit() -> None:
    """confluent-kafka-python#1013: one consume() returns records fetched before a revoke +
    assign of the same partition (past the commit) and records restarting at the commit."""
    from runtime.kafka import Fetched

    sup, consumer, _, _ = make()
    assign(sup, consumer, [TP0])
    seeks: list[list[Any]] = []
    consumer.seek_to_start = lambda tps: seeks.append(list(tps))  # type: ignore[attr-defined]

    def consume_with_rebalance(n: int, t: float) -> Fetched:
        sup.on_revoke([TP0])
        consumer.assign([TP0])
        sup.on_assign([TP0])
        stale, fresh = msgs(TP0, 500, 501), msgs(TP0, 200)
        return Fetched(runs={TP0: stale + fresh, TP1: msgs(TP1, 7)}, count=4)

    consumer.consume = consume_with_rebalance  # type: ignore[attr-defined]
    sup.flows[TP0].tracker.register(1, 0, 9)
    sup.fetch()  # must not raise "goes backwards"
    assert sup.flows[TP0].open_msgs == [], "nothing of the straddling call is kept"
    assert seeks == [[TP0]], "the partition restarts at its committed offset"
