"""The results room: what the workers report, what becomes of a dead worker's batches, and
where a record that cannot be processed goes. Runs in: supervisor.

    result pipes ─▶ DONE: the tracker completes the batch; counters, learnt costs
                    DEFERRED (an outage, a plugin's Backoff): the partition is rewound
                    BLOCKED (no dead-letter topic): the partition stops at the record
    worker deaths ─▶ its batches go back to their lanes; the one it was running counts a
                     crash (isolation.py: retried, bisected, dead-lettered; under
                     exactly-once the letter is a batch of its own, for a worker's transaction)
    dead-letter desk ─▶ an acknowledged dead letter completes its one-record batch

Owns each partition's ``stats`` part, the run's totals and the per-worker counts.
"""

from __future__ import annotations

import functools
import logging
import select
from collections.abc import Callable, Sequence
from typing import Any, Generic

from runtime.backoff import backoff_s
from runtime.config import OutputSettings
from runtime.execution.deadletter_format import DeadLetter
from runtime.ops.metrics import Histograms
from runtime.ops.status import Totals
from runtime.plugin import backoff_wait
from runtime.supervisor.datapath.assignment import Assignment
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.intake import BatchIds, Intake, SetAside
from runtime.supervisor.datapath.isolation import isolate, letters_batch
from runtime.supervisor.partition.partition import Partition, Partitions, PauseReason
from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import H
from runtime.supervisor.workers.workforce import Death, Workforce
from runtime.transport.frames import COMMITTED, FRESH, Result, ResultKind, decode_frame, decode_result

log = logging.getLogger("ringmaster.results")

Row = tuple[int, bytes | None, bytes | None, Any]  # (offset, key, value, headers) of one record


