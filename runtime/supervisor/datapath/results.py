"""The results room: what a worker's report means, what becomes of a dead worker's batches, and
where a record that cannot be processed goes. Runs in: supervisor. It decides; it returns its
decisions as effects (effects.py), which applier.py applies, in order.

    worker's report ─▶ DONE: Complete (its partition counts the batch; counters, learnt costs)
                       DEFERRED (an outage, a plugin's Backoff): Rewind of the partition (or all)
                       BLOCKED (no dead-letter topic): Block, the partition stops at the record
                       FATAL, HELLO, EXHAUSTED: WorkerSaid, the workforce's to judge
    worker deaths ─▶ Requeue of its batches; the one it was running counts a crash (isolation.py:
                     retried, Isolate (bisected; a share group's split into its records),
                     Letter; under exactly-once the letter is a batch of its own, for a
                     worker's transaction; a share group's record whose lock ends first:
                     GiveUp, released)
    set aside ─▶ Letter (the supervisor's desk writes it), or Block without a dead-letter topic
                 (a share group's record at its last delivery: GiveUp, rejected)
    dead-letter desk ─▶ LetterDone: an acknowledged dead letter completes its one-record batch

Owns the run's totals and the per-worker counts; hands each batch a worker reports back to the
scheduler (``returned``), which says whether it was still out.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.backoff import backoff_s
from runtime.config import OutputSettings
from runtime.execution.deadletter_format import DeadLetter
from runtime.kafka.share_consumer import Outcome
from runtime.ops.status import Totals
from runtime.plugin import backoff_wait
from runtime.supervisor.datapath.deadletter_desk import supervisor_letter
from runtime.supervisor.datapath.effects import (
    Block,
    Complete,
    Effect,
    GiveUp,
    Isolate,
    Letter,
    LetterDone,
    ReadyLetter,
    Requeue,
    Rewind,
    WorkerSaid,
)
from runtime.supervisor.datapath.intake import BatchIds, LastDelivery, SetAside
from runtime.supervisor.datapath.isolation import isolate, letters_batch
from runtime.supervisor.partition.acknowledgements import AckTracker
from runtime.supervisor.partition.partition import Partition, PauseReason
from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.workers.workforce import Death
from runtime.tp import TP
from runtime.transport.frames import COMMITTED, FRESH, Result, ResultKind, decode_frame

log = logging.getLogger("ringmaster.results")


@dataclass(frozen=True)
class Rules:
    """What decides a result's meaning, from the settings."""

    out: OutputSettings  # the back-off of a deferred batch; exactly-once
    max_crashes: int  # dead_letter.max_crashes (crash isolation, isolation.py)
    workers: int  # worker slots (per-worker counts; the pool may add slots up to this)
    letter_bytes: int | None  # the largest dead letter the topic takes; None: no dead-letter topic
    max_frame: int  # a ring's largest frame (a letter as a batch of its own, exactly-once)

    @property
    def transactional(self) -> bool:
        return self.out.guarantee == "exactly-once"


@dataclass(frozen=True)
class ResultsView:
    """What the results room reports (runtime/supervisor/daemon/report.py)."""

    totals: Totals
    per_worker_records: tuple[int, ...]
    per_worker_busy_ms: tuple[float, ...]


