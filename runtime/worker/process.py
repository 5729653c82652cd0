"""A worker process from its start to its exit: the spawn target (``run_worker``), start-up
(the plugin's setup, the output producer, the runner), the loop, teardown; and the entry of
``ringmaster check``'s throw-away worker (``probe_main``).

    ring ──peek──▶ fence check (fence.py, under the worker lock) ──▶ decode ──▶ plugin.process
         ◀─advance─┘                                                   │
    result pipe ◀── DONE / FENCED / BLOCKED / DEFERRED ◀── deliver (outputs + dead letters acked) ◀┘
                ◀── EXHAUSTED (out of descriptors or memory: not done; the worker exits)

From decode to deliver is the runner's: batch_runner.py, inside one transaction per batch
under exactly-once (transactional.py).

Runs in: a worker process started with spawn/forkserver by supervisor/workers/pool.py (never
forked from a process that holds a librdkafka client). It never talks to the consumer group;
it only produces.

What the supervisor learns from a worker is what the worker *reports*, never how it ended:
FATAL is sent only before READY (the plugin could not start), and a worker that was ready
and dies has crashed, whatever its exit status (a plugin may call ``os._exit(3)``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.errors import KafkaError, PluginError
from runtime.kafka.producer import OutputProducer
from runtime.ops.logs import bind_fields, configure_logging
from runtime.plugin import Context, Plugin, load_plugin, plugin_version
from runtime.transport.board import BOARD_BYTES, Board, BoardLock, EpochTable
from runtime.transport.frames import (
    BLOCKED,
    DEFERRED,
    DONE,
    EXHAUSTED,
    FATAL,
    FENCED,
    HELLO,
    Result,
    decode_frame,
    encode_result,
    peek_header,
)
from runtime.transport.ring import Doorbell, Ring, send_message
from runtime.transport.shm import Segment
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.fence import FenceCheck
from runtime.worker.lineage import bind_forks_to_worker, die_with_parent, start_guard
from runtime.worker.signal_mask import ignore_operator_signals
from runtime.worker.spec import WorkerSpec, producer_props
from runtime.worker.transactional import TransactionalRunner

log = logging.getLogger("ringmaster.worker")


def run_worker(spec: WorkerSpec, bell_reader: Any, writer: Any) -> None:
    """The worker process's target (runtime.supervisor.workers.pool starts it)."""
    bind_forks_to_worker()
    worker_main(spec, bell_reader, writer)


def worker_main(spec: WorkerSpec, doorbell: Any, results: Any) -> None:
    """Entry point of a worker process."""
    die_with_parent()
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
    start_guard(spec.parent_pid, board, bell)

    results_fd = results.fileno()  # `results` (a Connection) keeps it open
    # RACE: the acknowledgement watcher (batch_runner.py) reports a batch in flight from its own
    # thread: a report's bytes on the pipe and the board's counters are written under this lock.
    reporting = threading.Lock()

    def send(result: Result, then: Callable[[int], None] | None = None) -> None:
        """``then``: the board's update for a batch's report (``board.end``, ``board.delivered``),
        made after the send: a death after the send blames nothing, the supervisor having
        drained the pipe first (workforce.py)."""
        with reporting:
            send_message(results_fd, encode_result(result))
            if then is not None:
                then(result.processed)

    plugin, producer = _start_plugin(spec, send)
    version = plugin_version(spec.plugin)
    send(Result(HELLO, 0, -1, 0, detail=version))  # before READY: the supervisor knows what runs
    fence = FenceCheck(epochs, board, lock)

    def settled(result: Result) -> None:
        """A pipelined batch's report, once the broker took its outputs (or did not)."""
        if result.kind == DEFERRED:
            fence.hold(result.slot, result.epoch)
        send(result, board.delivered)

    # Exactly-once commits each batch's outputs in its transaction before the next: no pipelining.
    pipelined = spec.pipelined_delivery and not spec.transactional_id
    plain = BatchRunner(plugin, spec, board, producer, version, on_settled=settled if pipelined else None)
    runner = TransactionalRunner.for_worker(plain, spec, board, producer_props(spec)) \
        if spec.transactional_id else plain
    # No gc.freeze() here, unlike the supervisor: with start-up's objects out of the count,
    # CPython runs full collections more often over what a plugin builds up (measured with
    # workers.fingerprint and its growing LSH index: +4.4 % worker CPU), and on trivial work
    # a worker ran 2 collections a run, so there was nothing to win.
    board.set_ready()
    log.debug("worker ready")
    if isinstance(runner, TransactionalRunner):
        runner.prepare()  # after READY: a coordinator slow to answer is no failed start
    while True:
        view = ring.peek()
        if view is None:
            if plain.in_flight is not None:
                plain.settle()  # nothing else to run meanwhile: wait for its acknowledgements
                continue
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
        if result is None:  # its outputs are in flight (on the board as delivering): reported once settled
            continue
        if result.kind == EXHAUSTED:
            # Not the records' fault: the batch is not done (no board.end: the supervisor sees
            # it unfinished) and runs again on a fresh worker; this one leaves, after the batch
            # before it is settled.
            plain.settle()
            send(result)
            break
        if result.kind in (BLOCKED, DEFERRED):
            fence.hold(slot, epoch)
        send(result, board.end)
    plain.settle()  # the batch in flight, if any, is reported before the worker leaves
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
    die_with_parent()
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


def _stop_plugin(plugin: Plugin, runner: BatchRunner | TransactionalRunner, spec: WorkerSpec) -> None:
    if plugin.teardown is not None:
        try:
            plugin.teardown()
        except BaseException:
            log.exception("plugin teardown failed")
    runner.close()
