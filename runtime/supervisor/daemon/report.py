"""The status snapshot, built from each room's own snapshot. Runs in: supervisor (building,
every ``status_interval_s``); never decides anything. The snapshot (runtime/ops/status.py) is
what the status file, ``ringmaster status``/``top``, the progress display, the benchmarks and
the metrics endpoint read.

The loop asks each room for its ``snapshot()`` (a typed value: what that room holds, as
status shows it) and hands them over as one :class:`Sections`; the Reporter joins them, per
partition and per worker, with what the client and the processes say (high watermarks, CPU
and memory). It holds no room.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from runtime.ops.status import PartitionStatus, RecentRates, StatusSnapshot, Stopped, WindowCpu, WorkerStatus
from runtime.supervisor.control.rollout import RolloutView
from runtime.supervisor.datapath.intake import IntakeView
from runtime.supervisor.datapath.results import ResultsView
from runtime.supervisor.group.commits import CommitsView
from runtime.supervisor.group.rebalance import RebalanceView
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.scheduling.scheduler import SchedulerView
from runtime.supervisor.seams.consumer import Consumer
from runtime.supervisor.seams.pool import Handle
from runtime.supervisor.workers.workforce import LifeView, State
from runtime.tp import TP, tp_label


@dataclass(frozen=True)
class Sections:
    """Each room's snapshot, as of one moment (the loop gathers them)."""

    partitions: Sequence[Partition]  # shown: those held now, or when the stop began
    over_capacity: Mapping[TP, float]  # assigned, held by nobody (no slot), since (clock time)
    intake: IntakeView
    scheduler: SchedulerView
    results: ResultsView
    workers: Sequence[LifeView]
    commits: CommitsView
    rebalance: RebalanceView
    operator_pauses: list[dict[str, object]]
    rollout: RolloutView
    letters_waiting: int  # dead letters the supervisor has not had acknowledged yet


