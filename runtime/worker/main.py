"""The loop inside a worker process.

    ring ──peek──▶ fence check (fence.py, under the worker lock) ──▶ decode ──▶ plugin.process
         ◀─advance─┘                                                   │
    result pipe ◀── DONE / FENCED / BLOCKED / DEFERRED ◀── deliver (outputs + dead letters acked) ◀┘
                ◀── EXHAUSTED (out of descriptors or memory: not done; the worker exits)

Runs in: a worker process started with spawn/forkserver (never forked from a process that
holds a librdkafka client). It never talks to the consumer group; it only produces.

What the supervisor learns from a worker is what the worker *reports*, never how it ended:
FATAL is sent only before READY (the plugin could not start), and a worker that was ready
and dies has crashed, whatever its exit status (a plugin may call ``os._exit(3)``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from runtime.config import subscribed_by
from runtime.errors import (
    BatchDeferred,
    DeliveryFailed,
    KafkaError,
    OutputRejected,
    PluginError,
    WorkerExhausted,
)
from runtime.execution.acked import Acknowledged, acknowledged, raise_settled
from runtime.execution.deadletter_format import DeadLetter, reference_dead_letter
from runtime.execution.routing import OutputRoute, with_version
from runtime.execution.run import REJECTED, Failure, RetryPolicy, run_batch
from runtime.kafka.producer import OutputProducer
from runtime.ops.logs import bind_fields, configure_logging
from runtime.plugin import Context, Output, Plugin, Record, load_plugin, plugin_version
from runtime.tp import tp_label
from runtime.transport import speedups
from runtime.transport.board import BOARD_BYTES, PHASE_DELIVER, PHASE_IDLE, Board, BoardLock, EpochTable
from runtime.transport.frames import (
    BLOCKED,
    DEFERRED,
    DONE,
    EXHAUSTED,
    FATAL,
    FENCED,
    FRESH,
    HELLO,
    WORN,
    BatchFrame,
    Columns,
    Result,
    decode_frame,
    encode_result,
    peek_header,
)
from runtime.transport.ring import Doorbell, Ring, send_message
from runtime.transport.shm import Segment
from runtime.worker.fence import FenceCheck
from runtime.worker.transactional import TransactionalRunner

log = logging.getLogger("ringmaster.worker")

_PR_SET_PDEATHSIG = 1
_GUARD_INTERVAL_S = 0.5  # heartbeat period, and how soon a worker notices its supervisor died
# Acknowledged outputs a worker keeps for its deferred batches, all partitions together (a
# digest and a counter slot each, ~100 bytes): past it the oldest partition's are dropped,
# and its outputs may be written again when its batch runs (at-least-once, said in the log).
MAX_CARRIED_OUTPUTS = 200_000


def _records_py(topic: str, partition: int, c: Columns) -> list[Record]:
    _check_shape(c)  # as the C version does: one item per record in every column, or an error
    ts_types = repeat(c.ts_types) if isinstance(c.ts_types, int) else c.ts_types
    stamps = zip(ts_types, c.timestamps, strict=False)  # ts_types may be an endless repeat
    return list(map(Record, repeat(topic), repeat(partition), c.offset_list(), c.keys, c.values,
                    repeat(None) if c.headers is None else c.headers, stamps))


def _check_shape(c: Columns) -> None:
    if not isinstance(c.values, list):
        raise ValueError("frame column values is not a list")
    n = len(c.values)
    columns = [("keys", c.keys), ("timestamps", c.timestamps)]
    columns += [(name, col) for name, col in (("offsets", c.offsets), ("headers", c.headers))
                if col is not None]
    if not isinstance(c.ts_types, int):
        columns.append(("timestamp types", c.ts_types))
    for name, col in columns:
        if not isinstance(col, list) or len(col) != n:
            raise ValueError(f"frame column {name} does not hold one item per record")


def _records_c(topic: str, partition: int, c: Columns) -> list[Record]:
    assert speedups.native is not None
    return speedups.native.build_records(  # type: ignore[no-any-return]
        Record, topic, partition, c.first, c.offsets, c.keys, c.values, c.headers, c.ts_types,
        c.timestamps)


def _same_records(a: list[Record], b: list[Record]) -> bool:
    def fields(r: Record) -> tuple[Any, ...]:
        return r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp
    return len(a) == len(b) and all(fields(x) == fields(y) for x, y in zip(a, b, strict=True))


BUILD_RECORDS = speedups.HotPath("build_records", _records_c if speedups.native is not None else None,
                              _records_py, _same_records)


def records_of(frame: BatchFrame) -> list[Record]:
    """Runs in: a worker (hot path). The Records of one batch frame: in C their slots are
    filled directly (~0.1 µs per record); in Python Record() runs per record (~0.3 µs)."""
    records = BUILD_RECORDS.call(frame.topic, frame.partition, frame.columns)
    if frame.delivery_counts is not None:  # a share group's batch
        for r, n in zip(records, frame.delivery_counts, strict=True):
            r.delivery_count = n
    return records


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    incarnation: int
    segment_path: str
    epochs_path: str
    plugin: str
    settings: dict[str, Any]
    output_topic: str | None
    dead_letter_topic: str | None
    producer_props: dict[str, Any]
    max_attempts: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    parent_pid: int
    delivery_timeout_s: float = 30.0
    max_message_bytes: int = 1_000_000
    log_level: str = "INFO"
    log_format: str = "text"
    input_topics: tuple[str, ...] = ()  # kafka.topics: an Output(topic=...) into one of them loops
    plugin_path: str = ""  # the generation's copy of the plugin's source (supervisor/workers/snapshots.py)
    # Exactly-once (runtime/kafka/transactions.py): this slot's transactional id ("" for
    # at-least-once), the segment holding the group's metadata, and the properties of the
    # client that reads the group's committed offsets.
    transactional_id: str = ""
    group_metadata_path: str = ""
    group_props: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"worker-{self.index}.{self.incarnation}"


# A terminal's hangup, Ctrl-C and Ctrl-\ reach the whole process group, and so does an
# operator's `kill -HUP -<pgid>`: a worker ignores them all (only the supervisor decides, and
# stops workers with SIGTERM). Most would otherwise end the process at once (HUP, USR1, USR2,
# QUIT with a core dump) or stop it (TTIN, TTOU), mid-batch.
WORKER_IGNORES = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                            signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH, signal.SIGPIPE})


@contextlib.contextmanager
def signals_held_for_spawn() -> Iterator[None]:
    """Runs in: supervisor, around starting a worker process. Blocks WORKER_IGNORES in the
    calling thread so the new process starts with them blocked (fork and exec keep the
    mask): one that arrives before the worker ignores them stays pending and is discarded
    when it does (ignore_operator_signals), instead of killing a worker still starting up.
    The helpers multiprocess starts on the way (fork server, resource tracker) keep them
    blocked for good. The supervisor gets what arrived meanwhile once the mask is restored."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORES)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_operator_signals() -> None:
    """Runs in: a worker, first thing. Ignore, then unblock (see signals_held_for_spawn)."""
    for sig in WORKER_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORES)


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when our parent dies (no orphans, invariant 7). With
    spawn the parent is the supervisor; with forkserver it is the fork server, which does
    not die with the supervisor (its children keep its "alive" pipe open), so the guard
    thread below watches the supervisor itself."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _start_guard(spec: WorkerSpec, board: Board, bell: Doorbell) -> None:
    """A daemon thread that beats the board's heartbeat every half second and kills this
    process as soon as the supervisor is gone, even while the plugin is busy in a long call.
    The heartbeat says the process is scheduled and can take the GIL; it stops for a
    SIGSTOPped process or a plugin that holds the GIL in C code."""
    try:
        pidfd: int | None = os.pidfd_open(spec.parent_pid)
    except (OSError, AttributeError):
        pidfd = None  # old kernel: the doorbell's end of file still tells, between batches
    # RACE: the supervisor could have died, and its pid been reused, before pidfd_open. The
    # doorbell's writing end is the supervisor's alone: not closed now means the pidfd is it.
    if bell.check_closed():
        os._exit(0)

    def guard() -> None:
        while True:
            board.beat()
            if pidfd is None:
                time.sleep(_GUARD_INTERVAL_S)
                continue
            readable, _, _ = select.select([pidfd], [], [], _GUARD_INTERVAL_S)
            if readable:
                os.kill(os.getpid(), signal.SIGKILL)

    board.beat()
    threading.Thread(target=guard, name="ringmaster-guard", daemon=True).start()


