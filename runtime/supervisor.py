"""The supervisor: one thread, one loop, every decision about fetching, dispatch, fencing,
pausing and committing taken in one place, so the races between them cannot happen.

    broker ─consume()─▶ runs per partition ─▶ cut batches (pack frames) ─▶ pending ─▶ worker rings
                                                                      (pause when full)
    worker result pipes ─▶ offset trackers ─▶ commit (async, periodic; sync on revoke/stop)

Rebalance callbacks run inside ``consume()`` on this same thread. Signal handlers only
enqueue; the loop handles them between steps.

Runs in: the supervisor process.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import queue
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess.connection
import psutil

from runtime.board import EpochTable
from runtime.config import Settings, consumer_properties, producer_properties
from runtime.deadletter import dead_letter_headers
from runtime.errors import PluginError, RingmasterError, WorkerCrashLoop
from runtime.flow import TP, Batch, PartitionFlow, SlotTable, wants_pause
from runtime.frames import (
    BLOCKED,
    DONE,
    FATAL,
    FENCED,
    STOP_FRAME,
    decode_frame,
    decode_result,
    encode_batch,
)
from runtime.kafka import PACK, Fetched, GroupConsumer, OutputProducer, Run, fields_of, offset_of, pack_run
from runtime.pool import WorkerHandle, WorkerPool, describe_exit
from runtime.shm import SegmentSet, check_space, reclaim_stale
from runtime.systemd import Notifier
from runtime.worker import EXIT_PLUGIN, WorkerSpec

log = logging.getLogger("ringmaster.supervisor")

_RECONCILE_S = 1.0  # invariant 4: a runnable partition is fetching again within this
_WATCH_S = 2.0  # psutil checks of worker memory
_CRASH_LOOP_LIMIT = 5  # deaths before becoming ready, in a row, before we give up
_GC_THRESHOLD = 50_000  # young-generation GC threshold in the supervisor (see start())
_MAX_RECORDS_PER_TICK = 20_000  # one consume() call, at most
_MIN_RECORDS_PER_TICK = 100  # ... and at least, even with full rings (amortises a tick)
_FRAMES_PER_RING = 16  # frames are sized to hold about 1/16 of a ring (see _cut())


@dataclass
class Totals:
    records: int = 0
    outputs: int = 0
    dead_letters: int = 0
    batches: int = 0
    restarts: int = 0
    consumed: int = 0


class Supervisor:
    def __init__(self, settings: Settings, on_status: Callable[[dict[str, Any]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.s = settings
        self.w = settings.workers
        self.clock = clock
        self.on_status = on_status
        self.flows: dict[TP, PartitionFlow] = {}
        self.by_slot: dict[int, PartitionFlow] = {}
        self.totals = Totals()
        self.per_worker_records: dict[int, int] = {}
        self.fatal: RingmasterError | None = None
        self._signals: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._stop_requested = False
        self._assigned_once = False
        self._next_batch_id = 1
        self._last_commit = self._last_reconcile = self._last_watch = self._last_status = 0.0
        self._last_records_at = 0.0
        self._started_at = 0.0
        self._first_record_at: float | None = None
        # CPU seconds (supervisor, each worker pid) when the first record arrived: status
        # reports CPU per record over the processing window, start-up and joins excluded.
        self._cpu_at_first_record: tuple[float, dict[int, float]] = (0.0, {})
        self._dlq: OutputProducer | None = None
        self._notifier = Notifier()
        self._last_watchdog = 0.0
        self.consumer: GroupConsumer | None = None
        self.segments: SegmentSet | None = None
        self.pool: WorkerPool | None = None
        self.committed: dict[TP, int] = {}
        self.revocations: list[dict[str, Any]] = []  # the last 100, for status and tests
        self._touched: set[TP] = set()  # partitions a rebalance callback changed this tick
        self._bytes_per_record = 0.0  # moving average over all packed frames (fetch sizing)

    # ------------------------------------------------------------------ the story
    def run(self) -> int:
        """Run until stopped by a signal or (optionally) caught up. Returns the exit code."""
        self._install_signal_handlers()
        try:
            self.start()
            while not self._stop_requested:
                self.handle_signals()
                self.fetch()
                self.cut_batches()
                self.dispatch()
                self.collect_results()
                self.manage_workers()
                self.reconcile_flow()
                self.commit_if_due()
                self.report_if_due()
                self.stop_if_caught_up()
            self.shutdown()
            return 0
        finally:
            self.cleanup()

    # ------------------------------------------------------------------ start
    def start(self) -> None:
        self._started_at = self._last_records_at = self.clock()
        reclaim_stale(self.s.supervisor.shm_dir)
        check_space(self.s.supervisor.shm_dir,
                    self.w.processes * (self.w.ring_bytes + 4096) + 8 * self.s.supervisor.max_partitions)
        self.segments = SegmentSet(self.s.supervisor.shm_dir)
        epochs_seg = self.segments.create("epochs", 8 * self.s.supervisor.max_partitions)
        self.epochs = EpochTable(epochs_seg.buf)
        self.slots = SlotTable(self.epochs)
        self.pool = WorkerPool(self.segments, self.w.processes, self.w.ring_bytes,
                               self.w.start_method, self._worker_spec)
        # INVARIANT: workers are started before the consumer exists and later ones with
        # spawn/forkserver only: a fork after librdkafka starts its threads is unsafe.
        for h in self.pool.handles:
            self.pool.spawn_worker(h)
        self.consumer = GroupConsumer(consumer_properties(self.s))
        self.consumer.subscribe(self.s.kafka.topics, self.on_assign, self.on_revoke, self.on_lost)
        # Every fetched record is a Message the cyclic GC tracks. With the default
        # threshold (700 net allocations) a collection runs inside nearly every consume()
        # and walks thousands of live Messages: 1,139 collections and 100-130 ns per
        # record on trivial work. Messages die once packed, so net allocations stay far
        # below _GC_THRESHOLD and young collections all but stop; garbage cycles (rare
        # here) are still collected once that many objects pile up. Freezing what
        # start-up built (modules, config, clients) keeps full collections short.
        gc.freeze()
        gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])
        self._notifier.notify("READY=1", f"STATUS=consuming {', '.join(self.s.kafka.topics)}")
        log.info("supervisor started", extra={
            "group": self.s.kafka.group_id, "topics": ",".join(self.s.kafka.topics),
            "workers": self.w.processes, "plugin": self.w.plugin, "pid": os.getpid(),
            "frame_packer": "C" if PACK.in_c else f"Python ({PACK.why_python})"})

    def _worker_spec(self, index: int, incarnation: int, segment_path: str) -> WorkerSpec:
        assert self.segments is not None
        dl = self.s.dead_letter
        return WorkerSpec(
            index=index, incarnation=incarnation, segment_path=segment_path,
            epochs_path=str(self.segments.dir / f"{self.segments.prefix}epochs"),
            plugin=self.w.plugin, settings=dict(self.w.settings),
            output_topic=self.s.output.topic, dead_letter_topic=dl.topic,
            producer_props=producer_properties(self.s), max_attempts=dl.max_attempts,
            retry_backoff_s=dl.retry_backoff_s, retry_backoff_max_s=dl.retry_backoff_max_s,
            parent_pid=os.getpid(), log_level=self.s.supervisor.log_level,
            log_format=self.s.supervisor.log_format)

    # ------------------------------------------------------------------ signals
    def _install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Handlers only enqueue: no logging, no raising inside a signal handler.
            signal.signal(sig, lambda signum, _frame: self._signals.put_nowait(signum))

    def handle_signals(self) -> None:
        while not self._signals.empty():
            signum = self._signals.get_nowait()
            log.info("stop requested", extra={"signal": signal.Signals(signum).name})
            self._stop_requested = True

    # ------------------------------------------------------------------ fetch
    def fetch(self) -> None:
        assert self.consumer is not None
        wait_s = self.w.batch_max_wait_ms / 1000
        fetching = not self._assigned_once or any(not f.paused for f in self.flows.values())
        self._touched.clear()
        fetched = self.consumer.consume(self._records_wanted(), wait_s if fetching else 0)
        if self._touched:
            self._settle_rebalance(fetched)
        if not fetching:
            # Everything is paused: sleep on the result pipes and worker deaths instead.
            self._wait_for_workers(wait_s)
        self._raise_if_fatal()
        now = self.clock()
        if fetched.count:
            self._last_records_at = now
            if self._first_record_at is None:
                self._first_record_at = now
                self._cpu_at_first_record = self._cpu_snapshot()
            self.totals.consumed += fetched.count
        for tp, run in fetched.runs.items():
            flow = self.flows.get(tp)
            if flow is None:
                continue  # partition revoked meanwhile: not ours to process or commit
            if flow.open_msgs:
                flow.open_msgs.extend(run)
            else:
                flow.open_msgs = run
                flow.open_since = now
            flow.consumed += len(run)
            flow.next_offset = offset_of(run[-1]) + 1
            flow.eof_at = None
            flow.last_activity = now
        for tp, offset in fetched.eof.items():
            flow = self.flows.get(tp)
            # RACE: one consume() can return a partition's last records and its EOF event
            # together (records applied above); an EOF counts only if nothing newer came after it.
            if flow is not None and (flow.next_offset is None or offset >= flow.next_offset):
                flow.eof_at = offset
                flow.last_activity = now

    def _records_wanted(self) -> int:
        """How many records one consume() may return: up to a batch per assigned partition
        (fewer ticks per record), but not much more than the rings have room for. What does
        not fit waits as pending frames, which count towards the pause rule, and a pause
        makes librdkafka drop what it had prefetched for the partition and fetch it again.
        With 10 KiB records a tick of 4,000 records was 20 MB against 8 MiB rings."""
        assert self.pool is not None
        want = min(_MAX_RECORDS_PER_TICK, self.w.batch_max_records * max(1, len(self.flows)))
        if self._bytes_per_record:
            room = sum(max(0.0, self.w.pause_above - fill) * h.ring.capacity
                       for h, fill in zip(self.pool.handles, self._backlog_fills(), strict=True))
            want = min(want, max(_MIN_RECORDS_PER_TICK, int(room / self._bytes_per_record)))
        return want

    def _settle_rebalance(self, fetched: Fetched) -> None:
        """RACE: rebalance callbacks run inside consume(), and the records it returns may
        straddle them (confluent-kafka-python#1013): a partition revoked and assigned again
        during one call gets records fetched under the old assignment (past the commit) and
        then records restarting at the committed offset. Drop what this call returned for
        every partition a callback touched, and start the ones we now own at their committed
        offset; the seek also purges what librdkafka had queued for them."""
        assert self.consumer is not None
        for tp in self._touched:
            fetched.runs.pop(tp, None)
            fetched.eof.pop(tp, None)
        fetched.count = sum(len(r) for r in fetched.runs.values())
        owned = [tp for tp in self._touched if tp in self.flows]
        self.consumer.seek_to_start(owned)
        log.debug("rebalance settled", extra={"restarted": len(owned)})

    def _wait_for_workers(self, timeout_s: float) -> None:
        assert self.pool is not None
        waitables = self.pool.result_fds() + self.pool.sentinels()
        if waitables:
            multiprocess.connection.wait(waitables, timeout_s)
        else:
            time.sleep(timeout_s)

    # ------------------------------------------------------------------ batching
    def cut_batches(self) -> None:
        """Turn fetched records into frames: when a batch is full, old enough, or its worker
        has nothing to do (adaptive batching: small batches only when they cost nothing)."""
        assert self.pool is not None
        now = self.clock()
        max_wait = self.w.batch_max_wait_ms / 1000
        for flow in self.flows.values():
            if not flow.open_msgs:
                continue
            ring = self.pool.handles[flow.worker].ring
            if (len(flow.open_msgs) >= flow.batch_records
                    or now - flow.open_since >= max_wait
                    or (ring.used_bytes() == 0 and not flow.pending)):
                self._cut(flow, ring.max_frame, ring.capacity)

    def _cut(self, flow: PartitionFlow, max_frame: int, capacity: int) -> None:
        msgs, flow.open_msgs = flow.open_msgs, []
        step = flow.batch_records
        for i in range(0, len(msgs), step):
            self._enqueue(flow, msgs, i, min(i + step, len(msgs)), max_frame)
        # Adaptive batch size: as many records as fit in a sixteenth of the ring (never more
        # than half the largest frame) at the size records of this partition had lately,
        # learnt from packed frames: no per-record counting. Small frames against the ring
        # keep the pause rule fine-grained: with half-frame batches, 10 KiB records made
        # 2 MiB frames and an 8 MiB ring refused the next one at 75 % full.
        target = min(max_frame // 2, capacity // _FRAMES_PER_RING)
        flow.batch_records = max(1, min(self.w.batch_max_records,
                                        int(target / max(flow.bytes_per_record, 1.0))))

    def _enqueue(self, flow: PartitionFlow, msgs: Run, start: int, stop: int, max_frame: int) -> None:
        """Pack msgs[start:stop] into one frame and queue it for the partition's ring."""
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        count = stop - start
        frame = pack_run(batch_id, flow.slot, flow.epoch, flow.tp[0], flow.tp[1], msgs, start, stop)
        size = len(frame) / count
        flow.bytes_per_record = _moving_average(flow.bytes_per_record, size)
        self._bytes_per_record = _moving_average(self._bytes_per_record, size)
        first = offset_of(msgs[start])
        if len(frame) > max_frame:
            if count > 1:
                self._next_batch_id -= 1
                mid = start + count // 2
                self._enqueue(flow, msgs, start, mid, max_frame)
                self._enqueue(flow, msgs, mid, stop, max_frame)
                return
            flow.tracker.register(batch_id, first, first)
            self._dead_letter_in_supervisor(flow, batch_id, fields_of(msgs[start]), "RecordTooLarge",
                                            f"record of {len(frame)} bytes does not fit in a ring "
                                            f"(frame limit {max_frame}); raise workers.ring_bytes")
            return
        last = offset_of(msgs[stop - 1])
        flow.tracker.register(batch_id, first, last)
        flow.pending.append(Batch(batch_id, flow.tp, flow.slot, flow.epoch, first, last, count, frame))

    def dispatch(self) -> None:
        """Move pending batches into rings while there is room; never block (invariant 3)."""
        assert self.pool is not None
        rung: set[int] = set()
        for flow in self.flows.values():
            if not flow.pending or flow.blocked is not None:
                continue
            h = self.pool.handles[flow.worker]
            if not h.accepting or self._batch_budget_spent(h):
                continue
            while flow.pending and not self._batch_budget_spent(h):
                batch = flow.pending[0]
                if not h.ring.try_write(batch.frame):  # frames are cut below max_frame
                    break
                flow.pending.popleft()
                h.in_flight[batch.batch_id] = batch
                rung.add(h.index)
        for i in rung:
            bell = self.pool.handles[i].bell
            if bell is not None:
                bell.ring()

    # ------------------------------------------------------------------ results
    def collect_results(self, timeout_s: float = 0.0) -> None:
        assert self.pool is not None
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
            self._on_result(h, message)

    def _on_result(self, h: WorkerHandle, data: bytes) -> None:
        r = decode_result(data)
        batch = h.in_flight.pop(r.batch_id, None)
        if r.kind == FATAL:
            self.fatal = PluginError(r.detail)
            return
        flow = self.by_slot.get(r.slot)
        current = flow is not None and flow.epoch == r.epoch
        if r.kind == DONE:
            h.consecutive_crashes = 0
            h.deaths_before_ready = 0
            self.totals.batches += 1
            self.totals.records += r.processed
            self.totals.outputs += r.outputs
            self.totals.dead_letters += r.dead_letters
            self.per_worker_records[h.index] = self.per_worker_records.get(h.index, 0) + r.processed
            # INVARIANT (1, 5): a batch that began before its partition was fenced (the worker
            # checks the epoch under its lock first) and ran to the end while the revocation
            # waited for it counts, whatever its epoch: that is the batch the revocation waits
            # for, so that it commits it. Releasing a flow deletes its batches in flight, so a
            # late result of a released flow (or of a slot now reused) completes nothing.
            if flow is not None and batch is not None and batch.tp == flow.tp:
                flow.tracker.complete(r.batch_id)
                flow.records_done += r.processed
                flow.outputs += r.outputs
                flow.dead_letters += r.dead_letters
        elif r.kind == BLOCKED and current and flow is not None and flow.blocked is None:
            flow.blocked = r.detail or "a record failed and no dead-letter topic is configured"
            log.error("partition stopped at a failing record (no [dead_letter] topic); "
                      "fix the plugin or configure one, then restart",
                      extra={"tp": flow.label, "reason": flow.blocked})
        elif r.kind == FENCED or batch is None:
            pass  # a frame of a revoked partition, skipped by the worker: nothing to do

    # ------------------------------------------------------------------ workers
    def manage_workers(self) -> None:
        """Reap the dead, restart when their backoff is over, enforce deadlines, recycle."""
        assert self.pool is not None
        for h in self.pool.dead():
            self._on_worker_death(h)
        self._raise_if_fatal()
        now = self.clock()
        for h in self.pool.handles:
            if h.process is None and h.restart_at is not None and now >= h.restart_at:
                self.totals.restarts += 1
                self.pool.spawn_worker(h)
            elif h.alive:
                self._enforce_deadline(h, now)
        check_rss = bool(self.w.max_rss_mb) and now - self._last_watch >= _WATCH_S
        if check_rss:
            self._last_watch = now
        if check_rss or self.w.max_batches:
            self._recycle_if_needed(check_rss)

    def _enforce_deadline(self, h: WorkerHandle, now: float) -> None:
        assert self.pool is not None
        if h.board.busy_for_s <= self.w.batch_timeout_s:
            return
        if h.term_sent_at is None:
            log.error("batch exceeded its deadline; stopping the worker", extra={
                "worker": h.index, "pid": h.pid, "deadline_s": self.w.batch_timeout_s})
            self.pool.kill(h, signal.SIGTERM)
            h.term_sent_at = now
        elif now - h.term_sent_at > 2.0:
            self.pool.kill(h, signal.SIGKILL)

    def _batch_budget_spent(self, h: WorkerHandle) -> bool:
        """Has this incarnation been given its max_batches (done, or queued in its ring)?
        Then it gets no more frames, and the STOP frame that recycles it comes right after
        its last batch instead of behind a ring's worth of more work."""
        return bool(self.w.max_batches) and h.board.batches + len(h.in_flight) >= self.w.max_batches

    def _recycle_if_needed(self, check_rss: bool) -> None:
        """Replace workers past their memory or batch budget, between batches: a STOP frame
        goes behind the work already in the ring and nothing more is written after it."""
        assert self.pool is not None
        for h in self.pool.handles:
            if not h.alive or h.retiring or not h.board.ready:
                continue
            reason = None
            if self._batch_budget_spent(h):
                reason = f"{h.board.batches} batches done, {len(h.in_flight)} more in its ring"
            elif check_rss:
                try:
                    rss_mb = psutil.Process(h.pid).memory_info().rss / 2**20
                except psutil.Error:
                    continue
                if rss_mb > self.w.max_rss_mb:
                    reason = f"RSS {rss_mb:.0f} MiB over {self.w.max_rss_mb} MiB"
            if reason and h.ring.try_write(STOP_FRAME):
                h.retiring = True
                if h.bell is not None:
                    h.bell.ring()
                log.info("recycling worker", extra={"worker": h.index, "pid": h.pid, "why": reason})

    def _on_worker_death(self, h: WorkerHandle) -> None:
        assert self.pool is not None
        self._drain_results(h)  # acknowledgements sent before death still count
        was_ready, retiring = h.board.ready, h.retiring
        crashed_batch, _ = h.board.current
        pid = h.pid
        code = self.pool.forget(h)
        level, words = describe_exit(code)
        if code == EXIT_PLUGIN:
            self.fatal = self.fatal or PluginError(f"worker could not load plugin {self.w.plugin!r}")
            return
        if retiring and code == 0:
            log.info("worker recycled", extra={"worker": h.index, "pid": pid})
            h.restart_at = self.clock()
        else:
            if self._stop_requested:
                level = min(level, logging.WARNING)
            log.log(level, f"worker {words}", extra={
                "worker": h.index, "pid": pid, "exitcode": code, "batches_in_flight": len(h.in_flight)})
            h.deaths_before_ready = 0 if was_ready else h.deaths_before_ready + 1
            if h.deaths_before_ready >= _CRASH_LOOP_LIMIT:
                self.fatal = WorkerCrashLoop(
                    f"worker {h.index} died {h.deaths_before_ready} times before becoming ready "
                    f"({words}); check the plugin {self.w.plugin!r} and the worker's log")
                return
            h.consecutive_crashes += 1
            backoff = min(self.w.restart_backoff_s * 2 ** (h.consecutive_crashes - 1),
                          self.w.restart_backoff_max_s)
            h.restart_at = self.clock() + backoff
        if crashed_batch and crashed_batch in h.in_flight:
            h.in_flight[crashed_batch].crashes += 1
        self._redeliver(h, words)

    def _redeliver(self, h: WorkerHandle, why: str) -> None:
        """Put a dead worker's unacknowledged batches back in front of their partitions'
        queues, in their original order, so the next incarnation sees them again."""
        batches, h.in_flight = list(h.in_flight.values()), {}
        per_flow: dict[TP, list[Batch]] = {}
        for b in batches:
            flow = self.flows.get(b.tp)
            if flow is not None and flow.epoch == b.epoch:
                per_flow.setdefault(b.tp, []).extend(self._isolate(flow, b, why, h))
        for tp, items in per_flow.items():
            self.flows[tp].pending.extendleft(reversed(items))

    def _isolate(self, flow: PartitionFlow, b: Batch, why: str, h: WorkerHandle) -> list[Batch]:
        """A batch that crashed workers max_crashes times is bisected; a single record that
        does is dead-lettered with the exit status as the reason (invariant 8)."""
        if b.crashes < self.s.dead_letter.max_crashes:
            return [b]
        h.consecutive_crashes = 0  # isolation is progress: do not back off further
        frame = decode_frame(b.frame)
        assert frame is not None
        cols = frame.columns
        if len(cols) == 1:
            self._dead_letter_in_supervisor(flow, b.batch_id, cols.row(0), "WorkerCrashed",
                                            f"worker {why} while processing this record "
                                            f"({b.crashes} times)", attempts=b.crashes)
            return []
        mid = len(cols) // 2
        halves = []
        for part in (cols.slice(0, mid), cols.slice(mid, len(cols))):
            bid = self._next_batch_id
            self._next_batch_id += 1
            frame_bytes = encode_batch(bid, flow.slot, flow.epoch, flow.tp[0], flow.tp[1], part)
            halves.append(Batch(bid, flow.tp, flow.slot, flow.epoch, part.first, part.last,
                                len(part), frame_bytes, crashes=self.s.dead_letter.max_crashes - 1))
        flow.tracker.split(b.batch_id, [(x.batch_id, x.first, x.last) for x in halves])
        log.warning("bisecting a batch that keeps crashing workers", extra={
            "tp": flow.label, "first": b.first, "last": b.last})
        return halves

    def _dead_letter_in_supervisor(self, flow: PartitionFlow, batch_id: int,
                                   row: tuple[int, bytes | None, bytes | None, Any],
                                   error_type: str, message: str, attempts: int = 1) -> None:
        """row: (offset, key, value, headers) of the record."""
        topic = self.s.dead_letter.topic
        if topic is None:
            flow.blocked = f"offset {row[0]}: {error_type}: {message}"
            log.error("partition stopped at a failing record (no [dead_letter] topic)",
                      extra={"tp": flow.label, "reason": flow.blocked})
            return
        if self._dlq is None:
            self._dlq = OutputProducer(producer_properties(self.s))
        headers = dead_letter_headers(row[3], error_type=error_type, message=message, traceback="",
                                      topic=flow.tp[0], partition=flow.tp[1], offset=row[0],
                                      attempts=attempts, worker="supervisor")
        self._dlq.produce(topic, row[2], row[1], headers)
        self._dlq.flush()  # INVARIANT: acknowledged by the broker before it counts as handled
        flow.tracker.complete(batch_id)
        flow.dead_letters += 1
        self.totals.dead_letters += 1
        log.error("record dead-lettered", extra={"tp": flow.label, "offset": row[0],
                                                 "error": f"{error_type}: {message}"})

    def _raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    # ------------------------------------------------------------------ rebalances
    def on_assign(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback (inside consume()), after the client assigned tps."""
        assert self.pool is not None and self.consumer is not None
        self._assigned_once = True
        self._touched.update(tps)
        now = self.clock()
        for tp in tps:
            if tp in self.flows:
                continue
            slot = self.slots.acquire()
            owner = min(self.pool.handles, key=lambda h: (len(h.partitions), h.index))
            owner.partitions.add(tp)
            flow = PartitionFlow(tp, slot, self.slots.fence(slot), owner.index,
                                 batch_records=self.w.batch_max_records,
                                 last_activity=now, last_resume=now)
            self.flows[tp] = flow
            self.by_slot[slot] = flow
        # INVARIANT (4): librdkafka starts every newly assigned partition fetching; the
        # runtime's own decision is re-applied at once, so a member whose rings are full
        # gets no extra batch because of a rebalance.
        new = [self.flows[tp] for tp in tps]
        fills = self._backlog_fills()
        for flow in new:
            flow.paused = self._wants_pause(flow, fills)
        self.consumer.pause([f.tp for f in new if f.paused])
        log.info("partitions assigned", extra={
            "partitions": ",".join(f.label for f in new), "paused": sum(f.paused for f in new)})

    def on_revoke(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. Fence, wait only for batches in progress, commit."""
        self._release_partitions(tps, commit=True)

    def on_lost(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. The partitions are already someone else's: fence
        and wait as for a revocation, but commit nothing (it would be refused)."""
        self._release_partitions(tps, commit=False)

    def _release_partitions(self, tps: list[TP], commit: bool) -> None:
        assert self.pool is not None and self.consumer is not None
        started = self.clock()
        self._touched.update(tps)
        flows = [self.flows[tp] for tp in tps if tp in self.flows]
        if not flows:
            return
        for flow in flows:
            flow.epoch = self.slots.fence(flow.slot)
        slots = {f.slot for f in flows}
        waits: dict[int, int] = {}  # worker index -> batch in progress of a revoked partition
        for h in {self.pool.handles[f.worker] for f in flows}:
            if not h.alive:
                continue
            busy = self._batch_in_progress(h)
            if busy is None or busy[1] in slots:
                waits[h.index] = busy[0] if busy else -1
        deadline = started + self.s.supervisor.revoke_timeout_s
        while waits and self.clock() < deadline:
            self.collect_results(min(0.05, max(0.0, deadline - self.clock())))
            for i, batch_id in list(waits.items()):
                h = self.pool.handles[i]
                if not h.alive or (batch_id != -1 and batch_id not in h.in_flight):
                    del waits[i]
        for i in waits:
            # INVARIANT (5): no worker touches a record of a revoked partition after this
            # returns; one that will not let go in time is killed (and restarted later).
            h = self.pool.handles[i]
            log.error("worker still busy on a revoked partition after revoke_timeout; killing it",
                      extra={"worker": i, "pid": h.pid})
            self.pool.kill(h)
            if h.process is not None:
                h.process.join(5)
        # What invariant 5 bounds: fencing and the batch in progress. The commit that
        # follows is a broker round trip (slower while the group is rebalancing).
        fenced_ms = round((self.clock() - started) * 1000, 1)
        if commit:
            self._commit([f for f in flows], asynchronous=False)
        for flow in flows:
            del self.flows[flow.tp]
            del self.by_slot[flow.slot]
            self.slots.release(flow.slot)
            h = self.pool.handles[flow.worker]
            h.partitions.discard(flow.tp)
            for bid in [b for b, batch in h.in_flight.items() if batch.tp == flow.tp]:
                del h.in_flight[bid]  # the worker will skip these frames (stale epoch)
        took_ms = round((self.clock() - started) * 1000, 1)
        self.revocations = [*self.revocations[-99:], {
            "ms": took_ms, "fenced_ms": fenced_ms, "end_ns": time.monotonic_ns(),
            "partitions": [f.label for f in flows]}]
        log.info("partitions revoked" if commit else "partitions lost", extra={
            "partitions": ",".join(f.label for f in flows), "took_ms": took_ms})

    def _batch_in_progress(self, h: WorkerHandle) -> tuple[int, int] | None:
        """(batch, slot) the worker is processing, (0, -1) when idle, None if unknown.
        Read under the worker's lock: see the RACE note in worker.py."""
        if h.lock is None or not h.lock.acquire(timeout=1.0):
            return None
        try:
            return h.board.current
        finally:
            h.lock.release()

    # ------------------------------------------------------------------ flow control
    def _backlog_fills(self) -> list[float]:
        """Per worker: (bytes in its ring + bytes of frames waiting for it) / ring capacity;
        1.0 for a worker that takes no frames now (dead, restarting, retiring)."""
        assert self.pool is not None
        pending = [0] * len(self.pool.handles)
        for f in self.flows.values():
            if f.pending:
                pending[f.worker] += f.pending_bytes
        return [(h.ring.used_bytes() + pending[h.index]) / h.ring.capacity if h.accepting else 1.0
                for h in self.pool.handles]

    def _wants_pause(self, flow: PartitionFlow, fills: list[float]) -> bool:
        return wants_pause(flow, fills[flow.worker], self.w.pause_above, self.w.resume_below)

    def reconcile_flow(self) -> None:
        """Apply pause/resume decisions, and guard against a client that lost one: a
        partition that should be fetching but has shown no activity for a second is
        resumed again (librdkafka#5591), and paused ones are re-paused."""
        assert self.consumer is not None
        now = self.clock()
        pause, resume = [], []
        fills = self._backlog_fills()
        for flow in self.flows.values():
            want = self._wants_pause(flow, fills)
            if want != flow.paused:
                flow.paused = want
                (pause if want else resume).append(flow)
                if not want:
                    flow.last_resume = flow.last_activity = now
        if now - self._last_reconcile >= _RECONCILE_S:
            self._last_reconcile = now
            for flow in self.flows.values():
                if flow.paused and flow not in pause:
                    pause.append(flow)
                elif (not flow.paused and flow.eof_at is None and flow not in resume
                      and now - flow.last_activity >= _RECONCILE_S
                      and now - flow.last_resume >= _RECONCILE_S):
                    flow.last_resume = now
                    resume.append(flow)
        self.consumer.pause([f.tp for f in pause])
        self.consumer.resume([f.tp for f in resume])

    # ------------------------------------------------------------------ commits
    def commit_if_due(self) -> None:
        now = self.clock()
        if now - self._last_commit >= self.s.supervisor.commit_interval_ms / 1000:
            self._last_commit = now
            self._commit(list(self.flows.values()), asynchronous=True)

    def _commit(self, flows: list[PartitionFlow], asynchronous: bool) -> None:
        assert self.consumer is not None
        for tp, offset in self.consumer.take_refused_commits().items():
            flow = self.flows.get(tp)
            if flow is not None and flow.tracker.committed == offset:
                flow.tracker.mark_committed(None)  # send it again
        # INVARIANT (1): only the tracker's committable offset is ever committed.
        offsets = {f.tp: f.tracker.committable for f in flows if f.tracker.needs_commit()}
        if not offsets:
            return
        if self.consumer.commit(offsets, asynchronous):  # type: ignore[arg-type]
            for f in flows:
                if f.tp in offsets:
                    f.tracker.mark_committed(offsets[f.tp])  # type: ignore[arg-type]
                    self.committed[f.tp] = offsets[f.tp]  # type: ignore[assignment]

    # ------------------------------------------------------------------ status
    def _cpu_snapshot(self) -> tuple[float, dict[int, float]]:
        assert self.pool is not None
        workers = {}
        for h in self.pool.handles:
            cpu_s = _usage(h.pid)[1] if h.alive else None
            if cpu_s is not None:
                workers[h.pid] = cpu_s
        return _usage(os.getpid())[1] or 0.0, workers

    def status(self) -> dict[str, Any]:
        assert self.pool is not None and self.consumer is not None
        now = self.clock()
        elapsed = max(now - self._started_at, 1e-9)
        first = self._first_record_at
        working = max(now - first, 1e-9) if first is not None else elapsed
        parts = []
        for f in sorted(self.flows.values(), key=lambda f: f.tp):
            high = self.consumer.high_watermark(f.tp)
            done = f.tracker.committable
            parts.append({"tp": f.label, "worker": f.worker, "paused": f.paused, "blocked": f.blocked,
                          "committed": f.tracker.committed, "done_through": done, "high": high,
                          "lag": None if high is None else max(high - (done or 0), 0),
                          "pending_batches": len(f.pending), "records": f.records_done,
                          "consumed": f.consumed})
        workers = []
        for h in self.pool.handles:
            rss, cpu_s = _usage(h.pid) if h.alive else (None, None)
            workers.append({"index": h.index, "pid": h.pid, "alive": h.alive, "cpu_s": cpu_s,
                            "records": self.per_worker_records.get(h.index, 0),
                            "in_flight": len(h.in_flight), "ring_fill": round(h.ring.fill(), 3),
                            "restarts": h.incarnation - 1, "rss": rss,
                            "heartbeat_age_s": round(h.board.heartbeat_age_s, 3) if h.alive else None})
        t = self.totals
        my_rss, my_cpu = _usage(os.getpid())
        my_cpu = my_cpu or 0.0
        sup0, workers0 = self._cpu_at_first_record
        workers_window = sum((w["cpu_s"] or 0.0) - workers0.get(w["pid"], 0.0) for w in workers)
        return {"supervisor_cpu_s": round(my_cpu, 3), "window_s": round(working, 4),
                "window_cpu_s": {"supervisor": round(my_cpu - sup0, 3) if first else 0.0,
                                 "workers": round(workers_window, 3) if first else 0.0},
                "pid": os.getpid(), "elapsed_s": round(elapsed, 3), "records": t.records,
                "join_s": round((first if first is not None else now) - self._started_at, 3),
                "rate": round(t.records / working, 1), "outputs": t.outputs,
                "dead_letters": t.dead_letters, "batches": t.batches, "consumed": t.consumed,
                "restarts": t.restarts, "paused": sum(p["paused"] for p in parts),
                "lag": sum(p["lag"] or 0 for p in parts), "partitions": parts, "workers": workers,
                "supervisor_rss": my_rss,
                "revocations": self.revocations,
                "committed": {f"{tp[0]}[{tp[1]}]": off for tp, off in sorted(self.committed.items())}}

    def report_if_due(self) -> None:
        now = self.clock()
        if self._notifier.watchdog_interval_s and now - self._last_watchdog >= \
                self._notifier.watchdog_interval_s:
            self._last_watchdog = now
            self._notifier.notify("WATCHDOG=1")
        if now - self._last_status < self.s.supervisor.status_interval_s:
            return
        self._last_status = now
        if self.on_status is None and self.s.supervisor.status_file is None:
            return
        snapshot = self.status()
        self._write_status(snapshot)
        if self.on_status is not None:
            self.on_status(snapshot)

    def _write_status(self, snapshot: dict[str, Any]) -> None:
        path = self.s.supervisor.status_file
        if path is None:
            return
        tmp = Path(f"{path}.tmp")
        tmp.write_text(json.dumps(snapshot))
        tmp.replace(path)

    def stop_if_caught_up(self) -> None:
        if not self.s.supervisor.stop_when_caught_up or not self._assigned_once:
            return
        if self.clock() - self._last_records_at < self.s.supervisor.caught_up_idle_s:
            return
        for f in self.flows.values():
            if not f.idle or f.blocked or not self._at_end(f):
                return
        # The synchronous commit in shutdown() follows at once: the run ends committed.
        log.info("caught up with the end of every assigned partition; stopping")
        self._stop_requested = True

    def _at_end(self, flow: PartitionFlow) -> bool:
        """At the end of the partition as the broker last told us: an end-of-partition
        event, or everything below the high watermark cached from fetch responses (the
        event can trail the last records by a fetch wait, fetch.wait.max.ms)."""
        if flow.eof_at is not None:
            return True
        assert self.consumer is not None
        high = self.consumer.high_watermark(flow.tp)
        return flow.next_offset is not None and high is not None and flow.next_offset >= high

    # ------------------------------------------------------------------ stop
    def shutdown(self) -> None:
        """Stop fetching, finish only the batches in progress, fence the rest, commit, leave
        the group, stop the workers. Like a revocation, the time this takes is bounded by
        one batch (or revoke_timeout_s), not by how much work waits in the rings: queued
        frames are not committed, so the partitions' next owner reads them again."""
        assert self.pool is not None and self.consumer is not None
        deadline = self.clock() + self.s.supervisor.shutdown_timeout_s
        self._notifier.notify("STOPPING=1")
        for flow in self.flows.values():
            flow.open_msgs = []
            flow.pending.clear()
            flow.paused = True
        self.consumer.pause(list(self.flows))
        self._release_partitions(list(self.flows), commit=True)
        self.report_final()
        # Leaves the group; nothing is assigned to revoke any more. Bounded: SIGTERM must
        # end the process within shutdown_timeout_s whatever the group is doing.
        self.consumer.close(max(1.0, deadline - self.clock()))
        self.pool.stop_all(max(1.0, deadline - self.clock()))
        log.info("supervisor stopped", extra={"records": self.totals.records,
                                               "restarts": self.totals.restarts})

    def report_final(self) -> None:
        snapshot = self.status()
        self.final_status = snapshot
        self._write_status(snapshot)
        if self.on_status is not None:
            self.on_status(snapshot)

    def cleanup(self) -> None:
        """Every exit path: no worker, no shared-memory segment survives (invariant 7)."""
        if self.consumer is not None:
            try:
                self.consumer.close(5.0)
            except Exception:  # already failing; the group will time us out
                log.debug("consumer close failed", exc_info=True)
        if self.pool is not None:
            if any(h.process is not None for h in self.pool.handles):
                self.pool.stop_all(2.0)
            self.pool.close()
        if getattr(self, "epochs", None) is not None:
            self.epochs.release()
        if self.segments is not None:
            self.segments.unlink_all()


def _moving_average(average: float, sample: float) -> float:
    """Bytes per record as frames are packed: recent frames count most; 0 means none yet."""
    return 0.7 * average + 0.3 * sample if average else sample


def _usage(pid: int | None) -> tuple[int | None, float | None]:
    """(RSS bytes, CPU seconds) of a process, or Nones if it is gone."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            t = proc.cpu_times()
            return proc.memory_info().rss, t.user + t.system
    except psutil.Error:
        return None, None
