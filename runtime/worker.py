"""The loop inside a worker process.

    ring ──peek──▶ fence check (under the worker lock) ──▶ decode ──▶ plugin.process
         ◀─advance─┘                                                   │
    result pipe ◀── DONE / FENCED / BLOCKED ◀── flush (outputs + dead letters acked) ◀┘

Runs in: a worker process started with spawn/forkserver (never forked from a process that
holds a librdkafka client). It never talks to the consumer group; it only produces.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from runtime import speedups
from runtime.board import BOARD_BYTES, Board, BoardLock, EpochTable
from runtime.deadletter import dead_letter_headers
from runtime.errors import PluginError
from runtime.execution import Failure, RetryPolicy, run_batch
from runtime.frames import (
    BLOCKED,
    DONE,
    FATAL,
    FENCED,
    BatchFrame,
    Columns,
    Result,
    decode_frame,
    encode_result,
    peek_header,
)
from runtime.kafka import DeliveryFailed, OutputProducer
from runtime.logs import configure_logging
from runtime.plugin import Context, Output, Plugin, Record, load_plugin
from runtime.ring import Doorbell, Ring, send_message
from runtime.shm import Segment

log = logging.getLogger("ringmaster.worker")

# Reserved exit codes (like gunicorn's): the supervisor reads them to tell a broken
# deployment, which must stop the daemon, from a crash, which is retried.
EXIT_PLUGIN = 3
EXIT_DELIVERY = 75
_PR_SET_PDEATHSIG = 1


def _records_py(topic: str, partition: int, c: Columns) -> list[Record]:
    ts_types = repeat(c.ts_types) if isinstance(c.ts_types, int) else c.ts_types
    stamps = zip(ts_types, c.timestamps, strict=False)  # ts_types may be an endless repeat
    return list(map(Record, repeat(topic), repeat(partition), c.offset_list(), c.keys, c.values,
                    repeat(None) if c.headers is None else c.headers, stamps))


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
    return BUILD_RECORDS.call(frame.topic, frame.partition, frame.columns)  # type: ignore[no-any-return]


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
    log_level: str = "INFO"
    log_format: str = "text"

    @property
    def name(self) -> str:
        return f"worker-{self.index}.{self.incarnation}"


def _die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when the supervisor dies (no orphans, invariant 7).
    The worker loop also checks getppid() as a fallback for non-Linux systems."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def worker_main(spec: WorkerSpec, doorbell: Any, results: Any) -> None:
    """Entry point of a worker process."""
    _die_with_parent()
    if os.getppid() != spec.parent_pid:
        os._exit(0)  # RACE: the supervisor died before prctl took effect
    stopping = [False]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group;
    signal.signal(signal.SIGTERM, lambda *_: stopping.__setitem__(0, True))  # supervisor decides
    configure_logging(spec.log_level, spec.log_format)

    segment = Segment(Path(spec.segment_path), 0, create=False)
    epochs_seg = Segment(Path(spec.epochs_path), 0, create=False)
    board = Board(segment.buf[:BOARD_BYTES])
    ring = Ring(segment.buf[BOARD_BYTES:])
    epochs = EpochTable(epochs_seg.buf)
    bell = Doorbell(doorbell.fileno())
    lock = BoardLock(spec.segment_path)

    results_fd = results.fileno()  # `results` (a Connection) keeps it open

    def send(result: Result) -> None:
        send_message(results_fd, encode_result(result))

    try:
        plugin = load_plugin(spec.plugin)
        context = Context(spec.name, spec.settings, spec.output_topic,
                          logging.getLogger(f"ringmaster.plugin.{spec.plugin}"))
        if plugin.setup is not None:
            plugin.setup(context)
        needs_producer = spec.output_topic is not None or spec.dead_letter_topic is not None
        producer = OutputProducer(spec.producer_props) if needs_producer else None
    except Exception as exc:
        detail = str(exc) if isinstance(exc, PluginError) else \
            f"plugin {spec.plugin!r} setup failed: {type(exc).__name__}: {exc}"
        send(Result(FATAL, 0, -1, 0, detail=detail))
        os._exit(EXIT_PLUGIN)

    runner = BatchRunner(plugin, producer, spec)
    # No gc.freeze() here, unlike the supervisor: with start-up's objects out of the count,
    # CPython runs full collections more often over what a plugin builds up (measured with
    # workers.fingerprint and its growing LSH index: +4.4 % worker CPU), and on trivial work
    # a worker ran 2 collections a run, so there was nothing to win.
    board.set_ready()
    log.debug("worker ready", extra={"worker": spec.name})
    while True:
        board.beat()
        view = ring.peek()
        if view is None:
            if stopping[0]:
                break
            if not bell.wait(ring, timeout=0.5) and os.getppid() != spec.parent_pid:
                break  # orphaned: the supervisor is gone
            continue
        batch_id, slot, epoch = peek_header(view)
        if slot < 0:  # STOP frame: everything before it is done; exit cleanly
            view.release()
            ring.advance()
            break
        # RACE: revocation bumps the epoch and then reads our current batch under this same
        # lock. Either we see the new epoch here and skip the frame, or the supervisor
        # sees the batch we begin here and waits for it: never both missed (invariant 5).
        with lock:
            live = epochs.get(slot) == epoch and slot not in runner.blocked_slots
            if live:
                board.begin(batch_id, slot)
        if not live:
            view.release()
            ring.advance()
            kind = FENCED if epochs.get(slot) != epoch else BLOCKED
            send(Result(kind, batch_id, slot, epoch))
            continue
        frame = decode_frame(view)
        view.release()
        ring.advance()
        try:
            result = runner.run(frame)
        except DeliveryFailed as exc:
            log.error("outputs could not be delivered; restarting the worker",
                      extra={"worker": spec.name, "error": str(exc)})
            os._exit(EXIT_DELIVERY)
        send(result)
        board.end(len(frame.columns))
    if plugin.teardown is not None:
        try:
            plugin.teardown()
        except Exception:
            log.exception("plugin teardown failed", extra={"worker": spec.name})
    if producer is not None:
        with contextlib.suppress(DeliveryFailed):
            producer.flush(10)
    ring.release()
    board.release()
    epochs.release()
    os._exit(0)


class BatchRunner:
    """Runs one batch through the plugin (runtime.execution: retries, then bisection) and
    delivers what came out: outputs to their topic, failures to the dead-letter topic."""

    def __init__(self, plugin: Plugin, producer: OutputProducer | None, spec: WorkerSpec) -> None:
        self.plugin = plugin
        self.producer = producer
        self.spec = spec
        self.policy = RetryPolicy(spec.max_attempts, spec.retry_backoff_s, spec.retry_backoff_max_s)
        self.blocked_slots: set[int] = set()
        self._warned_no_output = False

    def run(self, frame: BatchFrame) -> Result:
        records = records_of(frame)
        outcome = run_batch(self.plugin, records, self.policy, self.spec.name)
        first = outcome.first_failure
        if first is not None and self.spec.dead_letter_topic is None:
            # INVARIANT: never skip a record silently. Without a dead-letter topic the
            # partition stops at its first failing record: nothing after it is produced and
            # the batch is not acknowledged, so nothing from it on is committed.
            self.blocked_slots.add(frame.slot)
            self._produce_outputs(outcome.outputs_before(first.record.offset))
            self._flush()
            return Result(BLOCKED, frame.batch_id, frame.slot, frame.epoch,
                          detail=f"offset {first.record.offset}: {first.error_type}: {first.message}")
        for failure in outcome.failures:
            self._dead_letter(failure)
        n_out = self._produce_outputs(outcome.outputs_before())
        self._flush()
        return Result(DONE, frame.batch_id, frame.slot, frame.epoch, processed=len(records),
                      outputs=n_out, dead_letters=len(outcome.failures))

    # -- producing -------------------------------------------------------------------
    def _produce_outputs(self, outputs: list[Output]) -> int:
        n = 0
        for out in outputs:
            topic = out.topic or self.spec.output_topic
            if topic is None or self.producer is None:
                if not self._warned_no_output:
                    log.warning("plugin produced outputs but no [output] topic is configured; "
                                "they are discarded", extra={"worker": self.spec.name})
                    self._warned_no_output = True
                continue
            self.producer.produce(topic, out.value, out.key, out.headers)
            n += 1
        return n

    def _dead_letter(self, f: Failure) -> None:
        assert self.producer is not None and self.spec.dead_letter_topic is not None
        r = f.record
        headers = dead_letter_headers(r.headers, error_type=f.error_type, message=f.message,
                                      traceback=f.traceback, topic=r.topic, partition=r.partition,
                                      offset=r.offset, attempts=f.attempts, worker=self.spec.name)
        self.producer.produce(self.spec.dead_letter_topic, r.value, r.key, headers)
        log.error("record dead-lettered", extra={
            "worker": self.spec.name, "tp": f"{r.topic}[{r.partition}]", "offset": r.offset,
            "error": f"{f.error_type}: {f.message}"})

    def _flush(self) -> None:
        if self.producer is not None:
            self.producer.flush()