def worker_main(spec: WorkerSpec, doorbell: Any, results: Any) -> None:
    """Entry point of a worker process."""
    _die_with_parent()
    bell = Doorbell(doorbell.fileno())
    if bell.check_closed():
        os._exit(0)  # RACE: the supervisor died before we started
    stopping = [False]
    ignore_operator_signals()
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))  # the supervisor's stop
    configure_logging(spec.log_level, spec.log_format, role="worker")
    bind_fields(worker=spec.index, incarnation=spec.incarnation)

    segment = Segment(Path(spec.segment_path), 0, create=False)
    epochs_seg = Segment(Path(spec.epochs_path), 0, create=False)
    board = Board(segment.buf[:BOARD_BYTES])
    ring = Ring(segment.buf[BOARD_BYTES:])
    epochs = EpochTable(epochs_seg.buf)
    lock = BoardLock(spec.segment_path)
    _start_guard(spec, board, bell)

    results_fd = results.fileno()  # `results` (a Connection) keeps it open

    def send(result: Result) -> None:
        send_message(results_fd, encode_result(result))

    plugin, producer = _start_plugin(spec, send)
    version = plugin_version(spec.plugin)
    send(Result(HELLO, 0, -1, 0, detail=version))  # before READY: the supervisor knows what runs
    plain = BatchRunner(plugin, spec, board, producer, version)
    runner = TransactionalRunner.for_worker(plain, spec, board, producer_props(spec)) \
        if spec.transactional_id else plain
    # No gc.freeze() here, unlike the supervisor: with start-up's objects out of the count,
    # CPython runs full collections more often over what a plugin builds up (measured with
    # workers.fingerprint and its growing LSH index: +4.4 % worker CPU), and on trivial work
    # a worker ran 2 collections a run, so there was nothing to win.
    board.set_ready()
    log.debug("worker ready")
    fence = FenceCheck(epochs, board, lock)
    while True:
        view = ring.peek()
        if view is None:
            if stopping[0] or bell.closed:
                break
            bell.wait(ring, timeout=0.5)
            continue
        batch_id, slot, epoch = peek_header(view)
        if slot < 0:  # STOP frame: everything before it is done; exit cleanly
            view.release()
            ring.advance()
            break
        if stopping[0]:
            # SIGTERM: the supervisor fenced our partitions before asking us to stop, and the
            # next owner reads what is still queued again. Don't drain the ring (and don't
            # write FENCED results nobody reads: a full pipe would block us until SIGKILL).
            view.release()
            break
        if not fence.admit(batch_id, slot, epoch):  # RACE: decided in runtime/worker/fence.py
            view.release()
            ring.advance()
            send(Result(FENCED, batch_id, slot, epoch))
            continue
        frame = decode_frame(view)
        view.release()
        ring.advance()
        assert frame is not None
        result = runner.run(frame)
        if result.kind == EXHAUSTED:
            # Not the records' fault: the batch is not done (no board.end: the supervisor sees
            # it unfinished) and runs again on a fresh worker; this one leaves.
            send(result)
            break
        if result.kind in (BLOCKED, DEFERRED):
            fence.hold(slot, epoch)
        send(result)
        board.end(result.processed)
    _stop_plugin(plugin, runner, spec)
    ring.release()
    board.release()
    epochs.release()
    os._exit(0)


