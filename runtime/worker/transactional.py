"""Exactly-once in a worker (``output.guarantee = "exactly-once"``, docs/exactly-once.md): each
batch runs inside one Kafka transaction around the worker's ordinary BatchRunner.

    committed offset (stable) ─▶ skip what is done ─▶ begin ─▶ BatchRunner.run (outputs, dead
    letters, retries, bisection: all in the transaction) ─▶ DONE: send offsets + commit
                                                          └▶ anything else: abort

A LETTERS batch (the dead letter of a record that kept crashing workers, made by the
supervisor: runtime/supervisor/datapath/isolation.py) runs the same way, its letter in place
of the plugin's outputs: the letter and the offset past its record commit together, once.

INVARIANT: a batch's outputs are visible to a read_committed reader if and only if its offset
is committed, and once. Retries and bisection inside one run are inside one transaction
(BatchRunner skips what the broker acknowledged in it: it is in the same transaction); a
batch deferred and run again runs in a new transaction and writes everything again
(``carry_acknowledged`` off: the aborted one's outputs are invisible).

Runs in: a worker process (runtime/worker/process.py builds it over the BatchRunner).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from runtime.errors import TransactionAborted, WorkerExhausted
from runtime.kafka.committed_offsets import CommittedOffsets
from runtime.kafka.producer import OutputProducer
from runtime.kafka.transactions import BatchTransactions, commit_timeout_s
from runtime.plugin import Record
from runtime.tp import tp_label
from runtime.transport.board import PHASE_CALL, PHASE_COMMIT, PHASE_FENCE, PHASE_OFFSETS, Board
from runtime.transport.frames import COMMITTED, DEFERRED, DONE, EXHAUSTED, WORN, BatchFrame, Result
from runtime.transport.groupmeta import GROUP_METADATA_BYTES, GroupMetadataCell
from runtime.transport.shm import Segment
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.decoding import frame_records
from runtime.worker.refusals import KnownRefusals
from runtime.worker.spec import WorkerSpec

log = logging.getLogger("ringmaster.worker")

# Transactions one batch may take when each learns outputs the cluster refuses (run): one
# refusal a transaction at worst, and a batch with more such records waits for its next run.
_REFUSAL_RUNS = 4


class Offsets(Protocol):
    def of(self, tp: tuple[str, int], timeout_s: float, /) -> int | None: ...
    def close(self) -> None: ...


class TransactionalRunner:
    def __init__(self, runner: BatchRunner, spec: WorkerSpec, board: Board, offsets: Offsets,
                 group_metadata: Callable[[], bytes | None],
                 transactions: Callable[[OutputProducer], BatchTransactions],
                 new_producer: Callable[[], OutputProducer]) -> None:
        """``offsets``: the group's committed offsets; ``group_metadata``: the supervisor's
        latest; ``transactions``: starts the transactions of a producer; ``new_producer``:
        one with this slot's transactional id (tests give fakes of each)."""
        self.runner = runner
        runner.carry_acknowledged = False
        self.spec = spec
        self.board = board
        self._new_producer = new_producer
        self._offsets = offsets
        self._group_metadata = group_metadata
        self._start = transactions
        self._txn: BatchTransactions | None = None
        self._txn_of: OutputProducer | None = None

    @classmethod
    def for_worker(cls, runner: BatchRunner, spec: WorkerSpec, board: Board,
                   producer_props: dict[str, Any]) -> TransactionalRunner:
        """The real thing: the segment the supervisor writes the group's metadata to, a client
        reading the group's committed offsets, the producer's own transactions."""
        segment = Segment(Path(spec.group_metadata_path), 0, create=False)
        cell = GroupMetadataCell(segment.buf[:GROUP_METADATA_BYTES])
        return cls(runner, spec, board, CommittedOffsets(spec.group_props), cell.read,
                   lambda p: BatchTransactions(p.client, spec.delivery_timeout_s,
                                               commit_timeout_s(spec.delivery_timeout_s)),
                   lambda: OutputProducer(producer_props, own_topics=(spec.output_topic,
                                                                      spec.dead_letter_topic)))

    def _transactions(self) -> BatchTransactions:
        """The producer's transactions, started (init_transactions) on first use and after a
        failure (a new producer with the same transactional id: it fences the old one)."""
        producer = self.runner.producer  # BatchRunner replaces one that broke, too
        if self._txn is None or self._txn_of is not producer:
            self.board.set_phase(PHASE_FENCE)  # the supervisor's bound on a start applies
            self._txn = self._start(producer)
            self._txn_of = producer
        return self._txn

    def prepare(self) -> None:
        """Start this slot's transactions now, not at the first batch: ``init_transactions``
        fences what an earlier holder of the transactional id left open (a worker killed
        mid-batch, a daemon SIGKILLed and replaced on this host) and aborts it at once. Until
        then the member that took over its partitions cannot read their committed offsets, and
        a read_committed reader of the outputs stops at the open transaction; this worker may
        get none of those partitions. A coordinator that does not answer in time is asked
        again at the first batch."""
        try:
            self._transactions()
        except TransactionAborted as exc:
            log.warning("cannot start transactions yet; trying again at the first batch",
                        extra={"reason": exc.reason})
            self._renew()

    def _renew(self, fence: bool = False) -> None:
        """Replace the producer. ``fence``: start the new one's transactions at once, before the
        batch is reported, rather than at this worker's next batch: its init_transactions
        aborts what the old one left open. After a failed commit that may hold the partition's
        offsets (sent into the transaction, its end not acknowledged), and every read of the
        partition's committed offset (require_stable) by whichever worker of the group runs it
        next waits on it; an abort not acknowledged leaves the outputs' partitions held for
        read_committed readers. Both lasted until ``transaction.timeout.ms`` when this worker
        got no other batch meanwhile (a rebalance gave its partition to another member). A
        start that fails is tried again at the next batch."""
        self._replace_producer()
        if not fence:
            return
        try:
            self._transactions()
        except TransactionAborted as exc:
            log.warning("cannot start the new producer's transactions yet; trying again at the next batch",
                        extra={"reason": exc.reason})
            self._replace_producer()

    def _replace_producer(self) -> None:
        """The old producer is let go of at once (its client's threads and connections), not
        at the next run of the cyclic collector: nothing here keeps it."""
        self._txn = self._txn_of = None
        self.runner.producer.discard()
        self.runner.producer = self._new_producer()

    def run(self, frame: BatchFrame) -> Result:
        head = (frame.batch_id, frame.slot, frame.epoch)
        tp = (frame.topic, frame.partition)
        records = frame_records(frame)
        refusals = self.runner.refusals = KnownRefusals()
        try:
            for _ in range(_REFUSAL_RUNS):
                known = len(refusals)
                result = self._run_in_a_transaction(head, tp, frame, records)
                if result.kind != DEFERRED or len(refusals) == known:
                    return result
                # The cluster refused outputs of this run, which failed its transaction: run it
                # again at once in a new one that refuses them itself (refusals.py), so that their
                # records are dead-lettered as OutputRejected, as under at-least-once.
                log.warning("outputs refused inside the batch's transaction; running it again in a new "
                            "one that dead-letters their records", extra={"tp": tp_label(tp),
                                                                          "refused": len(refusals)})
            return result
        finally:
            self.runner.refusals = None

    def _run_in_a_transaction(self, head: tuple[int, int, int], tp: tuple[str, int], frame: BatchFrame,
                              records: list[Record]) -> Result:
        # INVARIANT: the batch commits with the group's metadata as it was when the batch
        # started, not at its commit. A member that loses its partitions (its session timed out
        # behind a frozen coordinator) leaves a batch still delivering to finish on its own
        # (rebalance.py); if the member joins again meanwhile and gets the partition back, the
        # latest metadata would let that batch commit beside the new owner's run of the same
        # records. The generation it started in is refused (ILLEGAL_GENERATION, a stale member
        # epoch): aborted, invisible. A rebalance during a batch costs that batch a run.
        group = self._group_metadata()
        if group is None:
            return self._deferred(head, tp, TransactionAborted(
                "no group metadata yet (the supervisor has not joined the group)"))
        try:
            txn = self._transactions()
        except TransactionAborted as exc:
            self._renew()
            return self._deferred(head, tp, exc)
        # The read has a deadline of its own (committed_offsets.py), and the supervisor a bound
        # on this phase: a read stuck in librdkafka never holds the partition up unseen, nor
        # counts as the plugin's time (PHASE_CALL: up to batch_timeout_s, blamed on the batch).
        self.board.set_phase(PHASE_OFFSETS)
        try:
            below = self._offsets.of(tp, self.spec.delivery_timeout_s)
        except TransactionAborted as exc:  # the group's answer, not the producer's: kept
            return self._deferred(head, tp, exc)
        except WorkerExhausted as exc:  # clients stuck in librdkafka: a new worker, not a leak
            log.error("committed-offset reads stuck; the batch runs again on a new worker",
                      extra={"tp": tp_label(tp), "resource": exc.detail})
            return Result(EXHAUSTED, *head, detail=exc.detail, cause=WORN)
        finally:
            self.board.set_phase(PHASE_CALL)
        todo = records if below is None else [r for r in records if r.offset >= below]
        if not todo:
            # An earlier transaction committed it (a worker killed after it asked the broker
            # to commit, before it reported): done, nothing to write again.
            log.info("batch committed already by an earlier transaction", extra={
                "tp": tp_label(tp), "first": records[0].offset, "committed": below})
            return Result(DONE, *head, processed=len(records))
        try:
            txn.begin()
        except TransactionAborted as exc:
            self._renew()
            return self._deferred(head, tp, exc)
        result = self.runner.run(frame, todo)
        assert result is not None, "no pipelined delivery under exactly-once: each batch commits its own"
        if result.kind != DONE:
            # Deferred, blocked, exhausted: nothing of it becomes visible. An abort not
            # acknowledged leaves the producer unusable for the next transaction: replaced.
            if not txn.abort():
                log.warning("transaction abort not acknowledged; replacing the producer",
                            extra={"tp": tp_label(tp)})
                self._renew(fence=True)
            return result
        try:
            self.board.set_phase(PHASE_COMMIT)
            txn.commit({tp: todo[-1].offset + 1}, group)
        except TransactionAborted as exc:
            self._renew(fence=True)
            return self._deferred(head, tp, exc)
        return dataclasses.replace(result, processed=len(records), cause=COMMITTED)

    def _deferred(self, head: tuple[int, int, int], tp: tuple[str, int], exc: TransactionAborted) -> Result:
        log.warning("batch deferred", extra={"cause": exc.cause, "tp": tp_label(tp), "reason": exc.reason})
        return Result(DEFERRED, *head, detail=exc.reason, cause=exc.cause)

    def close(self) -> None:
        self.runner.close()
        self._offsets.close()
