"""The supervisor: one thread, one loop, every decision about fetching, dispatch, fencing,
pausing and committing taken in one place, so the races between them cannot happen.

    broker ─consume()─▶ intake: runs per partition ─▶ cut into frames per lane ─▶ worker rings
                                                   (flow control pauses what has no room)
    worker result pipes ─▶ offset trackers ─▶ commits (async, periodic; sync on revoke/stop)
    worker deaths ─▶ workforce: restart, crash isolation ─▶ frames back in their lanes

The loop delegates to rooms, each the one writer of its state:

    intake.py      fetch, cut batches, dispatch into rings        (the partitions' buffers)
    assignment.py  rebalances, fencing, rewinds                    (which partitions, epochs)
    workforce.py   worker start-up, deaths, restarts, deadlines    (each worker's life)
    flowcontrol.py backpressure and every pause/resume             (what the client is told)
    deadletters.py dead letters the supervisor writes itself       (asynchronous, acked)
    status.py      the typed snapshot and the status file

Rebalance callbacks run inside ``consume()`` on this same thread. Signal handlers only
enqueue; the loop handles them between steps.

Runs in: the supervisor process.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import multiprocess.connection
import psutil

from runtime.admin import AdminServer, Health
from runtime.assignment import Assignment
from runtime.board import EpochTable
from runtime.commits import Committer
from runtime.config import Settings, consumer_properties, max_message_bytes, producer_properties
from runtime.control import OperatorPauses
from runtime.deadletters import DeadLetterDesk
from runtime.errors import PartitionsBlocked, RingmasterError
from runtime.flow import BACKOFF, BLOCKED, DELIVERY, OPERATOR, TP, InFlight, PartitionFlow, SlotTable
from runtime.flowcontrol import FlowControl
from runtime.frames import BLOCKED as R_BLOCKED
from runtime.frames import DEFERRED, DONE, FATAL, Result, decode_result
from runtime.intake import BatchIds, Intake
from runtime.isolation import isolate
from runtime.kafka import GroupConsumer, OutputProducer
from runtime.metrics import RuntimeMetrics
from runtime.plugin import backoff_wait
from runtime.pool import WorkerHandle, WorkerPool, become_subreaper
from runtime.shm import SegmentSet, check_space, reclaim_stale
from runtime.status import (
    PartitionStatus,
    StatusFile,
    StatusSnapshot,
    Stopped,
    Totals,
    WindowCpu,
    WorkerStatus,
)
from runtime.systemd import Notifier
from runtime.worker import WorkerSpec
from runtime.workforce import Death, Workforce

log = logging.getLogger("ringmaster.supervisor")

Row = tuple[int, bytes | None, bytes | None, Any]  # (offset, key, value, headers) of one record
_GC_THRESHOLD = 50_000  # young-generation GC threshold in the supervisor (see run())
_IDLE_WAIT_S = 0.02  # consume() waits this long for a first record when nothing is open


class Supervisor:
    """The loop. Constructed with its collaborators (the consumer, the pool and its epoch
    table, a clock): tests pass fakes; ``run_daemon`` passes the real ones."""

    def __init__(self, settings: Settings, consumer: GroupConsumer, pool: WorkerPool, epochs: EpochTable, *,
                 clock: Callable[[], float] = time.monotonic,
                 on_status: Callable[[StatusSnapshot], None] | None = None,
                 dead_letters: DeadLetterDesk | None = None,
                 pauses: OperatorPauses | None = None,
                 metrics: RuntimeMetrics | None = None,
                 notifier: Notifier | None = None,
                 status_file: StatusFile | None = None) -> None:
        self.s = settings
        self.w = settings.workers
        self.clock = clock
        self.consumer = consumer
        self.pool = pool
        self.on_status = on_status
        self.dead_letters = dead_letters
        self.pauses = pauses
        self.metrics = metrics
        self.notifier = notifier or Notifier()
        self.flows: dict[TP, PartitionFlow] = {}
        self.totals = Totals()
        self.per_worker_records = [0] * len(pool.handles)
        self.in_flight = InFlight(len(pool.handles))
        self.ids = BatchIds()
        self.workforce = Workforce(settings, pool, self.in_flight, clock)
        self.intake = Intake(settings, consumer, pool.handles, self.flows, self.in_flight,
                             self.workforce.accepting, self.ids, clock)
        self.flow_control = FlowControl(settings, consumer, self.flows, self.intake, clock)
        self.commits = Committer(consumer, self.flows, settings.supervisor.commit_interval_ms / 1000, clock)
        self.assignment = Assignment(
            settings, consumer, pool.handles, self.flows, self.in_flight, SlotTable(epochs), clock,
            collect_results=self.collect_results, commit=lambda flows: self.commits.commit(flows, False),
            kill_worker=self._kill_now, on_new_flows=self._on_new_flows, on_released=self._on_released)
        if metrics is not None:
            self.assignment.on_revocation = metrics.observe_revocation
        self.status_file = status_file or StatusFile(settings.supervisor.status_file)
        self.stopping = False
        self.exit_error: RingmasterError | None = None  # a clean stop that still exits non-zero
        self.final_status: StatusSnapshot | None = None
        self.latest_status: StatusSnapshot | None = None
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._started_at = clock()
        self._last_tick = clock()
        self._last_status = self._last_watchdog = 0.0
        # CPU seconds (supervisor, each worker pid) when the first record arrived: status
        # reports CPU per record over the processing window, start-up and joins excluded.
        self._cpu_at_first_record: tuple[float, dict[int, float]] | None = None

    # ------------------------------------------------------------------ the story
    def run(self) -> int:
        """Run until stopped by a signal or (optionally) caught up. Returns the exit code;
        raises RingmasterError for a stop the user must act on."""
        self._install_signal_handlers()
        try:
            self.start()
            while not self.stopping:
                self._last_tick = self.clock()
                self.handle_signals()
                self.apply_operator_pauses()
                self.fetch()
                self.intake.cut_batches()
                self.dead_letter_oversized()
                self.intake.dispatch()
                self.collect_results()
                self.manage_workers()
                self.deliver_dead_letters()
                self.assignment.advance_rewinds()
                self.flow_control.reconcile()
                self.commits.commit_if_due()
                self.report_if_due()
                self.stop_if_caught_up()
        except RingmasterError as exc:
            # A stop the user must act on (the plugin cannot start, a fatal Kafka error): it
            # still ends like any stop – batches in progress finish, what is done is committed,
            # the final status says why – and only then is it raised for the exit code.
            self.exit_error = exc
            log.critical(f"stopping: {exc}")
        try:
            self.shutdown()
        except RingmasterError as exc:
            log.error("stopping did not finish cleanly", extra={"error": str(exc)})
            self.exit_error = self.exit_error or exc
        if self.exit_error is not None:
            raise self.exit_error
        return 0

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        become_subreaper()
        self.workforce.start_all()
        if self.pauses is not None:
            # INVARIANT: a new member knows the group's operator pauses before it can be
            # assigned anything, so it never processes a batch of a paused partition.
            self.pauses.load()
        self.consumer.subscribe(self.s.kafka.topics, self.assignment.on_assign,
                                self.assignment.on_revoke, self.assignment.on_lost)
        # Every fetched record is a Message the cyclic GC tracks. With the default
        # threshold (700 net allocations) a collection runs inside nearly every consume()
        # and walks thousands of live Messages: 1,139 collections and 100-130 ns per
        # record on trivial work. Messages die once packed, so net allocations stay far
        # below _GC_THRESHOLD and young collections all but stop; garbage cycles (rare
        # here) are still collected once that many objects pile up. Freezing what
        # start-up built (modules, config, clients) keeps full collections short.
        gc.freeze()
        gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
        self.notifier.notify("READY=1", f"STATUS=consuming {', '.join(self.s.kafka.topics)}")
        from runtime.kafka import PACK

        log.info("supervisor started", extra={
            "group": self.s.kafka.group_id, "topics": ",".join(self.s.kafka.topics),
            "workers": self.w.processes, "plugin": self.w.plugin, "pid": os.getpid(),
            "ordering": self.w.ordering, "start_method": self.w.start_method,
            "frame_packer": "C" if PACK.in_c else f"Python ({PACK.why_python})"})

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Handlers only enqueue: no logging, no raising inside a signal handler.
            signal.signal(sig, lambda signum, _frame: self._signals.put_nowait(signum))

    def handle_signals(self) -> None:
        while not self._signals.empty():
            signum = self._signals.get_nowait()
            log.info("stop requested", extra={"signal": signal.Signals(signum).name})
            self.stopping = True

    # ------------------------------------------------------------------ operator pauses
    def apply_operator_pauses(self) -> None:
        """Read the group's pause records (control.py) and hold or release partitions."""
        if self.pauses is None or not self.pauses.poll():
            return  # nothing new: holds already match the state
        now = self.clock()
        for flow in self.flows.values():
            pause = self.pauses.pause_for(flow.tp)
            if pause is not None and OPERATOR not in flow.holds:
                self.assignment.rewind(flow, OPERATOR, pause.describe(), None)
            elif pause is None and flow.release(OPERATOR):
                log.info("operator pause lifted", extra={"tp": flow.label})
            elif pause is not None:
                flow.hold(OPERATOR, pause.describe(), now)

    # ------------------------------------------------------------------ fetch
    def fetch(self) -> None:
        fetching = not self.assignment.assigned_once or any(not f.paused for f in self.flows.values())
        cutting = any(f.open_msgs and not f.holds and not f.rewinding for f in self.flows.values())
        wait_s = min(self.w.batch_max_wait_ms / 1000, _IDLE_WAIT_S) if cutting else _IDLE_WAIT_S
        wait_s = max(wait_s, 0.001)  # batch_max_wait_ms = 0 must not spin a core
        fetched = self.intake.fetch(wait_s if fetching else 0)
        self.assignment.settle(fetched)
        self.assignment.retry_seeks()
        if not fetching:
            self._wait_for_workers(wait_s)  # everything is paused: sleep on results and deaths
        self._raise_if_fatal()
        first = self.intake.first_record_at
        self.intake.take(fetched)
        if first is None and self.intake.first_record_at is not None:
            self._cpu_at_first_record = self._cpu_snapshot()
        self.totals.consumed = self.intake.consumed

    def dead_letter_oversized(self) -> None:
        """Records cut this tick that fit in no ring. Before dispatch: without a dead-letter
        topic the partition stops at such a record, and the frames cut after it must not
        reach a ring (the rewind drops them)."""
        for big in self.intake.too_large:
            flow = self.flows.get(big.tp)
            if flow is not None:
                self._dead_letter(flow, big.batch_id, big.row, "RecordTooLarge",
                                  f"record of {big.frame_bytes} bytes does not fit in a ring "
                                  f"(frame limit {big.max_frame}); raise workers.ring_bytes")
        self.intake.too_large.clear()

    def _wait_for_workers(self, timeout_s: float) -> None:
        waitables = self.pool.result_fds() + self.pool.sentinels()
        if waitables:
            multiprocess.connection.wait(waitables, timeout_s)
        else:
            time.sleep(timeout_s)

    # ------------------------------------------------------------------ results
    def collect_results(self, timeout_s: float = 0.0) -> None:
        if timeout_s > 0:
            fds = self.pool.result_fds()
            if fds:
                multiprocess.connection.wait(fds, timeout_s)
        for h in self.pool.handles:
            self._drain_results(h)

    def _drain_results(self, h: WorkerHandle) -> None:
        if h.results is None:
            return
        for message in h.results.read():  # at end of file the worker died: manage_workers() reaps it
            self._on_result(h, decode_result(message))

    def _on_result(self, h: WorkerHandle, r: Result) -> None:
        if r.kind == FATAL:
            self.workforce.on_fatal_report(h, r.detail)
            return
        batch = self.in_flight.pop(h.index, r.batch_id)
        # INVARIANT (1, 5): a batch counts only while it is in flight for its partition. A
        # batch that began before its partition was fenced and ran to the end while the
        # revocation (or rewind) waited for it counts, whatever its epoch: that is the batch
        # the revocation waits for, so that it commits it. Releasing a partition drops its
        # batches in flight, so a late result of one completes nothing.
        flow = self.flows.get(batch.tp) if batch is not None else None
        if r.kind == DONE:
            self.workforce.on_batch_done(h)
            self.totals.batches += 1
            self.totals.records += r.processed
            self.totals.outputs += r.outputs
            self.totals.dead_letters += r.dead_letters
            self.totals.discarded += r.discarded
            self.per_worker_records[h.index] += r.processed
            if self.metrics is not None:
                self.metrics.observe_batch(r.busy_ms / 1000)
            if flow is not None and batch is not None:
                flow.tracker.complete(r.batch_id)
                flow.records_done += r.processed
                flow.outputs += r.outputs
                flow.dead_letters += r.dead_letters
                flow.discarded += r.discarded
                flow.deferrals = 0
        elif r.kind == R_BLOCKED and flow is not None:
            self._stop_at_failing_record(flow, r.detail)
        elif r.kind == DEFERRED and flow is not None:
            self._defer(flow, r)

    def _defer(self, flow: PartitionFlow, r: Result) -> None:
        """An outage or a plugin's Backoff: not the records' fault. The partition (or every
        partition) waits, then reads the same batch again, in order; nothing is committed
        past it and nothing is dead-lettered."""
        self.totals.deferred += 1
        reason = DELIVERY if r.cause == "delivery" else BACKOFF
        if r.delay_ms >= 0:
            delay = backoff_wait(r.delay_ms / 1000, flow.deferrals)
        else:
            out = self.s.output
            delay = min(backoff_wait(out.retry_backoff_s, flow.deferrals), out.retry_backoff_max_s)
        flow.deferrals += 1
        until = self.clock() + delay
        detail = f"{r.detail} (retrying in {delay:.1f} s)"
        targets = list(self.flows.values()) if r.scope == "all" else [flow]
        log.warning("batch deferred; partition waits", extra={
            "tp": flow.label, "reason": reason, "detail": r.detail, "wait_s": round(delay, 2),
            "scope": r.scope or "partition"})
        for f in targets:
            self.assignment.rewind(f, reason, detail, until)

    # ------------------------------------------------------------------ workers
    def manage_workers(self) -> None:
        deaths = self.workforce.manage(drain=self._drain_results)
        for death in deaths:
            self._redeliver(death)
        self._raise_if_fatal()

    def _redeliver(self, death: Death) -> None:
        """Put a dead worker's unacknowledged batches back in front of their lanes, in their
        original order, so the next incarnation (or another worker) sees them again; the
        batch it was running counts a crash and may be bisected or dead-lettered."""
        requeue = []
        for b in self.in_flight.take_all(death.index):
            flow = self.flows.get(b.tp)
            if flow is None or flow.epoch != b.epoch:
                continue  # fenced meanwhile: the worker would have skipped it
            if b.batch_id != death.crashed_batch:
                requeue.append(b)
                continue
            b.crashes += 1
            iso = isolate(b, self.s.dead_letter.max_crashes, self.ids)
            if iso.split is not None:
                flow.tracker.split(b.batch_id, iso.split)
                log.warning("bisecting a batch that keeps crashing workers", extra={
                    "tp": flow.label, "first": b.first, "last": b.last})
            if iso.dead_letter is not None:
                self._dead_letter(flow, b.batch_id, iso.dead_letter, "WorkerCrashed",
                                  f"worker {death.why} while processing this record ({b.crashes} times)",
                                  attempts=b.crashes)
            requeue.extend(iso.requeue)
        self.intake.requeue(requeue)

    def _kill_now(self, h: WorkerHandle) -> None:
        self.pool.kill(h)
        if h.process is not None:
            h.process.join(5)

    # ------------------------------------------------------------------ dead letters
    def _dead_letter(self, flow: PartitionFlow, batch_id: int, row: Row, error_type: str, message: str,
                     attempts: int = 1) -> None:
        if self.dead_letters is None:
            self._stop_at_failing_record(flow, f"offset {row[0]}: {error_type}: {message}")
            return
        self.dead_letters.submit(flow.tp, batch_id, row, error_type, message, attempts)

    def _stop_at_failing_record(self, flow: PartitionFlow, detail: str) -> None:
        """No dead-letter topic: the partition holds at the record (nothing committed past it)
        until an operator fixes the plugin or configures one."""
        log.error("partition stopped at a failing record (no [dead_letter] topic); fix the "
                  "plugin or configure one, then restart", extra={"tp": flow.label, "reason": detail})
        self.assignment.rewind(flow, BLOCKED, detail, None)

    def deliver_dead_letters(self) -> None:
        if self.dead_letters is None:
            return
        for tp, batch_id in self.dead_letters.poll():
            flow = self.flows.get(tp)
            # INVARIANT (1): the record counts as handled only once its dead letter is acked.
            if flow is not None:
                flow.tracker.complete(batch_id)
                flow.dead_letters += 1
            self.totals.dead_letters += 1

    # ------------------------------------------------------------------ rebalance hooks
    def _on_new_flows(self, flows: list[PartitionFlow]) -> None:
        """Runs in: rebalance callback. Initial pause decisions of newly assigned partitions."""
        self.flow_control.decide(flows)
        if self.pauses is not None:
            now = self.clock()
            for flow in flows:
                pause = self.pauses.pause_for(flow.tp)
                if pause is not None:
                    flow.hold(OPERATOR, pause.describe(), now)

    def _on_released(self, flows: list[PartitionFlow]) -> None:
        if self.dead_letters is not None:
            for flow in flows:
                self.dead_letters.forget(flow.tp)

    # ------------------------------------------------------------------ status
    def _cpu_snapshot(self) -> tuple[float, dict[int, float]]:
        workers = {}
        for h in self.pool.handles:
            cpu_s = _usage(h.pid)[1] if h.alive else None
            if cpu_s is not None and h.pid is not None:
                workers[h.pid] = cpu_s
        return _usage(os.getpid())[1] or 0.0, workers

    def status(self, flows: list[PartitionFlow] | None = None) -> StatusSnapshot:
        """The snapshot; ``flows``: these partitions instead of the ones held now (the final
        snapshot shows what was held when the stop began)."""
        now = self.clock()
        elapsed = max(now - self._started_at, 1e-9)
        first = self.intake.first_record_at
        working = max(now - first, 1e-9) if first is not None else elapsed
        held = self.flows.values() if flows is None else flows
        parts = [self._partition_status(f) for f in sorted(held, key=lambda f: f.tp)]
        workers = []
        for h, life in zip(self.pool.handles, self.workforce.lives, strict=True):
            rss, cpu_s = _usage(h.pid) if h.alive else (None, None)
            workers.append(WorkerStatus(
                index=h.index, pid=h.pid, alive=h.alive, state=life.state.value, cpu_s=cpu_s,
                records=self.per_worker_records[h.index], in_flight=self.in_flight.count(h.index),
                ring_fill=round(h.ring.fill(), 3), restarts=life.restarts, rss=rss,
                heartbeat_age_s=round(h.board.heartbeat_age_s, 3) if h.alive else None,
                last_exit=life.last_exit, start_failure=life.start_failure, exits=dict(life.exits)))
        t = self.totals
        my_rss, my_cpu = _usage(os.getpid())
        my_cpu = my_cpu or 0.0
        if self._cpu_at_first_record is not None:
            sup0, workers0 = self._cpu_at_first_record
            window = WindowCpu(round(my_cpu - sup0, 3), round(sum(
                (w.cpu_s or 0.0) - workers0.get(w.pid or 0, 0.0) for w in workers), 3))
        else:
            window = WindowCpu(0.0, 0.0)
        return StatusSnapshot(
            pid=os.getpid(), group=self.s.kafka.group_id, ordering=self.w.ordering,
            elapsed_s=round(elapsed, 3), window_s=round(working, 4),
            join_s=round((first if first is not None else now) - self._started_at, 3),
            supervisor_cpu_s=round(my_cpu, 3), window_cpu_s=window, supervisor_rss=my_rss,
            records=t.records, rate=round(t.records / working, 1), outputs=t.outputs,
            dead_letters=t.dead_letters, discarded=t.discarded, batches=t.batches, consumed=t.consumed,
            deferred=t.deferred, restarts=sum(life.restarts for life in self.workforce.lives),
            paused=sum(p.paused for p in parts), lag=sum(p.lag or 0 for p in parts),
            partitions=parts, workers=workers, revocations=list(self.assignment.revocations),
            committed={f"{tp[0]}[{tp[1]}]": off for tp, off in sorted(self.commits.committed.items())},
            dead_letters_waiting=self.dead_letters.pending() if self.dead_letters else 0,
            rebalances=self.assignment.rebalances, librdkafka=self.consumer.stats_summary,
            loop_age_s=round(now - self._last_tick, 3),
            ready=self.workforce.started_once and self.assignment.assigned_once,
            operator_pauses=self.pauses.describe_all() if self.pauses is not None else [],
            stopped=Stopped(self.exit_error.exit_code, str(self.exit_error)) if self.exit_error else None)

    # ------------------------------------------------------------------ health (any thread)
    def health(self) -> Health:
        """Liveness. Runs in: the admin server's thread: reads plain values only. Fails when
        the loop has not gone round within its bound (a rebalance may hold it for up to
        revoke_timeout_s: the bound is above that), when a worker is stuck and not yet
        replaced, or when a fatal error is stopping the daemon. Lag, outages, pauses and
        rebalances are not failures of liveness."""
        reasons = []
        age = self.clock() - self._last_tick
        bound = max(self.s.admin.loop_stuck_s, self.s.supervisor.revoke_timeout_s + 10)
        if age > bound and not self.stopping:
            reasons.append(f"the supervisor's loop has not gone round for {age:.0f} s (bound {bound:g} s)")
        reasons += self.workforce.stuck()
        if self.exit_error is not None:
            reasons.append(f"stopping: {self.exit_error}")
        return Health(not reasons, reasons)

    def ready(self) -> bool:
        """Readiness: workers started and the group joined, and not stopping."""
        return self.workforce.started_once and self.assignment.assigned_once and not self.stopping

    def loop_age(self) -> float:
        """Seconds since the loop last went round. Runs in: any thread."""
        return max(0.0, self.clock() - self._last_tick)

    def _partition_status(self, f: PartitionFlow) -> PartitionStatus:
        high = self.consumer.high_watermark(f.tp)
        done = f.tracker.committable
        # Lag counts from what is handled; before the first batch is done, from where
        # reading started (not from offset 0: that would report the whole log as lag).
        base = done if done is not None else (f.tracker.committed if f.tracker.committed is not None
                                              else f.first_offset)
        lag = None if high is None or base is None else max(high - base, 0)
        return PartitionStatus(
            tp=f.label, topic=f.tp[0], partition=f.tp[1], worker=f.owner, paused=f.paused,
            pause_reasons=f.pause_reasons(), holds={h.reason: h.detail for h in f.holds.values()},
            blocked=f.blocked, committed=f.tracker.committed, done_through=done, high=high, lag=lag,
            pending_batches=f.pending(), records=f.records_done, consumed=f.consumed, outputs=f.outputs,
            dead_letters=f.dead_letters, hot_key=f.hot_key)

    def report_if_due(self, force: bool = False, flows: list[PartitionFlow] | None = None) -> None:
        now = self.clock()
        interval = self.notifier.watchdog_interval_s
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            self.notifier.notify("WATCHDOG=1")
        if not force and now - self._last_status < self.s.supervisor.status_interval_s:
            return
        self._last_status = now
        snapshot = self.status(flows)
        self.latest_status = snapshot
        self.status_file.write(snapshot)
        if self.on_status is not None:
            self.on_status(snapshot)

    # ------------------------------------------------------------------ caught up
    def stop_if_caught_up(self) -> None:
        """--until-caught-up: stop once every partition is processed to its end (or stopped
        at a failing record, which makes the run exit 7), and everything is committed."""
        if not self.s.supervisor.stop_when_caught_up or not self.assignment.assigned_once:
            return
        if self.clock() - self.intake.last_records_at < self.s.supervisor.caught_up_idle_s:
            return
        if self.dead_letters is not None and self.dead_letters.pending():
            return
        blocked = []
        for f in self.flows.values():
            if f.blocked is not None and not f.rewinding:
                blocked.append(f)
            elif not f.idle or f.holds or f.rewinding or not self._at_end(f):
                return
        if blocked:
            self.exit_error = PartitionsBlocked(
                f"{len(blocked)} partition(s) stopped at a failing record and no [dead_letter] topic is "
                f"configured: " + "; ".join(f"{f.label} {f.blocked}" for f in blocked)
                + ". Fix the plugin or configure [dead_letter] topic, then run again")
            log.error(str(self.exit_error))
        else:
            log.info("caught up with the end of every assigned partition; stopping")
        # The synchronous commit in shutdown() follows at once: the run ends committed.
        self.stopping = True

    def _at_end(self, flow: PartitionFlow) -> bool:
        """At the end of the partition as the broker last told us: an end-of-partition
        event, or everything below the high watermark cached from fetch responses (the
        event can trail the last records by a fetch wait, fetch.wait.max.ms)."""
        if flow.eof_at is not None:
            return True
        high = self.consumer.high_watermark(flow.tp)
        return flow.next_offset is not None and high is not None and flow.next_offset >= high

    def _raise_if_fatal(self) -> None:
        if self.workforce.fatal is not None:
            raise self.workforce.fatal

    # ------------------------------------------------------------------ stop
    def shutdown(self) -> None:
        """Stop fetching, finish only the batches in progress, fence the rest, commit, leave
        the group, stop the workers. Like a revocation, the time this takes is bounded by
        one batch (or revoke_timeout_s), not by how much work waits in the rings: queued
        frames are not committed, so the partitions' next owner reads them again."""
        deadline = self.clock() + self.s.supervisor.shutdown_timeout_s
        self.notifier.notify("STOPPING=1")
        for flow in self.flows.values():
            flow.drop_buffered()
            flow.paused = True
        self.consumer.pause(list(self.flows))
        if self.dead_letters is not None:
            # Dead letters on their way: a short wait lets their records be committed now.
            until = min(deadline, self.clock() + 2.0)
            while self.dead_letters.pending() and self.clock() < until:
                self.deliver_dead_letters()
                time.sleep(0.02)
        held = list(self.flows.values())
        self.assignment.release(list(self.flows), commit=True)
        self.report_final(held)
        # Leaves the group; nothing is assigned to revoke any more. Bounded: SIGTERM must
        # end the process within shutdown_timeout_s whatever the group is doing.
        self.consumer.close(max(1.0, deadline - self.clock()))
        self.workforce.stop_all(max(1.0, deadline - self.clock()), drain=self._drain_all_quietly)
        restarts = sum(life.restarts for life in self.workforce.lives)
        log.info("supervisor stopped", extra={"records": self.totals.records, "restarts": restarts})

    def _drain_all_quietly(self) -> None:
        for h in self.pool.handles:
            if h.results is not None:
                h.results.read()

    def report_final(self, flows: list[PartitionFlow] | None = None) -> None:
        self.report_if_due(force=True, flows=flows)
        self.final_status = self.latest_status