class Results:
    def __init__(self, rules: Rules, partitions: Mapping[TP, Partition], scheduler: Scheduler,
                 next_id: BatchIds, clock: Callable[[], float]) -> None:
        self.rules = rules
        self.partitions = partitions
        self.scheduler = scheduler
        self.next_id = next_id
        self.clock = clock
        self.totals = Totals()
        self.transactional = rules.transactional
        self.per_worker_records = [0] * rules.workers
        self.per_worker_busy_ms = [0.0] * rules.workers  # time batches took in each slot

    def snapshot(self) -> ResultsView:
        return ResultsView(dataclasses.replace(self.totals), tuple(self.per_worker_records),
                           tuple(self.per_worker_busy_ms))

    # ------------------------------------------------------------------ reports
    def apply(self, worker: int, r: Result) -> list[Effect]:
        """What worker ``worker``'s report means."""
        if r.kind in (ResultKind.FATAL, ResultKind.HELLO):
            return [WorkerSaid(worker, r.kind, r.detail)]
        if r.kind is ResultKind.EXHAUSTED:  # not done, not the records' fault: run again when it exits
            return [WorkerSaid(worker, r.kind, r.detail, r.batch_id, r.cause == FRESH)]
        batch = self.scheduler.returned(worker, r.batch_id)
        # INVARIANT (1, 5): a batch counts only while it is out for its partition. A batch
        # that began before its partition was fenced and ran to the end while the revocation
        # (or rewind) waited for it counts, whatever its epoch: that is the batch the
        # revocation waits for, so that it commits it. Releasing a partition forgets its
        # batches out, so a late result of one completes nothing.
        p = self.partitions.get(batch.tp) if batch is not None else None
        if self.transactional and r.kind in (ResultKind.DEFERRED, ResultKind.BLOCKED):
            self.totals.transactions_aborted += 1
        if r.kind is ResultKind.DONE:
            return [self._done(worker, r, p)]
        if p is None:
            return []
        if r.kind is ResultKind.BLOCKED:
            return [Block(p, r.detail)]
        if r.kind is ResultKind.DEFERRED:
            return [self._defer(p, r)]
        return []  # FENCED: skipped, nothing to do

    def _done(self, worker: int, r: Result, p: Partition | None) -> Complete:
        t = self.totals
        t.batches += 1
        t.transactions_committed += r.cause == COMMITTED
        t.records += r.processed
        t.outputs += r.outputs
        t.dead_letters += r.dead_letters
        t.discarded += r.discarded
        self.per_worker_records[worker] += r.processed
        self.per_worker_busy_ms[worker] += r.busy_ms
        return Complete(worker, p, r.batch_id, r.processed, r.outputs, r.dead_letters, r.discarded, r.busy_ms)

    def _defer(self, p: Partition, r: Result) -> Rewind:
        """An outage or a plugin's Backoff: not the records' fault. The partition (or every
        partition) waits, then reads the same batch again, in order; nothing is committed
        past it and nothing is dead-lettered."""
        self.totals.deferred += 1
        reason = PauseReason.DELIVERY if r.cause == "delivery" else PauseReason.BACKOFF
        deferrals = p.stats.deferrals
        if r.delay_ms >= 0:
            delay = backoff_wait(r.delay_ms / 1000, deferrals)
        else:
            out = self.rules.out
            delay = backoff_s(out.retry_backoff_s, deferrals, out.retry_backoff_max_s)
        until = self.clock() + delay
        detail = f"{r.detail} (retrying in {delay:.1f} s)"
        targets = tuple(self.partitions.values()) if r.scope == "all" else (p,)
        log.warning("batch deferred; partition waits", extra={
            "tp": p.label, "reason": reason.value, "detail": r.detail, "wait_s": round(delay, 2),
            "scope": r.scope or "partition"})
        return Rewind(targets, reason, detail, until, deferred=p)

    # ------------------------------------------------------------------ deaths
    def redeliver(self, death: Death,
                  may_dead_letter: Callable[[TP, int], bool] | None = None) -> list[Effect]:
        """Put a dead worker's unacknowledged batches back in front of their lanes, in their
        original order, so another worker (or the next incarnation) runs them again; the
        batch it was running counts a crash and may be bisected or dead-lettered.
        ``may_dead_letter``: a share group's consumer's answer, whether this member's lock on
        a record leaves time for its letter (runtime/kafka/share_consumer.py)."""
        effects: list[Effect] = []
        requeue: list[Batch] = []
        stopped: set[TP] = set()  # partitions stopped here at a record: their later batches are stale
        for b in self.scheduler.take_all(death.index):
            p = self.partitions.get(b.tp)
            if p is None or p.epoch != b.epoch or b.tp in stopped:
                continue  # fenced meanwhile: the worker would have skipped it
            if b.batch_id != death.crashed_batch:
                requeue.append(b)
                continue
            b.crashes += 1
            self.totals.transactions_aborted += self.transactional  # the broker aborts what it left open
            if b.letters:  # no plugin ran it: run again, not bisected, no second letter made
                if b.crashes < 2 * self.rules.max_crashes or self.rules.letter_bytes is None:
                    requeue.append(b)
                else:
                    effects.append(_letter_outside_a_transaction(p, b))
                continue
            shared = isinstance(p.tracker, AckTracker)
            iso = isolate(b, self.rules.max_crashes, self.next_id, singles=shared)
            if iso.split is not None:
                effects.append(Isolate(p, b.batch_id, tuple(iso.split)))
                log.warning("bisecting a batch that keeps crashing workers", extra={
                    "tp": p.label, "first": b.first, "last": b.last, "parts": len(iso.split)})
            if iso.dead_letter is not None and shared and may_dead_letter is not None \
                    and not may_dead_letter(b.tp, b.first):
                # A share group's record whose lock ends before its letter could be written and
                # acknowledged: another member may be handed it then, and write a letter of its
                # own (issue 44: up to four for one record). Released instead: its next delivery,
                # its count raised, counts the crashes and isolates it at once.
                effects.append(GiveUp(p, b.batch_id, Outcome.RELEASE))
                log.warning("a record that keeps crashing workers is released, not dead-lettered: its "
                            "acquisition lock ends before its letter could be acknowledged; its next "
                            "delivery isolates it", extra={"tp": p.label, "offset": b.first,
                                                           "delivery_count": iso.delivery_count})
                continue
            if iso.dead_letter is not None:
                why = (f"worker {death.why} while processing this record ({b.crashes} times"
                       + (f"; the last time {death.during})" if death.during else ")"))
                if self.transactional and self.rules.letter_bytes is not None:
                    # Exactly-once: the letter and the offset past the record commit together
                    # in a worker's transaction (isolation.letters_batch); written here, the
                    # letter would be outside any transaction and the record read again by
                    # the partition's next owner, which would write it a second time.
                    letter_at = functools.partial(_letter_of, b.tp, iso.dead_letter, "WorkerCrashed", why,
                                                  b.crashes, death.version)
                    requeue.append(letters_batch(b, letter_at, self.rules.letter_bytes, self.rules.max_frame))
                    log.error("record isolated; its dead letter commits with its offset in a worker's "
                              "transaction", extra={"tp": p.label, "offset": b.first,
                                                    "error": f"WorkerCrashed: {why}"})
                    continue
                effect = self.dead_letter(p, b.batch_id, iso.dead_letter, "WorkerCrashed", why,
                                          attempts=b.crashes, plugin_version=death.version,
                                          delivery_count=iso.delivery_count)
                effects.append(effect)
                if isinstance(effect, Block):
                    stopped.add(p.tp)
            requeue.extend(iso.requeue)
        effects.append(Requeue(tuple(requeue)))
        return effects

    # ------------------------------------------------------------------ dead letters
    def set_aside(self, records: Iterable[SetAside]) -> list[Effect]:
        """Records cut this tick that fit in no ring, or that the client cannot read. Before
        dispatch: without a dead-letter topic the partition stops at such a record, and the
        batches cut after it must not reach a ring (the rewind drops them)."""
        effects: list[Effect] = []
        for x in records:
            p = self.partitions.get(x.tp)
            if p is None:
                continue
            if isinstance(x, LastDelivery) and self.rules.letter_bytes is None:
                # Nowhere to write it: the broker archives it at the end of its lock anyway.
                # Rejected, so that it is counted as such, rather than stop the partition.
                effects.append(GiveUp(p, x.batch_id, Outcome.REJECT))
                log.error("record at its last delivery not done in time, and no [dead_letter] topic: "
                          "rejected (archived by the broker, with no trace here)",
                          extra={"tp": p.label, "offset": x.row[0], "error": f"{x.error_type}: {x.message}"})
                continue
            effects.append(self.dead_letter(p, x.batch_id, x.row, x.error_type, x.message,
                                            delivery_count=x.delivery_count))
        return effects

    def dead_letter(self, p: Partition, batch_id: int, row: tuple[int, bytes | None, bytes | None, Any],
                    error_type: str, message: str, attempts: int = 1,
                    plugin_version: str | None = None, delivery_count: int | None = None) -> Letter | Block:
        """The supervisor's desk writes the record's dead letter; with no dead-letter topic the
        partition stops at the record (nothing committed past it) until an operator fixes the
        plugin or configures one. ``delivery_count``: a share group's record's, for the
        letter's header."""
        if self.rules.letter_bytes is None:
            return Block(p, f"offset {row[0]}: {error_type}: {message}")
        return Letter(p, batch_id, row, error_type, message, attempts, plugin_version, delivery_count)

    def letters_delivered(self, done: Iterable[tuple[TP, int]]) -> list[Effect]:
        """Dead letters the desk has had acknowledged: (partition, batch id) each."""
        effects: list[Effect] = []
        for tp, batch_id in done:
            p = self.partitions.get(tp)
            # INVARIANT (1): the record counts as handled only once its dead letter is acked.
            if p is not None:
                effects.append(LetterDone(p, batch_id))
            self.totals.dead_letters += 1
        return effects


def _letter_outside_a_transaction(p: Partition, b: Batch) -> ReadyLetter:
    """A letter batch that killed max_crashes workers of its own (writing the letter kills
    them: it holds the record's bytes) goes to the supervisor's desk, outside any transaction,
    as at-least-once writes it: a record is never stuck for good."""
    frame = decode_frame(b.frame)
    assert frame is not None
    offset, key, value, headers = frame.columns.row(0)
    log.warning("writing the dead letter kills its workers: the supervisor writes it, outside any "
                "transaction (at-least-once for this letter)", extra={"tp": p.label, "offset": offset})
    return ReadyLetter(p, b.batch_id, offset, DeadLetter(key, value, list(headers or ()), "whole"))


def _letter_of(tp: TP, row: tuple[int, bytes | None, bytes | None, Any], error_type: str, message: str,
               attempts: int, plugin_version: str | None, max_bytes: int) -> DeadLetter:
    """A record's dead letter as the supervisor words it, made to fit ``max_bytes`` (the last
    argument: isolation.py's ``letter_at`` gives only that)."""
    return supervisor_letter(tp, row, error_type, message, max_bytes, attempts, plugin_version)
