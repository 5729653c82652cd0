"""One batch through the plugin and out to the broker: ``BatchRunner``.

Runs in: a worker process (runtime/worker/process.py builds it, under exactly-once wrapped
by transactional.py), and in a plugin author's test process (runtime/testing.py).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.errors import BatchDeferred, DeliveryFailed, FrameError, OutputRejected, WorkerExhausted
from runtime.execution.acked import Acknowledged, acknowledged, raise_settled
from runtime.execution.deadletter_format import HEADER_PREFIX, DeadLetter, reference_dead_letter
from runtime.execution.routing import OutputRoute, with_version
from runtime.execution.run import REJECTED, Failure, RetryPolicy, run_batch
from runtime.kafka.producer import OutputProducer, Tally, invalid_topic
from runtime.plugin import Output, Plugin, Record
from runtime.subscription import subscribed_by
from runtime.tp import tp_label
from runtime.transport.board import PHASE_CALL, PHASE_DELIVER, PHASE_IDLE, PHASE_SETTLE, Board
from runtime.transport.frames import BLOCKED, DEFERRED, DONE, EXHAUSTED, FRESH, WORN, BatchFrame, Result
from runtime.worker.decoding import frame_records
from runtime.worker.refusals import KnownRefusals
from runtime.worker.spec import WorkerSpec, producer_props

log = logging.getLogger("ringmaster.worker")

# Acknowledged outputs a worker keeps for its deferred batches, all partitions together (a
# digest and a counter slot each, ~100 bytes): past it the oldest partition's are dropped,
# and its outputs may be written again when its batch runs (at-least-once, said in the log).
MAX_CARRIED_OUTPUTS = 200_000
# How long the acknowledgement watcher waits in one poll: successes are not reported (only
# failures wake it), so this is how late it may see a batch in flight acknowledged; each wake
# takes the GIL from the plugin once.
_WATCH_POLL_S = 0.01


@dataclass(frozen=True, slots=True)
class InFlight:
    """A batch whose outputs are produced and not acknowledged yet (pipelined delivery): its
    report, made once they are."""

    head: tuple[int, int, int]  # batch id, slot, epoch
    tp: tuple[str, int]
    records: list[Record]
    sent: list[Output]  # the outputs of its one plugin call, produced and not acknowledged yet
    tally: Tally  # ... and their delivery reports so far
    producer: OutputProducer  # ... the producer they went through
    processed: int
    outputs: int
    dead_letters: int
    discarded: int
    busy_ms: float

    @property
    def slot(self) -> int:
        return self.head[1]


class BatchRunner:
    """Runs one batch through the plugin (runtime.execution.run: retries, then bisection) and
    delivers what came out: outputs to their topic, failures to the dead-letter topic.

    Delivery is part of the retry path: the outputs of each plugin call are produced and
    acknowledged before the call counts. A refused output fails its records like an
    exception; an outage (DeliveryFailed) or a plugin's Backoff defers the whole batch.

    What the broker acknowledged is not written again while this worker runs the same
    records: within the batch's retries and bisection (runtime/execution/run.py), and when
    a deferred batch comes back to this worker (``_carried``: the records it begins with are
    the deferred batch's). A batch that goes to another worker starts from nothing.

    **Pipelined delivery** (``on_settled``; at-least-once with a dead-letter topic): a batch
    whose plugin call returned at the first attempt leaves its outputs in flight, and ``run``
    returns None: the worker starts its next batch meanwhile. The batch is settled
    (``on_settled`` given its report) by a watcher thread as soon as the broker acknowledged
    every output of it (``_watch``), or else by the worker itself: just before the next
    batch's outputs or dead letters are produced, at the end of the next batch if it produced
    none, or when the worker has nothing else to run (``settle``). Only then is it DONE: its
    offsets are committed, and its partition may move to another worker, only once its outputs
    are acknowledged. INVARIANT: a batch acknowledged is reported while the next one still runs,
    so that a next batch that hangs or kills its worker sends back only itself, not the batch
    before it too (its outputs would be written twice). One producer keeps a
    partition's outputs in order, so the next batch may be of the same partition; but if the
    broker did not take a batch's outputs, the batch is DEFERRED, and so is the next one of its
    partition (nothing of it is produced), and that partition's next batch here delivers
    synchronously (``_synchronous``): a refused output is found and its record isolated on the
    retry path, as without pipelining. At most one batch is in flight."""

    def __init__(self, plugin: Plugin, spec: WorkerSpec, board: Board, producer: OutputProducer,
                 version: str = "unknown", on_settled: Callable[[Result], None] | None = None) -> None:
        self.plugin = plugin
        self.spec = spec
        self.board = board
        self.version = version
        # Shared: the client copies headers when producing.
        self._version_only = with_version(None, version)
        self.policy = RetryPolicy(spec.max_attempts, spec.retry_backoff_s, spec.retry_backoff_max_s)
        self.producer = producer
        self.route = OutputRoute(spec.output_topic, counted_in="status")
        self._routed: set[str] = set()  # Output(topic=...) topics seen (checked once for a loop)
        # Per partition, the deferred batch's offsets and what it had acknowledged.
        self._deferred: dict[tuple[str, int], tuple[list[int], Acknowledged]] = {}
        # False under exactly-once: a deferred batch's transaction was aborted, so what the
        # broker acknowledged of it is invisible, and its next run writes everything again.
        self.carry_acknowledged = True
        # Exactly-once: what the cluster refused in this batch's earlier transaction, refused
        # here before it is produced again (refusals.py); None: not kept.
        self.refusals: KnownRefusals | None = None
        self.on_settled = on_settled  # None: every batch is delivered before run() returns
        self.in_flight: InFlight | None = None
        # RACE: the worker's thread and the watcher each settle the batch in flight, whichever
        # comes first: it is taken (``in_flight`` set to None) under this lock, once.
        self._settling = threading.Condition()
        self._watcher: threading.Thread | None = None
        self._synchronous: set[int] = set()  # slots whose next batch is not pipelined (a late failure)
        self._slot = -1  # the slot of the batch being run
        self._pipelining = False  # this batch's first delivery may stay in flight
        self._calls = 0  # plugin calls of this batch so far
        self._unsettled = False  # this batch produced outputs not acknowledged yet
        self._sent: list[Output] = []  # ... these
        self._tally: Tally | None = None  # ... and their delivery reports

    def run(self, frame: BatchFrame, records: list[Record] | None = None) -> Result | None:
        """``records``: the frame's records, when the caller built them already (exactly-once
        leaves out those an earlier transaction committed). None: the batch's outputs are in
        flight, and its report goes to ``on_settled`` later (pipelined delivery)."""
        head = (frame.batch_id, frame.slot, frame.epoch)
        try:
            if records is None:
                records = frame_records(frame)
            result = self._run(frame, head, records)
            self.board.set_phase(PHASE_IDLE)  # reporting: a death from here on still blames the batch
            return result
        except (WorkerExhausted, MemoryError) as exc:
            detail = exc.detail if isinstance(exc, WorkerExhausted) else "memory (MemoryError)"
            fresh = self.board.batches == 0
            log.error("worker ran out of a resource; the batch is not done and runs again on a new worker",
                      extra={"worker": self.spec.name, "tp": tp_label((frame.topic, frame.partition)),
                             "resource": detail, "first_batch": fresh})
            return Result(EXHAUSTED, *head, detail=detail, cause=FRESH if fresh else WORN)

    def _run(self, frame: BatchFrame, head: tuple[int, int, int], records: list[Record]) -> Result | None:
        started = time.monotonic()
        self.route.take_discarded()
        self._slot, self._calls, self._unsettled = frame.slot, 0, False
        self._pipelining = (self.on_settled is not None and self.spec.dead_letter_topic is not None
                            and not frame.letters and frame.slot not in self._synchronous)
        tp = (frame.topic, frame.partition)
        acked = self._carried(tp, records)
        try:
            if frame.letters or self.spec.dead_letter_topic is None:
                self._settle_before(frame.slot)  # these paths deliver as they go
                if frame.letters:
                    return self._letters(head, records, started)
                return self._run_until_first_failure(records, head, started, acked)
            outcome = run_batch(self.plugin, records, self.policy,
                                deliver=self._deliver, phase=self._phase, acked=acked)
            self._dead_letter(outcome.failures)
            if not self._unsettled:
                self._settle_before(frame.slot)  # it produced nothing: the one before settles now
        except BatchDeferred as d:
            if self._unsettled:  # what it had in flight counts only as far as the producer says
                self._unsettled = False
                acked = self._acknowledged_of(self._sent, self._tally, self.producer, len(records))
            self._carry(tp, records, acked)
            self._renew_producer_if_broken()
            log.warning("batch deferred", extra={
                "cause": d.cause, "tp": tp_label((frame.topic, frame.partition)), "reason": d.reason})
            delay_ms = -1 if d.delay_s is None else int(d.delay_s * 1000)
            return Result(DEFERRED, *head, detail=d.reason, cause=d.cause, delay_ms=delay_ms,
                          scope=d.scope)
        discarded = self.route.take_discarded()
        if self._unsettled:
            assert self._tally is not None
            self._hand_over(InFlight(head, tp, records, self._sent, self._tally, self.producer, len(records),
                                     outcome.output_count - discarded, len(outcome.failures),
                                     discarded, (time.monotonic() - started) * 1000))
            return None
        self._synchronous.discard(frame.slot)
        return Result(DONE, *head, processed=len(records), outputs=outcome.output_count - discarded,
                      dead_letters=len(outcome.failures), busy_ms=(time.monotonic() - started) * 1000,
                      discarded=discarded)

    def _phase(self, phase: int) -> None:
        if phase == PHASE_CALL:
            self._calls += 1
        self.board.set_phase(phase)

    # -- pipelined delivery ---------------------------------------------------------
    def settle(self) -> None:
        """Wait for the batch in flight, if any, and hand its report to ``on_settled``."""
        self._settle_before(None)

    def _hand_over(self, batch: InFlight) -> None:
        """The batch's outputs are in flight: the board shows it as the one delivering, then
        the watcher may settle it. RACE: in that order, or a report made before the board
        shows the batch would leave it there, delivering for ever."""
        self.board.hand_over()
        with self._settling:
            self.in_flight = batch
            self._settling.notify()
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="ringmaster-acks", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """The watcher thread: serve the producer's delivery reports while a batch is in
        flight, and report the batch DONE as soon as every output of it is acknowledged. A
        batch whose outputs were not all taken is left to the worker's own settling, which
        defers it (``_settle_before``)."""
        watched: InFlight | None = None
        while True:
            with self._settling:
                while self.in_flight is None or self.in_flight is watched:
                    self._settling.wait()
                watched = self.in_flight
            # RACE: the worker's thread takes the batch (under the lock) before it produces
            # anything more, so while the batch is still ``in_flight`` the producer holds its
            # messages only, and none left means all of them have their answer.
            try:
                while self.in_flight is watched and watched.producer.in_flight:
                    watched.producer.poll(_WATCH_POLL_S)
            except Exception:  # the client closed or failed: the worker settles the batch itself
                log.debug("the acknowledgement watcher stopped watching a batch", exc_info=True)
                continue
            if watched.tally.failed:
                continue
            with self._settling:
                if self.in_flight is not watched:
                    continue  # the worker's thread settled it meanwhile
                self.in_flight = None
                self._report_done(watched)

    def _report_done(self, prev: InFlight) -> None:
        assert self.on_settled is not None
        self.on_settled(Result(DONE, *prev.head, processed=prev.processed, outputs=prev.outputs,
                               dead_letters=prev.dead_letters, busy_ms=prev.busy_ms,
                               discarded=prev.discarded))

    def _settle_before(self, slot: int | None) -> None:
        """Settle the batch in flight before a batch of ``slot`` goes on (its outputs are
        produced, or it is reported). INVARIANT (1): if the broker did not take the batch's
        outputs, it is DEFERRED, and a batch of the same slot after it must not count: this
        raises DeliveryFailed for it, before it produced anything."""
        if self.in_flight is None:
            return  # the hot path: nothing in flight (or the watcher settled it)
        with self._settling:
            prev, self.in_flight = self.in_flight, None
        if prev is None:
            return
        assert self.on_settled is not None
        # INVARIANT (8): a death from here on counts against the batch handed over (the board
        # says whose acknowledgements the worker waits for), not the one in progress.
        phase = self.board.phase
        self.board.set_phase(PHASE_SETTLE)
        failed: Exception | None = None
        try:
            self._flush()
        except (DeliveryFailed, OutputRejected) as exc:
            failed = exc
        finally:
            self.board.set_phase(phase)
        if failed is None and prev.tally.failed:
            # Its failure was met by a flush of something else (the watcher's poll ran its
            # report, a delivery of the next batch took it): its own tally still says so.
            failed = DeliveryFailed(f"{len(prev.tally.failed)} output(s) not taken by the broker")
        if failed is None:
            self._report_done(prev)
            return
        # What the broker did take is not written again when the batch runs again here (a
        # refused output among them: the rest written twice, the fault matrix's
        # output-routed-to-a-missing-topic row).
        self._carry(prev.tp, prev.records,
                    self._acknowledged_of(prev.sent, prev.tally, prev.producer, prev.processed))
        self._renew_producer_if_broken()
        self._synchronous.add(prev.slot)
        reason = f"outputs not acknowledged after the batch ran: {failed}"
        log.warning("batch deferred", extra={"cause": "delivery", "batch": prev.head[0], "reason": reason})
        self.on_settled(Result(DEFERRED, *prev.head, detail=reason, cause="delivery", delay_ms=-1))
        if slot == prev.slot:
            raise DeliveryFailed("the batch before it in its partition was not delivered")

    def _acknowledged_of(self, sent: list[Output], tally: Tally | None, producer: OutputProducer,
                         records: int) -> Acknowledged:
        """What the broker acknowledged of ``sent``, the outputs of one call on all ``records``
        of a batch, left in flight and then found not all written (their tally's failures say
        which were not, once the producer holds nothing in flight; unknown: none)."""
        acked = Acknowledged()
        undelivered = list(tally.failed) if tally is not None and not producer.in_flight else None
        written = acknowledged(sent, undelivered, self.spec.output_topic)
        if written:
            acked.record(0, records - 1, [sent[i] for i in sorted(written)])
        return acked

    def _carried(self, tp: tuple[str, int], records: list[Record]) -> Acknowledged:
        """What an earlier, deferred run of these records on this worker had acknowledged: its
        spans name positions in its batch, so they hold only if this batch begins with the
        same records (the same batch, or one cut longer); else nothing is known."""
        kept = self._deferred.pop(tp, None)
        if kept is None:
            return Acknowledged()
        offsets, acked = kept
        same = all(r.offset == o for r, o in zip(records, offsets, strict=False))
        if len(records) >= len(offsets) and same:
            return acked
        return Acknowledged()

    def _carry(self, tp: tuple[str, int], records: list[Record], acked: Acknowledged) -> None:
        """Keep what a deferred batch had acknowledged for its next run, within
        MAX_CARRIED_OUTPUTS (the oldest partitions' dropped first)."""
        acked.keep()
        if not acked.size() or not self.carry_acknowledged:
            return
        self._deferred[tp] = ([r.offset for r in records], acked)
        total = sum(a.size() for _, a in self._deferred.values())
        while total > MAX_CARRIED_OUTPUTS and self._deferred:
            old_tp = next(iter(self._deferred))
            _, old = self._deferred.pop(old_tp)
            total -= old.size()
            log.warning("too many acknowledged outputs of deferred batches to keep: those of this "
                        "partition may be written again when its batch runs",
                        extra={"tp": tp_label(old_tp), "outputs": old.size(), "limit": MAX_CARRIED_OUTPUTS})

    def _run_until_first_failure(self, records: list[Record], head: tuple[int, int, int],
                                 started: float, acked: Acknowledged) -> Result:
        """INVARIANT: never skip a record silently. Without a dead-letter topic the partition
        stops at its first failing record: only outputs of records before it are produced,
        the batch is not acknowledged, so nothing from it on is committed."""
        outcome = run_batch(self.plugin, records, self.policy,
                            stop_at_first_failure=True, phase=self.board.set_phase)
        first = outcome.first_failure
        before = outcome.outputs_before(None if first is None else first.record.offset)
        try:
            if before:
                self.board.set_phase(PHASE_DELIVER)
                # One delivery for the records before the first failure (positions 0..n-1):
                # a deferred one that comes back skips what was acknowledged.
                n = len(records) if first is None else records.index(first.record)
                acked.deliver(0, max(n - 1, 0), before, self._deliver)
        except OutputRejected as exc:
            first = first or Failure(records[0], "OutputRejected", str(exc), "", 1)
        if first is None:
            discarded = self.route.take_discarded()
            return Result(DONE, *head, processed=len(records), outputs=len(before) - discarded,
                          discarded=discarded, busy_ms=(time.monotonic() - started) * 1000)
        self._carry((records[0].topic, records[0].partition), records, acked)  # runs again after a fix
        return Result(BLOCKED, *head, detail=f"offset {first.record.offset}: {first.error_type}: "
                                             f"{first.message}")

    # -- producing -------------------------------------------------------------------
    def _deliver(self, outputs: list[Output]) -> None:
        """Produce ``outputs`` and wait for the broker. On failure the exception says which of
        them were acknowledged (``acknowledged``), when the producer knows. Pipelined
        (``_pipelining``), the batch's first delivery is left in flight."""
        self._settle_before(self._slot)  # the batch before: acknowledged before these are produced
        # INVARIANT (1): only the batch's first plugin call, on all its records, is left in
        # flight: on the retry path (a retry, a bisection's parts) a refused output must fail
        # its own call, so each delivery there is waited for.
        in_flight = self._pipelining and self._calls == 1
        tally = self.producer.tally() if in_flight else None
        i = 0
        # Looked up once a delivery, not once an output (the hot path: ~0.2 µs a record).
        produce, route, routed = self.producer.produce, self.route.topic, self._routed
        if tally is not None:  # its failures counted apart (the watcher's)
            produce = functools.partial(produce, on_delivery=tally.on_delivery)
        version_only, wait_s = self._version_only, self.spec.delivery_timeout_s
        default_topic = self.spec.output_topic
        refusals = self.refusals or None  # the hot path: none known
        try:
            for i, out in enumerate(outputs):  # noqa: B007 (i: where a refusal stopped us)
                topic = out.topic
                if not topic:
                    topic = default_topic or route(out)  # route() counts what has nowhere to go
                    if topic is None:
                        continue
                elif topic not in routed:
                    self._check_route(topic)
                if refusals is not None and (refused := refusals.of(topic, out.key, out.value)) is not None:
                    raise refused
                # The common case, no headers, shares one list rather than building one per output.
                headers = with_version(out.headers, self.version) if out.headers else version_only
                produce(topic, out.value, out.key, headers, queue_wait_s=wait_s)
        except (OutputRejected, DeliveryFailed) as exc:
            # outputs[i] was refused (or the queue stayed full) before it was queued: settle
            # the ones queued before it, so that the retry knows what was written.
            raise_settled(outputs[:i], exc, self._flush, self._undelivered, self.spec.output_topic)
        if tally is not None:
            self._pipelining, self._unsettled, self._sent, self._tally = False, True, outputs, tally
            return
        try:
            self._flush()
        except (OutputRejected, DeliveryFailed) as exc:
            exc.acknowledged = acknowledged(outputs, self.producer.undelivered, self.spec.output_topic)
            raise

    def _flush(self) -> None:
        try:
            self.producer.deliver(self.spec.delivery_timeout_s, self.board.beat)
        except (OutputRejected, DeliveryFailed):
            if self.refusals is not None:
                self.refusals.learn(self.producer.refused)
            raise
        self._unsettled = False  # whatever this batch had in flight is acknowledged too

    def _undelivered(self) -> list[Any] | None:
        return self.producer.undelivered

    def _check_route(self, topic: str) -> None:
        """An Output(topic=...) into a topic the group reads is allowed – a deliberate re-queue
        (a retry topic the same group reads, a state machine) – but it feeds the daemon its
        own outputs, so the plugin must make it end: one warning per worker and topic. (The
        configured output and dead-letter topics are refused instead, runtime/config/checks.py.) A
        name Kafka never accepts is the record's fault, refused here on every output that
        carries it (runtime/kafka/producer.py, ``invalid_topic``)."""
        refused = invalid_topic(topic)
        if refused is not None:
            raise refused
        self._routed.add(topic)
        entry = subscribed_by(self.spec.input_topics, topic)
        if entry is not None:
            log.warning("the plugin routes outputs into a topic this group reads: the daemon will consume "
                        "them again (a loop, unless the plugin stops re-routing)",
                        extra={"worker": self.spec.name, "topic": topic, "subscription": entry})

    def _dead_letter(self, failures: list[Failure]) -> None:
        if not failures:
            return
        # The batch before, in flight: settled first, or its failure could be met (and taken
        # for the letters') by their flush.
        self._settle_before(self._slot)
        topic = self.spec.dead_letter_topic
        assert topic is not None
        letters = [f.dead_letter(self.spec.name, self.spec.max_message_bytes, self.version) for f in failures]
        self.board.set_phase(PHASE_DELIVER)
        try:
            self._write_letters(topic, letters)
        except OutputRejected:
            # The broker refused a dead letter for what it is (a topic limit below the
            # client's, a null key on a compacted topic): write where the record is instead.
            # Letters that were accepted are written twice: at-least-once.
            refs = [reference_dead_letter(letter, f.record.topic, f.record.partition, f.record.offset)
                    for f, letter in zip(failures, letters, strict=True)]
            try:
                self._write_letters(topic, refs)
            except OutputRejected as exc:
                raise DeliveryFailed(f"the dead-letter topic {topic!r} refuses even a reference "
                                     f"record: {exc}") from None
        for f in failures:
            r = f.record
            # A Reject is the plugin's deliberate verdict on a record, not an error of the
            # runtime or the plugin: a warning, like any record the plugin turns down.
            level = logging.WARNING if f.error_type == REJECTED else logging.ERROR
            log.log(level, "record dead-lettered", extra={
                "tp": tp_label((r.topic, r.partition)), "offset": r.offset,
                "error": f"{f.error_type}: {f.message}"})

    def _letters(self, head: tuple[int, int, int], records: list[Record], started: float) -> Result:
        """A LETTERS frame (runtime/transport/frames.py): each record is the dead letter the
        supervisor made of a record that kept crashing workers, at that record's offset. They
        are written as they are, and no plugin sees them: under exactly-once the transaction
        around this run commits them with the offset past their records."""
        topic = self.spec.dead_letter_topic
        if topic is None:
            raise FrameError("a dead-letter frame reached a worker with no dead-letter topic")
        letters = [DeadLetter(r.key, r.value, list(r.headers or ()), "whole") for r in records]
        self.board.set_phase(PHASE_DELIVER)
        try:
            try:
                self._write_letters(topic, letters)
            except OutputRejected:  # refused for what it is: where the record is, instead
                self._write_letters(topic, [reference_dead_letter(x, r.topic, r.partition, r.offset)
                                            for x, r in zip(letters, records, strict=True)])
        except (OutputRejected, DeliveryFailed) as exc:
            self._renew_producer_if_broken()
            log.warning("dead letters not delivered; batch deferred", extra={
                "tp": tp_label((records[0].topic, records[0].partition)), "reason": str(exc)})
            return Result(DEFERRED, *head, detail=f"dead letters not delivered: {exc}", cause="delivery")
        for r in records:
            why = (dict(r.headers or ()).get(HEADER_PREFIX + "error.type") or b"?").decode(errors="replace")
            log.error("record dead-lettered", extra={"tp": tp_label((r.topic, r.partition)),
                                                     "offset": r.offset, "error": why})
        return Result(DONE, *head, processed=len(records), dead_letters=len(records),
                      busy_ms=(time.monotonic() - started) * 1000)

    def _write_letters(self, topic: str, letters: list[DeadLetter]) -> None:
        for letter in letters:
            self.producer.produce(topic, letter.value, letter.key, letter.headers,
                                  queue_wait_s=self.spec.delivery_timeout_s)
        self._flush()

    def _renew_producer_if_broken(self) -> None:
        if self.producer.broken:
            log.warning("output producer hit a fatal error; creating a new one",
                        extra={"error": self.producer.fatal})
            self.producer.discard()
            self.producer = OutputProducer(producer_props(self.spec),
                                           own_topics=(self.spec.output_topic, self.spec.dead_letter_topic))

    def close(self) -> None:
        self.settle()
        if self.producer.flush(10):
            log.warning("outputs still queued at exit")