class Results(Generic[H]):
    def __init__(self, out: OutputSettings, max_crashes: int, partitions: Partitions, handles: Sequence[H],
                 scheduler: Scheduler, workforce: Workforce[H], assignment: Assignment, intake: Intake,
                 desk: DeadLetterDesk | None, next_id: BatchIds, histograms: Histograms | None,
                 clock: Callable[[], float]) -> None:
        self.out = out
        self.max_crashes = max_crashes  # dead_letter.max_crashes (crash isolation, isolation.py)
        self.partitions = partitions
        self.handles = handles
        self.scheduler = scheduler
        self.workforce = workforce
        self.assignment = assignment
        self.intake = intake
        self.desk = desk
        self.next_id = next_id
        self.histograms = histograms
        self.clock = clock
        self.totals = Totals()
        self.transactional = out.guarantee == "exactly-once"
        self.per_worker_records = [0] * len(workforce.lives)  # per slot (the pool may add slots)
        self.per_worker_busy_ms = [0.0] * len(workforce.lives)  # time batches took in each slot

    # ------------------------------------------------------------------ reading
    def collect(self, timeout_s: float = 0.0) -> None:
        """Apply every result that has arrived; wait up to timeout_s for one if none has.
        One select() says which pipes to read: a read per worker per tick (EAGAIN, mostly)
        cost 9 % of the supervisor on trivial work."""
        pipes = [(h.results.fd, h) for h in self.handles if h.results is not None]
        real = [fd for fd, _ in pipes if fd >= 0]  # (test fakes have no descriptor)
        ready = set(select.select(real, [], [], timeout_s)[0]) if real else set()
        for fd, h in pipes:
            if fd < 0 or fd in ready:
                self.drain(h)

    def drain(self, h: H) -> None:
        if h.results is None:
            return
        for message in h.results.read():  # at end of file the worker died: the workforce reaps it
            self._on_result(h, decode_result(message))

    def _on_result(self, h: H, r: Result) -> None:
        if r.kind is ResultKind.FATAL:
            self.workforce.on_fatal_report(h, r.detail)
            return
        if r.kind is ResultKind.HELLO:
            self.workforce.on_hello(h, r.detail)
            return
        if r.kind is ResultKind.EXHAUSTED:  # not done, not the records' fault: run again when it exits
            self.workforce.on_exhausted(h, r.batch_id, r.detail, r.cause == FRESH)
            return
        batch = self.scheduler.returned(h.index, r.batch_id)
        # INVARIANT (1, 5): a batch counts only while it is out for its partition. A batch
        # that began before its partition was fenced and ran to the end while the revocation
        # (or rewind) waited for it counts, whatever its epoch: that is the batch the
        # revocation waits for, so that it commits it. Releasing a partition forgets its
        # batches out, so a late result of one completes nothing.
        p = self.partitions.get(batch.tp) if batch is not None else None
        if self.transactional and r.kind in (ResultKind.DEFERRED, ResultKind.BLOCKED):
            self.totals.transactions_aborted += 1
        if r.kind is ResultKind.DONE:
            self._done(h, r, p)
        elif p is None:
            return
        elif r.kind is ResultKind.BLOCKED:
            self.stop_at_failing_record(p, r.detail)
        elif r.kind is ResultKind.DEFERRED:
            self._defer(p, r)

    def _done(self, h: H, r: Result, p: Partition | None) -> None:
        self.workforce.on_batch_done(h)
        self.scheduler.learn(h.index, r.busy_ms, r.processed)
        t = self.totals
        t.batches += 1
        t.transactions_committed += r.cause == COMMITTED
        t.records += r.processed
        t.outputs += r.outputs
        t.dead_letters += r.dead_letters
        t.discarded += r.discarded
        self.per_worker_records[h.index] += r.processed
        self.per_worker_busy_ms[h.index] += r.busy_ms
        if self.histograms is not None:
            self.histograms.observe_batch(r.busy_ms / 1000)
        if p is None:
            return
        p.tracker.complete(r.batch_id)
        self.intake.learn_cost(p, r.busy_ms, r.processed)
        st = p.stats
        st.records_done += r.processed
        st.outputs += r.outputs
        st.dead_letters += r.dead_letters
        st.discarded += r.discarded
        st.deferrals = 0
        st.done_at = self.clock()

    def _defer(self, p: Partition, r: Result) -> None:
        """An outage or a plugin's Backoff: not the records' fault. The partition (or every
        partition) waits, then reads the same batch again, in order; nothing is committed
        past it and nothing is dead-lettered."""
        self.totals.deferred += 1
        reason = PauseReason.DELIVERY if r.cause == "delivery" else PauseReason.BACKOFF
        if r.delay_ms >= 0:
            delay = backoff_wait(r.delay_ms / 1000, p.stats.deferrals)
        else:
            out = self.out
            delay = backoff_s(out.retry_backoff_s, p.stats.deferrals, out.retry_backoff_max_s)
        p.stats.deferrals += 1
        until = self.clock() + delay
        detail = f"{r.detail} (retrying in {delay:.1f} s)"
        targets = list(self.partitions.values()) if r.scope == "all" else [p]
        log.warning("batch deferred; partition waits", extra={
            "tp": p.label, "reason": reason.value, "detail": r.detail, "wait_s": round(delay, 2),
            "scope": r.scope or "partition"})
        for target in targets:
            self.assignment.rewind(target, reason, detail, until)

    # ------------------------------------------------------------------ deaths
    def redeliver(self, death: Death) -> None:
        """Put a dead worker's unacknowledged batches back in front of their lanes, in their
        original order, so another worker (or the next incarnation) runs them again; the
        batch it was running counts a crash and may be bisected or dead-lettered."""
        requeue = []
        for b in self.scheduler.take_all(death.index):
            p = self.partitions.get(b.tp)
            if p is None or p.fence.epoch != b.epoch:
                continue  # fenced meanwhile: the worker would have skipped it
            if b.batch_id != death.crashed_batch:
                requeue.append(b)
                continue
            b.crashes += 1
            self.totals.transactions_aborted += self.transactional  # the broker aborts what it left open
            if b.letters:  # no plugin ran it: run again, not bisected, no second letter made
                if b.crashes < 2 * self.max_crashes or self.desk is None:
                    requeue.append(b)
                else:
                    self._letter_outside_a_transaction(p, b)
                continue
            iso = isolate(b, self.max_crashes, self.next_id)
            if iso.split is not None:
                p.tracker.split(b.batch_id, iso.split)
                log.warning("bisecting a batch that keeps crashing workers", extra={
                    "tp": p.label, "first": b.first, "last": b.last})
            if iso.dead_letter is not None:
                why = (f"worker {death.why} while processing this record ({b.crashes} times"
                       + (f"; the last time {death.during})" if death.during else ")"))
                if self.transactional and self.desk is not None:
                    # Exactly-once: the letter and the offset past the record commit together
                    # in a worker's transaction (isolation.letters_batch); written here, the
                    # letter would be outside any transaction and the record read again by
                    # the partition's next owner, which would write it a second time.
                    letter_at = functools.partial(self.desk.letter, b.tp, iso.dead_letter, "WorkerCrashed",
                                                  why, b.crashes, death.version)
                    requeue.append(letters_batch(b, letter_at, self.desk.max_bytes, self.intake.max_frame))
                    log.error("record isolated; its dead letter commits with its offset in a worker's "
                              "transaction", extra={"tp": p.label, "offset": b.first,
                                                    "error": f"WorkerCrashed: {why}"})
                    continue
                self.dead_letter(p, b.batch_id, iso.dead_letter, "WorkerCrashed", why,
                                 attempts=b.crashes, plugin_version=death.version)
            requeue.extend(iso.requeue)
        self.scheduler.requeue(requeue)

    def _letter_outside_a_transaction(self, p: Partition, b: Batch) -> None:
        """A letter batch that killed max_crashes workers of its own (writing the letter
        kills them: it holds the record's bytes) goes to the supervisor's desk, outside any
        transaction, as at-least-once writes it: a record is never stuck for good."""
        frame = decode_frame(b.frame)
        assert frame is not None
        offset, key, value, headers = frame.columns.row(0)
        log.warning("writing the dead letter kills its workers: the supervisor writes it, outside any "
                    "transaction (at-least-once for this letter)", extra={"tp": p.label, "offset": offset})
        assert self.desk is not None
        letter = DeadLetter(key, value, list(headers or ()), "whole")
        self.desk.submit_letter(b.tp, b.batch_id, offset, letter)

    # ------------------------------------------------------------------ dead letters
    def dead_letter_set_aside(self, records: list[SetAside]) -> None:
        """Records cut this tick that fit in no ring, or that the client cannot read. Before
        dispatch: without a dead-letter topic the partition stops at such a record, and the
        batches cut after it must not reach a ring (the rewind drops them)."""
        for x in records:
            p = self.partitions.get(x.tp)
            if p is not None:
                self.dead_letter(p, x.batch_id, x.row, x.error_type, x.message)

    def dead_letter(self, p: Partition, batch_id: int, row: Row, error_type: str, message: str,
                    attempts: int = 1, plugin_version: str | None = None) -> None:
        if self.desk is None:
            self.stop_at_failing_record(p, f"offset {row[0]}: {error_type}: {message}")
            return
        self.desk.submit(p.tp, batch_id, row, error_type, message, attempts, plugin_version)

    def stop_at_failing_record(self, p: Partition, detail: str) -> None:
        """No dead-letter topic: the partition holds at the record (nothing committed past it)
        until an operator fixes the plugin or configures one."""
        log.error("partition stopped at a failing record (no [dead_letter] topic); fix the "
                  "plugin or configure one, then restart", extra={"tp": p.label, "reason": detail})
        self.assignment.rewind(p, PauseReason.BLOCKED, detail, None)

    def settle_dead_letters(self, until: float, sleep: Callable[[float], None]) -> None:
        """Stopping: dead letters on their way are waited for until ``until`` (a short wait),
        so that their records are committed now rather than read again by the next owner."""
        while self.desk is not None and self.desk.pending() and self.clock() < until:
            self.deliver_dead_letters()
            sleep(0.02)

    def deliver_dead_letters(self) -> None:
        if self.desk is None:
            return
        for tp, batch_id in self.desk.poll():
            p = self.partitions.get(tp)
            # INVARIANT (1): the record counts as handled only once its dead letter is acked.
            if p is not None:
                p.tracker.complete(batch_id)
                p.stats.dead_letters += 1
            self.totals.dead_letters += 1