@dataclass
class RunResult:
    exit_code: int
    final_status: StatusSnapshot | None
    consumer_abandoned: bool
    error: RingmasterError | None = None


def worker_spec(settings: Settings, segments: SegmentSet) -> Callable[[int, int, str], WorkerSpec]:
    dl = settings.dead_letter

    def spec(index: int, incarnation: int, segment_path: str) -> WorkerSpec:
        return WorkerSpec(
            index=index, incarnation=incarnation, segment_path=segment_path,
            epochs_path=str(segments.dir / f"{segments.prefix}epochs"),
            plugin=settings.workers.plugin, settings=dict(settings.workers.settings),
            output_topic=settings.output.topic, dead_letter_topic=dl.topic,
            producer_props=producer_properties(settings), max_attempts=dl.max_attempts,
            retry_backoff_s=dl.retry_backoff_s, retry_backoff_max_s=dl.retry_backoff_max_s,
            parent_pid=os.getpid(), delivery_timeout_s=settings.output.delivery_timeout_s,
            max_message_bytes=max_message_bytes(settings), log_level=settings.supervisor.log_level,
            log_format=settings.supervisor.log_format)
    return spec


def run_daemon(settings: Settings, on_status: Callable[[StatusSnapshot], None] | None = None,
               on_started: Callable[[Supervisor], None] | None = None) -> RunResult:
    """Everything ``ringmaster run`` does: own the resources (shared memory, workers, the
    consumer), run the supervisor, and release every resource on every exit path
    (invariant 7). Errors the user must act on come back in RunResult, not as exceptions."""
    sup = settings.supervisor
    segments: SegmentSet | None = None
    epochs: EpochTable | None = None
    pool: WorkerPool | None = None
    consumer: GroupConsumer | None = None
    supervisor: Supervisor | None = None
    admin: AdminServer | None = None
    try:
        status_file = StatusFile(sup.status_file)  # a bad directory is a config error: before anything
        reclaim_stale(sup.shm_dir)
        w = settings.workers
        check_space(sup.shm_dir, w.processes * (w.ring_bytes + 4096) + 8 * sup.max_partitions)
        segments = SegmentSet(sup.shm_dir)
        epochs = EpochTable(segments.create("epochs", 8 * sup.max_partitions).buf)
        pool = WorkerPool(segments, w.processes, w.ring_bytes, w.start_method,
                          worker_spec(settings, segments))
        consumer = GroupConsumer(consumer_properties(settings))
        desk = None
        if settings.dead_letter.topic is not None:
            desk = DeadLetterDesk(settings.dead_letter.topic,
                                  lambda: OutputProducer(producer_properties(settings)),
                                  max_message_bytes(settings), time.monotonic,
                                  settings.output.retry_backoff_s, settings.output.retry_backoff_max_s)
        pauses = OperatorPauses.for_settings(settings) if settings.control.enabled else None
        holder: list[Supervisor] = []
        metrics = RuntimeMetrics(lambda: holder[0].latest_status if holder else None,
                                 settings.admin.partition_metrics,
                                 lambda: holder[0].loop_age() if holder else None)
        supervisor = Supervisor(settings, consumer, pool, epochs, on_status=on_status,
                                dead_letters=desk, pauses=pauses, metrics=metrics, status_file=status_file)
        holder.append(supervisor)
        if settings.admin.listen:
            sv = supervisor
            admin = AdminServer(settings.admin.listen, settings.admin.allow_remote, metrics,
                                lambda: sv.latest_status, sv.health, sv.ready).start()
        if on_started is not None:
            on_started(supervisor)
        code = supervisor.run()
        return RunResult(code, supervisor.final_status, consumer.abandoned)
    except RingmasterError as exc:
        final = supervisor.final_status if supervisor is not None else None
        return RunResult(exc.exit_code, final, consumer.abandoned if consumer is not None else False, exc)
    finally:
        if admin is not None:
            admin.close()
        if supervisor is not None and supervisor.pauses is not None:
            supervisor.pauses.close()
        if consumer is not None:
            try:
                consumer.close(5.0)
            except Exception:  # already failing; the group will time us out
                log.debug("consumer close failed", exc_info=True)
        if supervisor is not None and supervisor.dead_letters is not None:
            supervisor.dead_letters.close(2.0)
        if pool is not None:
            if any(h.process is not None for h in pool.handles):
                pool.stop_all(2.0)
            pool.kill_strays()
            pool.close()
        if epochs is not None:
            epochs.release()
        if segments is not None:
            segments.unlink_all()


def _usage(pid: int | None) -> tuple[int | None, float | None]:
    """(RSS bytes, CPU seconds) of a process, or Nones if it is gone."""
    if pid is None:
        return None, None
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            t = proc.cpu_times()
            return proc.memory_info().rss, t.user + t.system
    except psutil.Error:
        return None, None
