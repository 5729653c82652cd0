"""Worker processes: spawn, reap, kill. Starts processes: the workers, and ``ringmaster
check``'s throw-away worker (the supervisor's only other process start is members.py's).

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
import dataclasses
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import multiprocess
import multiprocess.connection
import psutil

from runtime.errors import SharedMemoryError
from runtime.supervisor.seams.pool import PluginCode
from runtime.supervisor.workers.snapshots import PluginSources
from runtime.transport.board import BOARD_BYTES, Board, BoardLock
from runtime.transport.frames import FATAL, Result, decode_result
from runtime.transport.ring import Doorbell, MessageReader, Ring
from runtime.transport.shm import Segment, SegmentSet, check_space, reclaim_stale
from runtime.worker.process import probe_main, run_worker
from runtime.worker.signal_mask import signals_held_for_spawn
from runtime.worker.spec import WorkerSpec

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
    # Readable once the process has exited (None where the kernel has no pidfd_open: the
    # process's sentinel then, which a process the plugin forked may hold open after it).
    pidfd: int | None = None

    @property
    def death_fd(self) -> Any:
        return self.pidfd if self.pidfd is not None else self.process.sentinel

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
    """Processes a plugin starts in a worker outlive it when it dies, or when they detach (a
    double fork, ``setsid``, a daemon): as a child subreaper the supervisor inherits every one
    of them (instead of init), so they stay below it, however they detach, as long as it lives,
    and it can end and reap them (invariant 7). See :meth:`WorkerPool.end_strays`."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