class Reporter:
    def __init__(self, group: str, ordering: str, consumer: Consumer, handles: Sequence[Handle],
                 clock: Callable[[], float]) -> None:
        """``consumer``: the partitions' high watermarks and the client's statistics;
        ``handles``: the workers' processes, rings and heartbeats."""
        self.group = group  # kafka.group_id
        self.ordering = ordering  # workers.ordering
        self.consumer = consumer
        self.handles = handles
        self.clock = clock
        self.started_at = clock()
        # CPU seconds (supervisor, each worker pid) when the first record arrived: status
        # reports CPU per record over the processing window, start-up and joins excluded.
        self._cpu_at_first_record: tuple[float, dict[int, float]] | None = None
        self.rates = RecentRates()  # per-partition rates over the last seconds, not the run's average

    def first_record_seen(self) -> None:
        workers = {}
        for h in self.handles:
            cpu_s = usage(h.pid)[1] if h.alive else None
            if cpu_s is not None and h.pid is not None:
                workers[h.pid] = cpu_s
        self._cpu_at_first_record = (usage(os.getpid())[1] or 0.0, workers)

    def snapshot(self, rooms: Sections, loop_age_s: float, ready: bool,
                 stopped: Stopped | None) -> StatusSnapshot:
        now = self.clock()
        elapsed = max(now - self.started_at, 1e-9)
        first = rooms.intake.first_record_at
        working = max(now - first, 1e-9) if first is not None else elapsed
        shown = sorted(rooms.partitions, key=lambda p: p.tp)
        parts = [self._partition(p, rooms.scheduler, now) for p in shown]
        workers = [self._worker(h, rooms.workers[h.index], rooms.scheduler, rooms.results)
                   for h in self.handles if rooms.workers[h.index].state is not State.SPARE]
        t = rooms.results.totals
        my_rss, my_cpu = usage(os.getpid())
        my_cpu = my_cpu or 0.0
        window = WindowCpu(0.0, 0.0)
        if self._cpu_at_first_record is not None:
            sup0, workers0 = self._cpu_at_first_record
            window = WindowCpu(round(my_cpu - sup0, 3), round(sum(
                (w.cpu_s or 0.0) - workers0.get(w.pid or 0, 0.0) for w in workers), 3))
        return self.rates.apply(now, StatusSnapshot(
            pid=os.getpid(), group=self.group, ordering=self.ordering,
            elapsed_s=round(elapsed, 3), window_s=round(working, 4),
            join_s=round((first if first is not None else now) - self.started_at, 3),
            supervisor_cpu_s=round(my_cpu, 3), window_cpu_s=window, supervisor_rss=my_rss,
            records=t.records, rate=round(t.records / working, 1), outputs=t.outputs,
            dead_letters=t.dead_letters, discarded=t.discarded, batches=t.batches,
            consumed=rooms.intake.consumed,
            deferred=t.deferred, transactions_committed=t.transactions_committed,
            transactions_aborted=t.transactions_aborted,
            restarts=sum(life.restarts for life in rooms.workers),
            paused=sum(p.paused for p in parts), lag=sum(p.lag or 0 for p in parts),
            partitions=parts, workers=workers, revocations=rooms.rebalance.revocations,
            committed={tp_label(tp): off for tp, off in sorted(rooms.commits.committed.items())},
            dead_letters_waiting=rooms.letters_waiting,
            rebalances=rooms.rebalance.rebalances, librdkafka=self.consumer.stats_summary,
            loop_age_s=round(loop_age_s, 3), ready=ready, operator_pauses=rooms.operator_pauses,
            stopped=stopped, over_capacity=self._over_capacity(rooms.over_capacity, now),
            share=rooms.commits.share, **self._rollout(rooms.rollout)))

    def _over_capacity(self, held: Mapping[TP, float], now: float) -> list[dict[str, Any]]:
        return [{"tp": tp_label(tp), "high": self.consumer.high_watermark(tp),
                 "since_s": round(now - since, 1)} for tp, since in sorted(held.items())]

    @staticmethod
    def _rollout(r: RolloutView) -> dict[str, Any]:
        fields = dataclasses.asdict(r)
        fields.update(reload=r.reload, scale=r.scale)  # typed values, not dicts
        return fields

    def _partition(self, p: Partition, scheduler: SchedulerView, now: float) -> PartitionStatus:
        high = self.consumer.high_watermark(p.tp)
        done = p.tracker.committable
        # Lag counts from what is handled; before the first batch is done, from where
        # reading started (not from offset 0: that would report the whole log as lag).
        base = done if done is not None else (p.tracker.committed if p.tracker.committed is not None
                                              else p.intake.first_offset)
        lag = None if high is None or base is None else max(high - base, 0)
        oldest = p.tracker.oldest_at()
        if p.intake.open_msgs:
            oldest = p.intake.open_since if oldest is None else min(oldest, p.intake.open_since)
        s = p.stats
        return PartitionStatus(
            tp=p.label, topic=p.tp[0], partition=p.tp[1], worker=scheduler.worker_of.get(p.tp),
            paused=p.pause.paused,
            pause_reasons=[r.value for r in p.pause_reasons()],
            holds={h.reason.value: h.detail for h in p.pause.holds.values()},
            blocked=p.blocked, committed=p.tracker.committed, done_through=done, high=high, lag=lag,
            pending_batches=scheduler.pending.get(p.tp, 0), records=s.records_done,
            consumed=p.intake.consumed, outputs=s.outputs, dead_letters=s.dead_letters,
            hot_key=p.intake.hot_key,
            oldest_unprocessed_s=None if oldest is None else round(max(0.0, now - oldest), 3))

    @staticmethod
    def _worker(h: Handle, life: LifeView, scheduler: SchedulerView, results: ResultsView) -> WorkerStatus:
        rss, cpu_s = usage(h.pid) if h.alive else (None, None)
        load = scheduler.workers[h.index]
        return WorkerStatus(
            index=h.index, pid=h.pid, alive=h.alive, state=life.state.value, cpu_s=cpu_s,
            records=results.per_worker_records[h.index], in_flight=load.in_flight,
            queued_records=load.queued_records, lanes=load.lanes, us_per_record=round(load.us_per_record, 2),
            busy_s=round(results.per_worker_busy_ms[h.index] / 1000, 3),
            ring_fill=round(h.ring.fill(), 3), restarts=life.restarts, rss=rss,
            heartbeat_age_s=round(h.board.heartbeat_age_s, 3) if h.alive else None,
            last_exit=life.last_exit, start_failure=life.start_failure,
            exits={cause.value: n for cause, n in life.exits.items()},
            plugin_version=life.version, generation=life.generation, retiring=life.retiring)


def usage(pid: int | None) -> tuple[int | None, float | None]:
    """(RSS bytes, CPU seconds) of a process, or Nones if it is gone or cannot be read. Never
    raises: psutil raises OSError (not psutil.Error) when the supervisor is out of file
    descriptors, and a status snapshot must never stop the daemon."""
    if pid is None:
        return None, None
    with contextlib.suppress(psutil.Error, OSError):
        proc = psutil.Process(pid)
        with proc.oneshot():
            t = proc.cpu_times()
            return proc.memory_info().rss, t.user + t.system
    return None, None
