"""What a plugin forks dies with its worker.

A worker dies with its supervisor, however the supervisor dies (``PR_SET_PDEATHSIG`` and the
guard thread, main.py). The processes its plugin starts are below it: while the supervisor
lives they are its own (a child subreaper: runtime.supervisor.workers.pool ends them when their
worker ends, however they detached). After a SIGKILL of the supervisor nothing of it runs, so
this module asks the kernel in advance: a process the worker forks (``os.fork()``,
multiprocessing's ``fork``) from its main thread gets SIGKILL when the worker exits. What it
does not cover, on Linux, after a SIGKILL of the supervisor (docs/operations.md, "Processes a
plugin starts"): programs started through ``subprocess`` (CPython forks them in C, without
the fork hooks), and what a forked child forks in turn (a double fork, a daemon). A service
manager's cgroup or a container's pid namespace ends those.

Only forks from the main thread: the kernel sends the signal when the *thread* that forked
exits, so a child forked from a plugin's short-lived thread would be killed with that thread.

Runs in: a worker, first thing.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from typing import Any

from runtime.worker.main import WorkerSpec, worker_main

_PR_SET_PDEATHSIG = 1
_forking_from_main = [False]  # set in the parent just before a fork, read in the child


def _before_fork() -> None:
    _forking_from_main[0] = threading.current_thread() is threading.main_thread()


def _in_child(worker_pid: int) -> None:
    """RACE: the worker may die between the fork and the prctl, when nothing was asked yet;
    the parent pid, looked at after the prctl, tells."""
    if not _forking_from_main[0] or os.getppid() != worker_pid:
        return  # a grandchild, or a fork from another thread: not ours to bind
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != worker_pid:
        os._exit(1)


def bind_forks_to_worker() -> None:
    """From now on, a child this process forks from its main thread dies when it exits."""
    worker_pid = os.getpid()
    os.register_at_fork(before=_before_fork, after_in_child=lambda: _in_child(worker_pid))


def run_worker(spec: WorkerSpec, bell_reader: Any, writer: Any) -> None:
    """The worker process's target (runtime.supervisor.workers.pool starts it)."""
    bind_forks_to_worker()
    worker_main(spec, bell_reader, writer)
