"""A worker's ties to the processes around it: it dies with its supervisor, and what its
plugin forks dies with it.

A worker dies with its supervisor, however the supervisor dies: ``PR_SET_PDEATHSIG``
(``die_with_parent``) and the guard thread (``start_guard``), which also beats the board's
heartbeat. The processes its plugin starts are below it: while the supervisor lives they are
its own (a child subreaper: runtime.supervisor.workers.pool ends them when their worker ends,
however they detached). After a SIGKILL of the supervisor nothing of it runs, so
this module asks the kernel in advance: a process the worker forks (``os.fork()``,
multiprocessing's ``fork``) from its main thread gets SIGKILL when the worker exits. What it
does not cover, on Linux, after a SIGKILL of the supervisor (docs/operations.md, "Processes a
plugin starts"): programs started through ``subprocess`` (CPython forks them in C, without
the fork hooks), and what a forked child forks in turn (a double fork, a daemon). A service
manager's cgroup or a container's pid namespace ends those.

Only forks from the main thread: the kernel sends the signal when the *thread* that forked
exits, so a child forked from a plugin's short-lived thread would be killed with that thread.

Runs in: a worker, as it starts (runtime/worker/process.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import threading
import time

from runtime.transport.board import Board
from runtime.transport.ring import Doorbell

_PR_SET_PDEATHSIG = 1
_GUARD_INTERVAL_S = 0.5  # heartbeat period, and how soon a worker notices its supervisor died
_forking_from_main = [False]  # set in the parent just before a fork, read in the child


def _before_fork() -> None:
    _forking_from_main[0] = threading.current_thread() is threading.main_thread()


def _in_child(worker_pid: int) -> None:
    """RACE: the worker may die between the fork and the prctl, when nothing was asked yet;
    the parent pid, looked at after the prctl, tells."""
    if not _forking_from_main[0] or os.getppid() != worker_pid:
        return  # a grandchild, or a fork from another thread: not ours to bind
    die_with_parent()
    if os.getppid() != worker_pid:
        os._exit(1)


def bind_forks_to_worker() -> None:
    """From now on, a child this process forks from its main thread dies when it exits."""
    worker_pid = os.getpid()
    os.register_at_fork(before=_before_fork, after_in_child=lambda: _in_child(worker_pid))


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL us when our parent dies (no orphans, invariant 7). With
    spawn the parent is the supervisor; with forkserver it is the fork server, which does
    not die with the supervisor (its children keep its "alive" pipe open), so the guard
    thread below watches the supervisor itself."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start_guard(parent_pid: int, board: Board, bell: Doorbell) -> None:
    """A daemon thread that beats the board's heartbeat every half second and kills this
    process as soon as the supervisor is gone, even while the plugin is busy in a long call.
    The heartbeat says the process is scheduled and can take the GIL; it stops for a
    SIGSTOPped process or a plugin that holds the GIL in C code."""
    try:
        pidfd: int | None = os.pidfd_open(parent_pid)
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
