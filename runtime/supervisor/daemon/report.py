"""The status snapshot, built from what each room holds. Runs in: supervisor (building, every
``status_interval_s``); never decides anything. The snapshot (runtime/ops/status.py) is what
the status file, ``ringmaster status``/``top``, the progress display, the benchmarks and the
metrics endpoint read."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import psutil

from runtime.ops.status import PartitionStatus, RecentRates, StatusSnapshot, Stopped, WindowCpu, WorkerStatus
from runtime.supervisor.control.operator import OperatorHolds
from runtime.supervisor.control.rollout import OpKind, Rollout
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.intake import Intake
from runtime.supervisor.datapath.results import Results
from runtime.supervisor.group.commits import Committer
from runtime.supervisor.group.rebalance import Rebalance
from runtime.supervisor.partition.partition import Partition, Partitions
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer
from runtime.supervisor.seams.pool import Handle
from runtime.supervisor.workers.workforce import State, Workforce
from runtime.tp import tp_label


class Reporter:
    def __init__(self, group: str, ordering: str, consumer: Consumer, partitions: Partitions,
                 handles: Sequence[Handle], intake: Intake, scheduler: Scheduler, results: Results[Any],
                 workforce: Workforce[Any], commits: Committer, rebalance: Rebalance[Any],
                 operator: OperatorHolds, rollout: Rollout, desk: DeadLetterDesk | None,
                 clock: Callable[[], float]) -> None:
        self.group = group  # kafka.group_id
        self.ordering = ordering  # workers.ordering
        self.consumer = consumer
        self.partitions = partitions
        self.handles = handles
        self.intake = intake
        self.scheduler = scheduler
        self.results = results
        self.workforce = workforce
        self.commits = commits
        self.rebalance = rebalance
        self.operator = operator
        self.rollout = rollout
        self.desk = desk
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

    def snapshot(self, loop_age_s: float, ready: bool, stopped: Stopped | None,
                 held: list[Partition] | None = None) -> StatusSnapshot:
        """``held``: these partitions instead of the ones held now (the final snapshot shows
        what was held when the stop began)."""
        now = self.clock()
        elapsed = max(now - self.started_at, 1e-9)
        first = self.intake.first_record_at
        working = max(now - first, 1e-9) if first is not None else elapsed
        shown = self.partitions.values() if held is None else held
        parts = [self._partition(p, now) for p in sorted(shown, key=lambda p: p.tp)]
        workers = [self._worker(h) for h in self.handles
                   if self.workforce.lives[h.index].state is not State.SPARE]
        t = self.results.totals
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
            consumed=self.intake.consumed,
            deferred=t.deferred, transactions_committed=t.transactions_committed,
            transactions_aborted=t.transactions_aborted,
            restarts=sum(life.restarts for life in self.workforce.lives),
            paused=sum(p.paused for p in parts), lag=sum(p.lag or 0 for p in parts),
            partitions=parts, workers=workers, revocations=list(self.rebalance.revocations),
            committed={tp_label(tp): off for tp, off in sorted(self.commits.committed.items())},
            dead_letters_waiting=self.desk.pending() if self.desk else 0,
            rebalances=self.rebalance.rebalances, librdkafka=self.consumer.stats_summary,
            loop_age_s=round(loop_age_s, 3), ready=ready, operator_pauses=self.operator.describe(),
            stopped=stopped, over_capacity=self._over_capacity(now), share=self.commits.share_counts(),
            **self._rollout()))

    def _over_capacity(self, now: float) -> list[dict[str, Any]]:
        held = self.rebalance.assignment.over_capacity
        return [{"tp": tp_label(tp), "high": self.consumer.high_watermark(tp),
                 "since_s": round(now - since, 1)} for tp, since in sorted(held.items())]

    def _rollout(self) -> dict[str, Any]:
        r = self.rollout
        last = {kind: op.status() for kind, op in r.last.items()}
        return {"plugin": r.code.plugin, "plugin_version": r.version, "workers_target": r.target,
                "workers_max": r.limit, "reload": last.get(OpKind.RELOAD), "scale": last.get(OpKind.SCALE),
                "operations": dict(r.outcomes)}

    def _partition(self, p: Partition, now: float) -> PartitionStatus:
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
            tp=p.label, topic=p.tp[0], partition=p.tp[1], worker=self.scheduler.worker_of(p.tp),
            paused=p.pause.paused,
            pause_reasons=[r.value for r in p.pause_reasons()],
            holds={h.reason.value: h.detail for h in p.pause.holds.values()},
            blocked=p.blocked, committed=p.tracker.committed, done_through=done, high=high, lag=lag,
            pending_batches=self.scheduler.pending(p.tp), records=s.records_done, consumed=p.intake.consumed,
            outputs=s.outputs, dead_letters=s.dead_letters, hot_key=p.intake.hot_key,
            oldest_unprocessed_s=None if oldest is None else round(max(0.0, now - oldest), 3))

    def _worker(self, h: Handle) -> WorkerStatus:
        life = self.workforce.lives[h.index]
        rss, cpu_s = usage(h.pid) if h.alive else (None, None)
        return WorkerStatus(
            index=h.index, pid=h.pid, alive=h.alive, state=life.state.value, cpu_s=cpu_s,
            records=self.results.per_worker_records[h.index], in_flight=self.scheduler.count(h.index),
            queued_records=self.scheduler.queued_records(h.index), lanes=self.scheduler.lanes_on(h.index),
            us_per_record=round(self.scheduler.cost_us(h.index), 2),
            busy_s=round(self.results.per_worker_busy_ms[h.index] / 1000, 3),
            ring_fill=round(h.ring.fill(), 3), restarts=life.restarts, rss=rss,
            heartbeat_age_s=round(h.board.heartbeat_age_s, 3) if h.alive else None,
            last_exit=life.last_exit, start_failure=life.start_failure,
            exits={cause.value: n for cause, n in life.exits.items()},
            plugin_version=life.version, generation=life.code.generation if life.code else 0,
            retiring=bool(life.retiring))


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