def probe_main(spec: WorkerSpec, results: Any) -> None:
    """Entry point of ``ringmaster check``'s throw-away worker: the daemon's own start path
    (``_start_plugin``: import, ``setup()``, the output producer), then ``teardown()``, then
    exit. Reports FATAL exactly as a daemon's worker would when the plugin cannot start, and
    DONE (with a teardown failure in ``detail``, if any) when it did.

    Runs in: a worker process started by pool.probe_plugin, never by the daemon."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(spec.log_level, spec.log_format, role="worker")
    bind_fields(worker=spec.index, incarnation=spec.incarnation)
    results_fd = results.fileno()

    def send(result: Result) -> None:
        send_message(results_fd, encode_result(result))

    plugin, _producer = _start_plugin(spec, send)  # never polled: it sends nothing, reports nothing
    detail = ""
    if plugin.teardown is not None:
        try:
            plugin.teardown()
        except BaseException as exc:  # reported, like the daemon's worker logs it
            detail = f"teardown() failed: {type(exc).__name__}: {exc}"
    send(Result(DONE, 0, -1, 0, detail=detail))
    os._exit(0)


def _start_plugin(spec: WorkerSpec, send: Any) -> tuple[Plugin, OutputProducer]:
    """Import the plugin, run its setup, create the producer. If that fails, say why (FATAL,
    the only time a worker sends it) and exit: the supervisor decides whether the daemon can
    go on."""
    try:
        plugin = load_plugin(spec.plugin, spec.plugin_path)
        context = Context(spec.name, spec.settings, spec.output_topic,
                          logging.getLogger(f"ringmaster.plugin.{spec.plugin}"))
        if plugin.setup is not None:
            plugin.setup(context)
        # Always there, so that Output(topic=...) is delivered even without [output] topic.
        return plugin, OutputProducer(producer_props(spec),
                                      own_topics=(spec.output_topic, spec.dead_letter_topic))
    except BaseException as exc:  # SystemExit too: sys.exit() in setup() is a setup failure
        if isinstance(exc, PluginError):
            detail = str(exc)
        elif isinstance(exc, KafkaError):
            detail = f"cannot create the output producer: {exc}"
        elif isinstance(exc, SystemExit):
            detail = f"plugin {spec.plugin!r} setup() called sys.exit({exc.code!r})"
        else:
            detail = f"plugin {spec.plugin!r} setup() failed: {type(exc).__name__}: {exc}"
        send(Result(FATAL, 0, -1, 0, detail=detail))
        os._exit(1)


def producer_props(spec: WorkerSpec) -> dict[str, Any]:
    """The output producer's properties: with this slot's transactional id under exactly-once."""
    if not spec.transactional_id:
        return spec.producer_props
    return {**spec.producer_props, "transactional.id": spec.transactional_id}


def _stop_plugin(plugin: Plugin, runner: BatchRunner | TransactionalRunner, spec: WorkerSpec) -> None:
    if plugin.teardown is not None:
        try:
            plugin.teardown()
        except BaseException:
            log.exception("plugin teardown failed")
    runner.close()


class BatchRunner:
    """Runs one batch through the plugin (runtime.execution.run: retries, then bisection) and
    delivers what came out: outputs to their topic, failures to the dead-letter topic.

    Delivery is part of the retry path: the outputs of each plugin call are produced and
    acknowledged before the call counts. A refused output fails its records like an
    exception; an outage (DeliveryFailed) or a plugin's Backoff defers the whole batch.

    What the broker acknowledged is not written again while this worker runs the same
    records: within the batch's retries and bisection (runtime/execution/run.py), and when
    a deferred batch comes back to this worker (``_carried``: the records it begins with are
    the deferred batch's). A batch that goes to another worker starts from nothing."""

    def __init__(self, plugin: Plugin, spec: WorkerSpec, board: Board, producer: OutputProducer,
                 version: str = "unknown") -> None:
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

    def run(self, frame: BatchFrame, records: list[Record] | None = None) -> Result:
        """``records``: the frame's records, when the caller built them already (exactly-once
        leaves out those an earlier transaction committed)."""
        head = (frame.batch_id, frame.slot, frame.epoch)
        try:
            result = self._run(frame, head, records_of(frame) if records is None else records)
            self.board.set_phase(PHASE_IDLE)  # reporting: a death from here on still blames the batch
            return result
        except (WorkerExhausted, MemoryError) as exc:
            detail = exc.detail if isinstance(exc, WorkerExhausted) else "memory (MemoryError)"
            fresh = self.board.batches == 0
            log.error("worker ran out of a resource; the batch is not done and runs again on a new worker",
                      extra={"worker": self.spec.name, "tp": tp_label((frame.topic, frame.partition)),
                             "resource": detail, "first_batch": fresh})
            return Result(EXHAUSTED, *head, detail=detail, cause=FRESH if fresh else WORN)

    def _run(self, frame: BatchFrame, head: tuple[int, int, int], records: list[Record]) -> Result:
        started = time.monotonic()
        self.route.take_discarded()
        tp = (frame.topic, frame.partition)
        acked = self._carried(tp, records)
        try:
            if self.spec.dead_letter_topic is None:
                return self._run_until_first_failure(records, head, started, acked)
            outcome = run_batch(self.plugin, records, self.policy,
                                deliver=self._deliver, phase=self.board.set_phase, acked=acked)
            self._dead_letter(outcome.failures)
        except BatchDeferred as d:
            self._carry(tp, records, acked)
            self._renew_producer_if_broken()
            log.warning("batch deferred", extra={
                "cause": d.cause, "tp": tp_label((frame.topic, frame.partition)), "reason": d.reason})
            delay_ms = -1 if d.delay_s is None else int(d.delay_s * 1000)
            return Result(DEFERRED, *head, detail=d.reason, cause=d.cause, delay_ms=delay_ms,
                          scope=d.scope)
        discarded = self.route.take_discarded()
        return Result(DONE, *head, processed=len(records), outputs=outcome.output_count - discarded,
                      dead_letters=len(outcome.failures), busy_ms=(time.monotonic() - started) * 1000,
                      discarded=discarded)

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
        them were acknowledged (``acknowledged``), when the producer knows."""
        i = 0
        # Looked up once a delivery, not once an output (the hot path: ~0.2 µs a record).
        produce, route, routed = self.producer.produce, self.route.topic, self._routed
        version_only, wait_s = self._version_only, self.spec.delivery_timeout_s
        default_topic = self.spec.output_topic
        try:
            for i, out in enumerate(outputs):  # noqa: B007 (i: where a refusal stopped us)
                topic = out.topic
                if not topic:
                    topic = default_topic or route(out)  # route() counts what has nowhere to go
                    if topic is None:
                        continue
                elif topic not in routed:
                    self._check_route(topic)
                # The common case, no headers, shares one list rather than building one per output.
                headers = with_version(out.headers, self.version) if out.headers else version_only
                produce(topic, out.value, out.key, headers, queue_wait_s=wait_s)
        except (OutputRejected, DeliveryFailed) as exc:
            # outputs[i] was refused (or the queue stayed full) before it was queued: settle
            # the ones queued before it, so that the retry knows what was written.
            raise_settled(outputs[:i], exc, self._flush, self._undelivered, self.spec.output_topic)
        try:
            self._flush()
        except (OutputRejected, DeliveryFailed) as exc:
            exc.acknowledged = acknowledged(outputs, self.producer.undelivered, self.spec.output_topic)
            raise

    def _flush(self) -> None:
        self.producer.deliver(self.spec.delivery_timeout_s, self.board.beat)

    def _undelivered(self) -> list[Any] | None:
        return self.producer.undelivered

    def _check_route(self, topic: str) -> None:
        """An Output(topic=...) into a topic the group reads is allowed – a deliberate re-queue
        (a retry topic the same group reads, a state machine) – but it feeds the daemon its
        own outputs, so the plugin must make it end: one warning per worker and topic. (The
        configured output and dead-letter topics are refused instead, runtime/config.py.)"""
        self._routed.add(topic)
        entry = subscribed_by(list(self.spec.input_topics), topic)
        if entry is not None:
            log.warning("the plugin routes outputs into a topic this group reads: the daemon will consume "
                        "them again (a loop, unless the plugin stops re-routing)",
                        extra={"worker": self.spec.name, "topic": topic, "subscription": entry})

    def _dead_letter(self, failures: list[Failure]) -> None:
        if not failures:
            return
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

    def _write_letters(self, topic: str, letters: list[DeadLetter]) -> None:
        for letter in letters:
            self.producer.produce(topic, letter.value, letter.key, letter.headers,
                                  queue_wait_s=self.spec.delivery_timeout_s)
        self.producer.deliver(self.spec.delivery_timeout_s, self.board.beat)

    def _renew_producer_if_broken(self) -> None:
        if self.producer.broken:
            log.warning("output producer hit a fatal error; creating a new one",
                        extra={"error": self.producer.fatal})
            self.producer = OutputProducer(producer_props(self.spec),
                                           own_topics=(self.spec.output_topic, self.spec.dead_letter_topic))

    def close(self) -> None:
        if self.producer.flush(10):
            log.warning("outputs still queued at exit")


