"""Worker processes: spawn, reap, kill. The only module that starts processes.

Each worker index (a **slot**) owns one shared segment (its board and its ring) and one lock,
from the first time the slot is used to the end of the run: the pool starts with
``workers.processes`` slots and adds one when a resize or a reload needs it, up to
``workers.max_processes + 1`` (a reload's first new worker runs beside the old ones). Each
incarnation of the worker gets a fresh doorbell pipe and result pipe, and runs the plugin
code it is given (:class:`PluginCode`: a reload gives new incarnations new code).
*When* to start, stop or replace a worker is workforce.py's decision; this module only does
it, and owns the process-level fields of :class:`WorkerHandle`.

Runs in: supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import multiprocess
import multiprocess.connection
import psutil

from runtime.errors import SharedMemoryError
from runtime.transport.board import BOARD_BYTES, Board, BoardLock
from runtime.transport.frames import FATAL, Result, decode_result
from runtime.transport.ring import Doorbell, MessageReader, Ring
from runtime.transport.shm import Segment, SegmentSet, check_space
from runtime.worker.main import WorkerSpec, probe_main, signals_held_for_spawn, worker_main

log = logging.getLogger("ringmaster.pool")
_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class PluginCode:
    """What a worker runs: the plugin module and its settings, as of one reading of the config
    (``generation`` 1 at start, one more for each reload)."""

    generation: int
    plugin: str
    settings: dict[str, Any]


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
    """(log level, words) for an exit status, by what it means for the operator. Only for
    deaths the supervisor did not cause: workforce.py words the ones it did."""
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


def start_resource_tracker() -> None:
    """Start multiprocess's resource tracker now (spawn and forkserver both start it with
    their first process) with the operator signals blocked, so it keeps them blocked for
    good: a hangup of the process group does not kill it. RACE: starting it unblocks
    SIGINT in the calling thread (bpo-33613's own guard), which must not happen while a
    worker starts, inside signals_held_for_spawn(): the tracker is already up by then."""
    from multiprocess import resource_tracker

    with signals_held_for_spawn():
        resource_tracker.ensure_running()


def become_subreaper() -> None:
    """Processes a plugin starts in a worker outlive it when it dies; as a child subreaper
    the supervisor inherits them (instead of init), so it can kill and reap them: nothing
    of a run survives the supervisor (invariant 7)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class WorkerPool:
    def __init__(self, segments: SegmentSet, processes: int, ring_bytes: int, start_method: str,
                 spec_for: Callable[[int, int, str, PluginCode], WorkerSpec], max_slots: int = 0) -> None:
        self._ctx = multiprocess.get_context(start_method)
        if start_method == "forkserver":
            # The fork server imports the worker's modules once; each worker forks from it.
            self._ctx.set_forkserver_preload(["runtime.worker.main"])
        start_resource_tracker()
        self._spec_for = spec_for
        self._segments = segments
        self._ring_bytes = ring_bytes
        self.max_slots = max(max_slots, processes)
        self._first_slots = processes  # their space was checked together (run_daemon)
        self._orphans: set[int] = set()
        self.handles: list[WorkerHandle] = []  # grows (add_slot), never shrinks: an index is a slot
        for _ in range(processes):
            self.add_slot()

    def add_slot(self) -> WorkerHandle:
        """Create the next slot's segment. SharedMemoryError (one line: what to change) when
        shm_dir has no room for another ring, or the slots are all used."""
        i = len(self.handles)
        if i >= self.max_slots:
            raise SharedMemoryError(f"no worker slot left ({self.max_slots} in use); raise "
                                    "workers.max_processes and restart")
        try:
            if i >= self._first_slots:
                check_space(self._segments.dir, BOARD_BYTES + self._ring_bytes + 4096)
            seg = self._segments.create(f"w{i}", BOARD_BYTES + self._ring_bytes)
        except SharedMemoryError as exc:
            if i < self._first_slots:
                raise
            raise SharedMemoryError(f"cannot add worker slot {i}: {exc}") from None
        board = Board(seg.buf[:BOARD_BYTES])
        board.reset()
        ring = Ring(seg.buf[BOARD_BYTES:])
        h = WorkerHandle(i, seg, ring, board, BoardLock(seg.path))
        self.handles.append(h)
        return h

    def spawn_worker(self, h: WorkerHandle, code: PluginCode) -> None:
        """Start a fresh incarnation on an empty ring, running ``code``."""
        h.incarnation += 1
        h.ring.reset()
        h.board.reset()
        bell_reader, bell_writer = self._ctx.Pipe(duplex=False)
        reader, writer = self._ctx.Pipe(duplex=False)
        spec = self._spec_for(h.index, h.incarnation, str(h.segment.path), code)
        proc = self._ctx.Process(target=worker_main, args=(spec, bell_reader, writer),
                                 name=spec.name, daemon=True)
        with signals_held_for_spawn():  # a SIGHUP to the group never kills a starting worker
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
        log.info("worker started", extra={"worker": h.index, "incarnation": h.incarnation, "pid": proc.pid})

    def sentinels(self) -> list[Any]:
        return [h.process.sentinel for h in self.handles if h.alive]

    def result_fds(self) -> list[int]:
        return [h.results.fd for h in self.handles if h.results is not None]

    def dead(self) -> list[WorkerHandle]:
        """Workers whose process ended. Only those whose sentinel (a pipe end the child held)
        reads as closed are waited for: a waitpid per worker per tick cost 3 % of the
        supervisor on trivial work."""
        live = {h.process.sentinel: h for h in self.handles if h.process is not None}
        if not live:
            return []
        ended, _, _ = select.select(list(live), [], [], 0)
        return [live[s] for s in ended if live[s].process.exitcode is not None]

    def forget(self, h: WorkerHandle) -> int | None:
        """Collect a dead worker's process and pipes, and kill what its plugin left running;
        return its exit code."""
        code: int | None = h.process.exitcode
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
        """Remember what each worker's plugin started (the processes are gone from the tree
        once their worker dies)."""
        for h in self.handles:
            if h.alive and h.pid is not None:
                with contextlib.suppress(psutil.Error, OSError):  # OSError: EMFILE, raised as is
                    h.descendants = [psutil.Process(pid) for pid in descendant_pids(h.pid)]

    def _kill_descendants(self, h: WorkerHandle) -> None:
        for p in h.descendants:
            with contextlib.suppress(psutil.Error, OSError):
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
        try:
            children = psutil.Process().children()
        except (psutil.Error, OSError):
            log.warning("cannot list the supervisor's children to kill strays", exc_info=True)
            return
        for child in children:
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


def descendant_pids(pid: int) -> list[int]:
    """Every process below pid. From /proc/<pid>/task/<tid>/children, which the kernel keeps
    per thread, instead of psutil's children(), which reads every process in /proc to find
    the parents (8 % of a 15-worker supervisor's samples on a 16-core host). Falls back to
    psutil where that file does not exist (kernels without CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{parent}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except FileNotFoundError:
                if parent == pid and not out:
                    return [c.pid for c in psutil.Process(pid).children(recursive=True)]
                continue
            except OSError:
                continue
            out += kids
            todo += kids
    return out


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


@dataclass(frozen=True)
class ProbeOutcome:
    """What ``ringmaster check``'s throw-away worker said: ``problem`` is None when the
    plugin imported and its ``setup()`` returned; ``teardown_problem`` is a failure of its
    ``teardown()`` (the daemon logs those and goes on)."""

    problem: str | None
    teardown_problem: str | None
    seconds: float


def probe_plugin(spec: WorkerSpec, start_method: str, timeout_s: float) -> ProbeOutcome:
    """Start one worker the way the pool does, let it import the plugin, run ``setup()`` and
    ``teardown()`` (runtime.worker.main.probe_main), and judge it as the workforce judges a
    start: by what it reported, within ``timeout_s`` (workers.setup_timeout_s).

    Runs in: the CLI (``ringmaster check``); no shared memory, no consumer."""
    ctx = multiprocess.get_context(start_method)
    reader, writer = ctx.Pipe(duplex=False)
    started = time.monotonic()
    proc = ctx.Process(target=probe_main, args=(spec, writer), name=spec.name, daemon=True)
    proc.start()
    writer.close()  # INVARIANT: only the worker holds the writing end, so EOF means it is gone
    messages = MessageReader(reader.fileno(), owner=reader)
    result: Result | None = None
    deadline = started + timeout_s
    try:
        while result is None and not messages.eof:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            multiprocess.connection.wait([messages.fd], left)
            for m in messages.read():
                result = decode_result(m)
        took = time.monotonic() - started
        if result is None:
            if proc.exitcode is None and not messages.eof:
                proc.kill()
                proc.join(5)
                return ProbeOutcome(f"plugin {spec.plugin!r} did not finish import and setup() within "
                                    f"{timeout_s:g} s (workers.setup_timeout_s)", None, took)
            proc.join(5)
            return ProbeOutcome(f"the worker died ({describe_exit(proc.exitcode)[1]}) while importing the "
                                "plugin or running its setup(), without a word", None, took)
        proc.join(5)
        if result.kind == FATAL:
            return ProbeOutcome(result.detail, None, took)
        return ProbeOutcome(None, result.detail or None, took)
    finally:
        if proc.exitcode is None:
            proc.kill()
            proc.join(5)
        proc.close()
        messages.close()
