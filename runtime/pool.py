"""Worker lifecycle: spawn, reap, kill, stop. The only module that starts processes.

Each worker index owns one shared segment (its board and its ring) and one lock for the
whole run. Each incarnation of the worker gets a fresh doorbell pipe and result pipe.

Runs in: supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import multiprocess

from runtime.board import BOARD_BYTES, Board, BoardLock
from runtime.ring import Doorbell, MessageReader, Ring
from runtime.shm import Segment, SegmentSet
from runtime.worker import EXIT_DELIVERY, EXIT_PLUGIN, WorkerSpec, worker_main

log = logging.getLogger("ringmaster.pool")


@dataclass(eq=False)
class WorkerHandle:
    index: int
    segment: Segment
    ring: Ring
    board: Board
    incarnation: int = 0
    process: Any = None
    lock: BoardLock | None = None
    bell: Doorbell | None = None
    bell_conn: Any = None  # keeps the doorbell's writing end open
    results: MessageReader | None = None  # the reading end of the result pipe
    started_at: float = 0.0
    deaths_before_ready: int = 0
    consecutive_crashes: int = 0
    restart_at: float | None = None
    retiring: bool = False
    term_sent_at: float | None = None
    in_flight: dict[int, Any] = field(default_factory=dict)  # batch_id -> Batch, ring order
    partitions: set[tuple[str, int]] = field(default_factory=set)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    @property
    def accepting(self) -> bool:
        """May frames be written to this worker's ring now?"""
        return self.process is not None and not self.retiring and self.restart_at is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def describe_exit(code: int | None) -> tuple[int, str]:
    """(log level, words) for an exit status, by what it means for the operator."""
    if code is None:
        return logging.ERROR, "vanished"
    if code == 0:
        return logging.INFO, "exited cleanly"
    if code == EXIT_PLUGIN:
        return logging.CRITICAL, "could not load or set up the plugin"
    if code == EXIT_DELIVERY:
        return logging.ERROR, "could not deliver its outputs"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        if -code == signal.SIGKILL:
            return logging.ERROR, "killed by SIGKILL (perhaps out of memory)"
        if -code == signal.SIGTERM:
            return logging.INFO, "terminated by SIGTERM"
        return logging.ERROR, f"killed by {sig}"
    return logging.ERROR, f"exited with code {code}"


class WorkerPool:
    def __init__(self, segments: SegmentSet, processes: int, ring_bytes: int, start_method: str,
                 spec_for: Callable[[int, int, str], WorkerSpec]) -> None:
        self._ctx = multiprocess.get_context(start_method)
        self._spec_for = spec_for
        self.handles: list[WorkerHandle] = []
        for i in range(processes):
            seg = segments.create(f"w{i}", BOARD_BYTES + ring_bytes)
            board = Board(seg.buf[:BOARD_BYTES])
            board.reset()
            ring = Ring(seg.buf[BOARD_BYTES:])
            self.handles.append(WorkerHandle(i, seg, ring, board, lock=BoardLock(seg.path)))

    def spawn_worker(self, h: WorkerHandle) -> None:
        """Start a fresh incarnation on an empty ring."""
        h.incarnation += 1
        h.ring.reset()
        h.board.reset()
        bell_reader, bell_writer = self._ctx.Pipe(duplex=False)
        reader, writer = self._ctx.Pipe(duplex=False)
        spec = self._spec_for(h.index, h.incarnation, str(h.segment.path))
        proc = self._ctx.Process(target=worker_main, args=(spec, bell_reader, writer),
                                 name=spec.name, daemon=True)
        proc.start()
        writer.close()  # INVARIANT: only the worker holds the writing end, so EOF means death
        bell_reader.close()
        if h.bell_conn is not None:
            h.bell_conn.close()
        h.bell_conn = bell_writer
        h.bell = Doorbell(bell_writer.fileno())
        h.process, h.results = proc, MessageReader(reader.fileno(), owner=reader)
        h.started_at = time.monotonic()
        h.restart_at = None
        h.retiring = False
        h.term_sent_at = None
        log.info("worker started", extra={"worker": spec.name, "pid": proc.pid})

    def sentinels(self) -> list[Any]:
        return [h.process.sentinel for h in self.handles if h.alive]

    def result_fds(self) -> list[int]:
        return [h.results.fd for h in self.handles if h.results is not None]

    def dead(self) -> list[WorkerHandle]:
        return [h for h in self.handles if h.process is not None and h.process.exitcode is not None]

    def forget(self, h: WorkerHandle) -> int | None:
        """Collect a dead worker's process and pipe; return its exit code."""
        code = h.process.exitcode
        h.process.join(0)
        h.process.close()
        h.process = None
        if h.results is not None:
            h.results.close()
            h.results = None
        if h.bell_conn is not None:
            h.bell_conn.close()
            h.bell_conn, h.bell = None, None
        return code

    def kill(self, h: WorkerHandle, sig: int = signal.SIGKILL) -> None:
        if h.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(h.process.pid, sig)

    def stop_all(self, timeout_s: float) -> None:
        """SIGTERM every worker, wait up to timeout, then SIGKILL and join (no zombies)."""
        for h in self.handles:
            self.kill(h, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for h in self.handles:
            if h.process is not None:
                h.process.join(max(0.0, deadline - time.monotonic()))
        for h in self.handles:
            if h.alive:
                log.warning("worker did not stop in time; killing it", extra={"pid": h.pid})
                self.kill(h)
                h.process.join(5)
            if h.process is not None:
                self.forget(h)

    def close(self) -> None:
        for h in self.handles:
            h.ring.release()
            h.board.release()
            if h.lock is not None:
                h.lock.close()
