"""More partitions than ``supervisor.max_partitions`` (issue 29): one member's clean stop gave
the survivor 12 partitions against 8 slots and it exited 1, which systemd restarted into the
same rebalance. Now the member takes what fits and holds the rest over capacity: paused in the
client at once and every tick, reported, never read or committed, taken in when a release frees
a slot. The real Supervisor over fakes (16 slots in the fake epoch table)."""

from __future__ import annotations

from typing import Any

import fakes
import pytest
from fakes import FakeConsumer, assign, lose, make, revoke

from runtime.errors import NotCaughtUp
from runtime.ops.metrics import SnapshotCollector
from runtime.supervisor.daemon.loop import Supervisor

SLOTS = 16
TPS = [("t", i) for i in range(SLOTS + 4)]


def setup(stop_when_caught_up: bool = False) -> tuple[Supervisor, FakeConsumer, Any]:
    extra: dict[str, Any] = {}
    sup, consumer, clock, _pool = make(**extra)
    if stop_when_caught_up:
        sup.caught_up.enabled = True
    assign(sup, consumer, TPS)
    return sup, consumer, clock


def test_partitions_past_the_slots_are_held_over_capacity_paused_and_never_an_exit() -> None:
    sup, consumer, _ = setup()
    over = TPS[SLOTS:]
    assert set(sup.partitions) == set(TPS[:SLOTS])
    assert set(sup.partitions.over_capacity) == set(over)
    assert set(over) <= consumer.paused, "paused before any fetch"
    consumer.paused -= set(over)  # librdkafka forgot the pause (a rebalance, librdkafka#5591)
    sup.flow.reconcile()
    assert set(over) <= consumer.paused, "re-paused every tick: the runtime's pause state"


def test_a_release_frees_slots_for_them_oldest_first_and_they_start_at_their_committed_offset() -> None:
    sup, consumer, _ = setup()
    revoke(sup, TPS[:2])
    taken = set(TPS[SLOTS:SLOTS + 2])
    assert taken <= set(sup.partitions), "the two oldest over capacity took the freed slots"
    assert set(sup.partitions.over_capacity) == set(TPS[SLOTS + 2:])
    assert not taken & consumer.paused, "they fetch again"
    fakes.fetch(sup)  # the loop's next tick settles them: read from their committed offset
    assert taken <= set(consumer.started[-1]), "seeking to the committed offset"


def test_an_over_capacity_partition_revoked_or_lost_is_simply_let_go() -> None:
    sup, consumer, _ = setup()
    revoke(sup, [TPS[-1]])
    lose(sup, [TPS[-2]])
    assert TPS[-1] not in sup.partitions.over_capacity and TPS[-2] not in sup.partitions.over_capacity
    assert not any(TPS[-1] in c for c in consumer.commits), "never read: nothing committed for it"
    assert set(sup.partitions) == set(TPS[:SLOTS]), "no slot was freed by it"


def test_status_metrics_and_the_one_line_say_so() -> None:
    sup, consumer, _ = setup()
    consumer.high[TPS[-1]] = 1234
    sup.report_if_due(force=True)
    snap = sup.latest_status
    assert snap is not None
    assert [o["tp"] for o in snap.over_capacity] == [f"t[{p}]" for _, p in TPS[SLOTS:]]
    assert snap.over_capacity[-1]["high"] == 1234
    assert "4 over capacity (not read)" in snap.one_line()
    families = {f.name: f for f in SnapshotCollector(lambda: snap, False, "g").collect()}
    assert families["ringmaster_partitions_over_capacity"].samples[0].value == 4


def test_a_batch_run_with_partitions_over_capacity_is_not_caught_up(monkeypatch: pytest.MonkeyPatch) -> None:
    sup, consumer, clock = setup(stop_when_caught_up=True)
    for p in sup.partitions.values():  # every held partition at its end
        p.intake.eof_at = p.intake.first_offset = 0
        consumer.high[p.tp] = 0
    clock.now += 1
    assert not sup.caught_up.should_stop(sup.rebalance.rebalances), \
        "partitions assigned and not read are work left"
    sup.stopping = True
    sup.shutdown()
    err = sup.exit_error
    assert isinstance(err, NotCaughtUp) and "assigned over supervisor.max_partitions" in str(err)
