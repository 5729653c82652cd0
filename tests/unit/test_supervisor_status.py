"""What the supervisor says about itself in its snapshots: the final one says it stopped
(code, reason, when) and is not ready, a stop is not reported as a pause, each partition
carries its recent rate, and a worker killed for a revocation is the supervisor's kill."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

from fakes import TP0, TP1, Clock, FakeConsumer, FakePool, assign, revoke

from runtime.config import Settings
from runtime.ops.status import PartitionStatus, RecentRates, StatusFile, StatusSnapshot, WindowCpu
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.partition.partition import PauseReason
from runtime.supervisor.scheduling.batches import Batch
from runtime.transport.board import EpochTable


def built(tmp_path: Path, **supervisor: Any) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    """A supervisor with fakes, not started."""
    settings = Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1},
        "supervisor": {"status_file": str(tmp_path / "status.json"), **supervisor}})
    clock, pool, consumer = Clock(), FakePool(1), FakeConsumer()
    sup = Supervisor(settings, consumer, pool, EpochTable(memoryview(bytearray(8 * 16))), clock=clock,  # type: ignore[arg-type]
                     status_file=StatusFile(settings.supervisor.status_file))
    return sup, consumer, clock, pool


def make(tmp_path: Path, **supervisor: Any) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    sup, consumer, clock, pool = built(tmp_path, **supervisor)
    sup.workforce.start_all()
    return sup, consumer, clock, pool


def test_the_final_status_after_sigterm_says_stopped_why_and_when_and_not_ready(tmp_path: Path) -> None:
    sup, consumer, _clock, _pool = make(tmp_path)
    assign(sup, consumer, [TP0, TP1])
    sup.workforce.started_once = True
    sup.report_if_due(force=True)
    running = json.loads((tmp_path / "status.json").read_text())
    assert running["ready"] is True and running["stopped"] is None
    sup.signals.queue.put(signal.SIGTERM)
    sup.handle_signals()
    sup.shutdown()
    final = json.loads((tmp_path / "status.json").read_text())
    assert final["ready"] is False
    assert final["stopped"]["code"] == 0 and final["stopped"]["reason"] == "SIGTERM received"
    assert final["stopped"]["at"] > 1_600_000_000, "wall-clock seconds"
    assert final["paused"] == 0 and not any(p["paused"] for p in final["partitions"]), \
        "partitions the stop paused are not reported as paused"
    assert sup.final_status is not None and sup.final_status.stopped is not None


def test_a_partition_paused_for_a_reason_stays_paused_in_the_final_status(tmp_path: Path) -> None:
    sup, consumer, _clock, _pool = make(tmp_path)
    assign(sup, consumer, [TP0, TP1])
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "by ringmaster pause")
    sup.stopping = True
    sup.stop_reason = "caught up with the end of every assigned partition (--until-caught-up)"
    sup.shutdown()
    final = json.loads((tmp_path / "status.json").read_text())
    assert final["paused"] == 1 and [p["tp"] for p in final["partitions"] if p["paused"]] == ["t[0]"]
    assert final["stopped"]["reason"].startswith("caught up")


def test_while_stopping_the_snapshot_is_not_ready(tmp_path: Path) -> None:
    sup, consumer, _clock, _pool = make(tmp_path)
    assign(sup, consumer, [TP0])
    sup.workforce.started_once = True
    sup.report_if_due(force=True)
    assert sup.latest_status is not None and sup.latest_status.ready and sup.ready()
    sup.stopping = True
    sup.report_if_due(force=True)
    assert not sup.latest_status.ready and not sup.ready(), "the same answer as /readyz"


def test_each_partition_in_a_snapshot_carries_its_recent_rate(tmp_path: Path) -> None:
    sup, consumer, clock, _pool = make(tmp_path, status_interval_s=1.0)
    assign(sup, consumer, [TP0, TP1])
    sup.report_if_due(force=True)
    first = sup.latest_status
    assert first is not None and all(p.rate is None for p in first.partitions), "one look is no rate"
    for _ in range(3):
        clock.now += 1.0
        sup.partitions[TP0].stats.records_done += 100
        sup.results.totals.records += 100
        sup.report_if_due()
    snap = sup.latest_status
    assert snap is not None
    rates = {p.tp: p.rate for p in snap.partitions}
    assert rates == {"t[0]": 100.0, "t[1]": 0.0}
    assert snap.recent_rate == 100.0
    on_disk = json.loads((tmp_path / "status.json").read_text())
    assert {p["tp"]: p["rate"] for p in on_disk["partitions"]} == rates


def _snap(records: int, per_tp: dict[str, int]) -> StatusSnapshot:
    parts = [PartitionStatus(tp=tp, topic="t", partition=i, worker=0, paused=False, pause_reasons=[],
                             holds={}, blocked=None, committed=None, done_through=None, high=None, lag=None,
                             pending_batches=0, records=n, consumed=n, outputs=0, dead_letters=0)
             for i, (tp, n) in enumerate(per_tp.items())]
    return StatusSnapshot(pid=1, group="g", ordering="partition", elapsed_s=1, window_s=1, join_s=0,
                          supervisor_cpu_s=0, window_cpu_s=WindowCpu(0, 0), supervisor_rss=None,
                          records=records,
                          rate=0, outputs=0, dead_letters=0, discarded=0, batches=0, consumed=0, deferred=0,
                          restarts=0, paused=0, lag=0, partitions=parts, workers=[], revocations=[],
                          committed={})


def test_recent_rates_cover_the_last_window_only_and_a_new_partition_starts_unknown() -> None:
    rates = RecentRates(window_s=10.0)
    rates.apply(0.0, _snap(0, {"a": 0}))
    rates.apply(5.0, _snap(5000, {"a": 5000}))  # a burst early on
    for t in range(6, 31):
        out = rates.apply(float(t), _snap(5000 + (t - 5) * 10, {"a": 5000 + (t - 5) * 10, "b": (t - 6) * 7}))
    (a, b) = out.partitions
    assert a.rate == 10.0, "the burst has left the window"
    assert b.rate == 7.0
    fresh = rates.apply(31.0, _snap(0, {"c": 3}))
    assert fresh.partitions[0].rate is None


def test_a_worker_still_busy_after_revoke_timeout_is_killed_by_the_supervisor_for_that(
        tmp_path: Path) -> None:
    sup, consumer, clock, pool = make(tmp_path, revoke_timeout_s=2.0)
    assign(sup, consumer, [TP0])
    h = pool.handles[0]
    h.alive, h.pid = True, 4242
    p = sup.partitions[TP0]
    p.tracker.register(7, 0, 9)
    sup.scheduler.enqueue([Batch(7, TP0, p.slot, p.epoch, 0, 9, 10, b"", None)])
    sup.scheduler.dispatch(sup.capacity())
    h.board.begin(7, p.slot)
    clock.step = 0.05  # time passes while the revocation waits
    revoke(sup, [TP0])
    assert pool.killed == [0]
    kill = sup.workforce.lives[0].kill
    assert kill is not None and "revoked partition" in kill and "supervisor.revoke_timeout_s" in kill


def test_a_snapshot_is_published_before_the_daemon_can_be_ready(tmp_path: Path) -> None:
    # The admin endpoint answers /status with 503 while no snapshot exists: a client that saw
    # /readyz say 200 must never get that (a tick can join the group and see its workers
    # started before it reaches its report; CI's fault matrix caught HEAD /status answered 503).
    sup, _consumer, _clock, _pool = built(tmp_path)
    assert sup.latest_status is None
    sup.start()
    assert sup.latest_status is not None and not sup.latest_status.ready
    assert json.loads((tmp_path / "status.json").read_text())["ready"] is False