class WorkerPool:
    def __init__(self, segments: SegmentSet, processes: int, ring_bytes: int, start_method: str,
                 spec_for: Callable[[int, int, str, PluginCode], WorkerSpec], max_slots: int = 0,
                 sources: PluginSources | None = None) -> None:
        """``sources``: where each code generation's copy of the plugin is kept (None: workers
        import the files on disk)."""
        self._ctx = multiprocess.get_context(start_method)
        if start_method == "forkserver":
            # The fork server imports the worker's modules once; each worker forks from it.
            self._ctx.set_forkserver_preload(["runtime.worker.process"])
        start_resource_tracker()
        self._spec_for = spec_for
        self._sources = sources
        self._segments = segments
        self._ring_bytes = ring_bytes
        self.max_slots = max(max_slots, processes)
        self._first_slots = processes  # their space was checked together (run_daemon)
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
        if self._sources is not None:
            snapshot = self._sources.for_generation(code.generation, code.plugin)
            if snapshot.path is not None:
                spec = dataclasses.replace(spec, plugin_path=snapshot.path)
        proc = self._ctx.Process(target=run_worker, args=(spec, bell_reader, writer),
                                 name=spec.name, daemon=True)
        with signals_held_for_spawn():  # a SIGHUP to the group never kills a starting worker
            proc.start()
        # Only the worker holds the writing end, and what its plugin forks: not a sign of death.
        writer.close()
        bell_reader.close()
        h.pidfd = _pidfd_open(proc.pid)
        if h.bell_conn is not None:
            h.bell_conn.close()
        h.bell_conn = bell_writer
        h.bell = Doorbell(bell_writer.fileno())
        h.process, h.results = proc, MessageReader(reader.fileno(), owner=reader)
        h.started_at = time.monotonic()
        log.info("worker started", extra={"worker": h.index, "incarnation": h.incarnation, "pid": proc.pid})

    def code_held(self, generation: int) -> bool:
        """Whether a worker of ``generation`` started now runs the code that generation started
        with (a copy of its source), not the files on disk."""
        return self._sources is not None and self._sources.held(generation)

    def sentinels(self) -> list[Any]:
        """What reads as ready when a worker ends: its pidfd. Not its multiprocess sentinel
        alone: with ``spawn`` that is a pipe every process the plugin forks inherits, so a
        worker whose plugin left a child behind would never be seen to die."""
        return [h.death_fd for h in self.handles if h.alive]

    def result_fds(self) -> list[int]:
        return [h.results.fd for h in self.handles if h.results is not None]

    def dead(self) -> list[WorkerHandle]:
        """Workers whose process ended. Only those whose pidfd (or sentinel) reads as ready
        are waited for: a waitpid per worker per tick cost 3 % of the
        supervisor on trivial work."""
        live = {h.death_fd: h for h in self.handles if h.process is not None}
        if not live:
            return []
        ended, _, _ = select.select(list(live), [], [], 0)
        return [live[s] for s in ended if live[s].process.exitcode is not None]

    def forget(self, h: WorkerHandle) -> int | None:
        """Collect a dead worker's process and pipes, and end what its plugin left running;
        return its exit code."""
        code: int | None = h.process.exitcode
        h.process.join(0)  # INVARIANT: reaped, so its children are the supervisor's now (below)
        h.process.close()
        h.process = None
        if h.pidfd is not None:
            os.close(h.pidfd)
            h.pidfd = None
        if h.results is not None:
            h.results.close()
            h.results = None
        if h.bell_conn is not None:
            h.bell_conn.close()
            h.bell_conn, h.bell = None, None
        self.end_strays()
        return code

    def _strays(self) -> list[int]:
        """The supervisor's children that are neither a worker nor multiprocess's helpers:
        processes a plugin started whose parent is gone (their worker died, or they detached).
        As a subreaper the supervisor is the parent of every such process: the kernel moves an
        orphan to it when its parent exits, before that parent can be waited for."""
        known = {h.pid for h in self.handles if h.process is not None} | _multiprocess_helpers()
        return [pid for pid in child_pids(os.getpid()) if pid not in known]

    def end_strays(self) -> None:
        """End every stray and everything below it, and reap them. Called when a worker ends
        (its own processes became strays) and at exit. A process that detached from a worker
        that still runs is a stray too, and cannot be told from the dead worker's: it is ended
        with the first worker that ends (docs/operations.md, "Processes a plugin starts")."""
        for _ in range(_STRAY_ROUNDS):  # a stray's children become strays as it dies: again
            strays = self._strays()
            if not strays:
                return
            for pid, started in [(pid, _start_time(pid)) for stray in strays
                                 for pid in [stray, *descendant_pids(stray)]]:
                if started is not None and _start_time(pid) == started and not _is_zombie(pid):
                    with contextlib.suppress(ProcessLookupError):  # the start time: never a reused pid
                        os.kill(pid, signal.SIGKILL)
                        log.warning("ended a process left by the plugin", extra={"pid": pid})
            for pid in strays:  # ours, and SIGKILLed (or already dead): the wait is short
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        log.warning("processes left by the plugin keep starting others; giving up for now",
                    extra={"strays": len(self._strays())})

    def watch_descendants(self) -> None:
        """Reap the strays that exited on their own since the last look (a process that
        detached from its worker is the supervisor's child: it must not stay a zombie until a
        worker ends). Reads only the supervisor's own /proc children lists, every _WATCH_S:
        no scan of the workers' trees."""
        self.reap_orphans()

    def reap_orphans(self) -> None:
        """Reap the strays that are zombies. Only those: workers are multiprocess's to wait
        for (it would lose their exit status if we did)."""
        for pid in self._strays():
            if _is_zombie(pid):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def reclaim_dead_runs(self) -> None:
        """Unlink the segments of supervisors that died in this directory (a SIGKILLed daemon of
        the same group on this host, and no replacement started there to reclaim them at its
        start): they would hold memory until the next start."""
        reclaim_stale(self._segments.dir)

    def kill_strays(self) -> None:
        """At exit: nothing a plugin started survives the supervisor (invariant 7)."""
        self.end_strays()

    def kill(self, h: WorkerHandle, sig: int = signal.SIGKILL) -> None:
        if h.alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(h.process.pid, sig)

    def stop_all(self, timeout_s: float) -> None:
        """SIGTERM every worker, wait up to timeout (reading and dropping what the result pipes
        bring meanwhile, so that no worker blocks writing a result nobody reads), then SIGKILL
        and join (no zombies)."""
        for h in self.handles:
            self.kill(h, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while any(h.alive for h in self.handles) and time.monotonic() < deadline:
            for h in self.handles:
                if h.results is not None:
                    h.results.read()
            multiprocess.connection.wait(self.sentinels() + self.result_fds(),
                                         min(0.1, max(0.0, deadline - time.monotonic())))
        for h in self.handles:
            if h.alive:
                log.warning("worker did not stop in time; killing it", extra={"pid": h.pid})
                self.kill(h)
                h.process.join(5)
            if h.process is not None:
                self.forget(h)

    def segment_paths(self) -> list[Path]:
        """Every segment of the run: the rings, and what run_daemon made in the same set."""
        return self._segments.paths()

    def close(self) -> None:
        for h in self.handles:
            if h.pidfd is not None:
                os.close(h.pidfd)
                h.pidfd = None
            h.ring.release()
            h.board.release()
            h.lock.close()


_STRAY_ROUNDS = 10


def _pidfd_open(pid: int) -> int | None:
    """A descriptor that reads as ready once ``pid`` has exited (Linux 5.3), even unreaped."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def child_pids(pid: int) -> list[int]:
    """The children of ``pid``, from /proc/<pid>/task/<tid>/children (the kernel keeps them
    per thread: an orphan goes to one thread of its subreaper), instead of psutil's
    children(), which reads every process in /proc to find the parents (8 % of a 15-worker
    supervisor's samples on a 16-core host when it ran for each worker's tree). Falls back to
    psutil where that file does not exist (kernels without CONFIG_PROC_CHILDREN)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended
            with contextlib.suppress(psutil.Error, OSError):
                return [c.pid for c in psutil.Process(pid).children()]
            return []
        except OSError:
            continue
    return out


def descendant_pids(pid: int) -> list[int]:
    """Every process below pid (children first)."""
    out: list[int] = []
    todo = [pid]
    while todo:
        kids = child_pids(todo.pop())
        out += kids
        todo += kids
    return out


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (which may hold spaces): [state, ppid, ...]."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()
    except OSError:
        return None


def _start_time(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _is_zombie(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] == "Z"


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
    ``teardown()`` (runtime.worker.process.probe_main), and judge it as the workforce judges a
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
