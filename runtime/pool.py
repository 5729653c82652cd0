"""Worker processes: spawn, reap, kill. The only module that starts processes.

Each worker index owns one shared segment (its board and its ring) and one lock for the
whole run. Each incarnation of the worker gets a fresh doorbell pipe and result pipe.
*When* to start, stop or replace a worker is workforce.py's decision; this module only does
it, and owns the process-level fields of :class:`WorkerHandle`.

Runs in: supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import multiprocess
import multiprocess.connection
import psutil

from runtime.board import BOARD_BYTES, Board, BoardLock
from runtime.ring import Doorbell, MessageReader, Ring
from runtime.shm import Segment, SegmentSet
from runtime.worker import WorkerSpec, worker_main

log = logging.getLogger("ringmaster.pool")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(eq=False)
class WorkerHandle:
    """One worker slot. Every field is written by WorkerPool only."""

    index: int
    segment: Segment
    ring: Ring
    board: Board
    lock: BoardLock
    incarnation: int = 0
    process: Any = None
    bell: Doorbell | None = None
    bell_conn: Any = None  # keeps the doorbell's writing end open
    results: MessageReader | None = None  # the reading end of the result pipe
    started_at: float = 0.0
    # Processes the plugin started from this worker, seen at the last watch: killed with it.
    descendants: list[psutil.Process] = field(default_factory=list)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


def describe_exit(code: int | None) -> tuple[int, str]:
    """(log level, words) for an exit status, by what it means for the operator."""
    if code is None:
        return logging.ERROR, "vanished"
    if code == 0:
        return logging.WARNING, "exited with status 0"
    if code < 0:
        sig = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        if -code == signal.SIGKILL:
            return logging.ERROR, "killed by SIGKILL (perhaps out of memory)"
        return logging.ERROR, f"killed by {sig}"
    return logging.ERROR, f"exited with status {code}"


def become_subreaper() -> None:
    """Processes a plugin starts in a worker outlive it when it dies; as a child subreaper
    the supervisor inherits them (instead of init), so it can kill and reap them: nothing
    of a run survives the supervisor (invariant 7)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class WorkerPool:
    def __init__(self, segments: SegmentSet, processes: int, ring_bytes: int, start_method: str,
                 spec_for: Callable[[int, int, str], WorkerSpec]) -> None:
        self._ctx = multiprocess.get_context(start_method)
        if start_method == "forkserver":
            # The fork server imports the worker's modules once; each worker forks from it.
            self._ctx.set_forkserver_preload(["runtime.worker"])
        self._spec_for = spec_for
        self._orphans: set[int] = set()
        self.handles: list[WorkerHandle] = []
        for i in range(processes):
            seg = segments.create(f"w{i}", BOARD_BYTES + ring_bytes)
            board = Board(seg.buf[:BOARD_BYTES])
            board.reset()
            ring = Ring(seg.buf[BOARD_BYTES:])
            self.handles.append(WorkerHandle(i, seg, ring, board, BoardLock(seg.path)))

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
        h.descendants = []
        log.info("worker started", extra={"worker": spec.name, "pid": proc.pid})

    def sentinels(self) -> list[Any]:
        return [h.process.sentinel for h in self.handles if h.alive]

    def result_fds(self) -> list[int]:
        return [h.results.fd for h in self.handles if h.results is not None]

    def dead(self) -> list[WorkerHandle]:
        return [h for h in self.handles if h.process is not None and h.process.exitcode is not None]

    def forget(self, h: WorkerHandle) -> int | None:
        """Collect a dead worker's process and pipes, and kill what its plugin left running;
        return its exit code."""
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
        self._kill_descendants(h)
        return code

    def watch_descendants(self) -> None:
        """Remember what each worker's plugin started (psutil: the processes are gone from
        the tree once their worker dies)."""
        for h in self.handles:
            if h.alive:
                with contextlib.suppress(psutil.Error):
                    h.descendants = psutil.Process(h.pid).children(recursive=True)

    def _kill_descendants(self, h: WorkerHandle) -> None:
        for p in h.descendants:
            with contextlib.suppress(psutil.Error):
                if p.is_running():  # compares the start time too: never a reused pid
                    p.kill()
                    log.warning("killed a process left by the plugin", extra={"pid": p.pid})
                self._orphans.add(p.pid)
        h.descendants = []
        self.reap_orphans()

    def reap_orphans(self) -> None:
        """Reap what the plugin left behind and we killed: as a subreaper the supervisor is
        their parent now. Only those pids: workers are multiprocess's to wait for (it would
        lose their exit status if we did), and other children are not ours to judge."""
        for pid in list(self._orphans):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid  # not our child (its parent was alive) or already reaped
            if done:
                self._orphans.discard(pid)

    def kill_strays(self) -> None:
        """At exit: any child that is not a worker or multiprocess's own helper is something a
        plugin started whose worker died before we saw it. Nothing survives the supervisor."""
        known = {h.pid for h in self.handles if h.pid is not None} | _multiprocess_helpers()
        for child in psutil.Process().children():
            if child.pid in known:
                continue
            with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
                child.kill()
                os.waitpid(child.pid, 0)

    def kill(self, h: WorkerHandle, sig: int = signal.SIGKILL) -> None:
        if h.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(h.process.pid, sig)

    def stop_all(self, timeout_s: float, drain: Callable[[], None] = lambda: None) -> None:
        """SIGTERM every worker, wait up to timeout (draining result pipes meanwhile, so that
        no worker blocks writing a result nobody reads), then SIGKILL and join (no zombies)."""
        self.watch_descendants()
        for h in self.handles:
            self.kill(h, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(h.alive for h in self.handles) and time.monotonic() < deadline:
            drain()
            multiprocess.connection.wait(self.sentinels() + self.result_fds(),
                                         min(0.1, max(0.0, deadline - time.monotonic())))
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
            h.lock.close()


def _multiprocess_helpers() -> set[int]:
    """The fork server and resource tracker multiprocess may have started (not to be killed)."""
    pids = set()
    with contextlib.suppress(Exception):
        from multiprocess import forkserver, resource_tracker

        for pid in (getattr(forkserver._forkserver, "_forkserver_pid", None),
                    getattr(resource_tracker._resource_tracker, "_pid", None)):
            if pid:
                pids.add(pid)
    return pids
