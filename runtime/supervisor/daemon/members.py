"""``ringmaster run --members N`` (``supervisor.members``): N supervisors of one group on one
host from one config, past the per-record ceiling of a single supervisor with light work.
Starts processes: the N member daemons.

The parent started by ``ringmaster run`` does no Kafka work. It checks the config and the
plugin once, checks that ``supervisor.shm_dir`` holds every member's rings together, then starts
N member processes, each a whole daemon (``ringmaster run`` again, told its index in
``RINGMASTER_MEMBER``): its own group consumer, shared-memory segments (named by its own pid,
runtime/transport/shm.py), control socket and workers. Member 0 takes the config's control
socket, admin endpoint and status file; the others a pid-named control socket only
(runtime/ops/control_socket.py), so ``ringmaster status``, ``reload`` and ``scale`` reach
every member.

One worker budget: ``workers.processes`` and ``workers.max_processes`` are totals, split as
evenly as they go, the first members taking the remainder (7 over 2: 4 and 3); each member
needs at least one worker, so ``processes`` must be at least N.

Signals (gunicorn's arbiter forwards them the same way): TERM, INT, QUIT stop every member
(TERM to each); HUP and USR1 go to every member; TTIN and TTOU move the budget by one
worker, on one member at a time, round-robin, so the members stay within one worker of each
other; USR2 and WINCH are ignored.

No member is restarted (the service manager restarts the whole, as for one daemon). A member
that exits on its own ends the run: the others are stopped, and the parent exits with the
first non-zero status a member had (a member killed by a signal counts as 128 + the signal),
else 0. With ``--until-caught-up`` a member that exits 0 has caught up and the others go on:
the parent exits 0 only when every member did. When every member is gone, the parent
removes what a killed member left: its shared-memory segments and its control socket.

Runs in: the parent of the members (``ringmaster run``'s process).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from runtime.config import Settings, members_problem
from runtime.errors import ConfigError, SharedMemoryError
from runtime.ops.control_socket import clear_stale, control_socket_path
from runtime.supervisor.control.signals import SignalQueue
from runtime.supervisor.daemon.run import shm_needed
from runtime.transport.shm import free_bytes, reclaim_stale

log = logging.getLogger("ringmaster.members")

MEMBER_ENV = "RINGMASTER_MEMBER"  # set in a member's environment: its index; it starts no members
PARENT_ENV = "RINGMASTER_MEMBER_PARENT"  # the parent's pid, to tell whether it is still there
_POLL_S = 0.1  # the parent's only work is to notice a member's exit and forward signals


def split(total: int, n: int) -> list[int]:
    """``total`` over ``n`` as evenly as it goes, the first ones taking the remainder."""
    return [total // n + (1 if i < total % n else 0) for i in range(n)]


@dataclass(frozen=True)
class Budget:
    """Each member's workers.processes and workers.max_processes (0: its processes)."""

    processes: list[int]
    max_processes: list[int]


def budget(settings: Settings, n: int) -> Budget:
    """The worker budget split over ``n`` members, or a ConfigError naming the keys. A member
    never gets a max below its processes: splitting a larger total never gives less."""
    w = settings.workers
    problem = members_problem(n, w.processes)
    if problem is not None:
        raise ConfigError(problem)
    return Budget(split(w.processes, n), split(w.max_processes, n) if w.max_processes else [0] * n)


def shm_problem(settings: Settings, shares: list[int]) -> str | None:
    """One line when ``supervisor.shm_dir`` cannot hold every member's rings together (each
    member checks only its own share at its start, and they start at once)."""
    shm_dir = settings.supervisor.shm_dir
    need = sum(shm_needed(settings, p + 1) for p in shares)
    try:
        free = free_bytes(shm_dir)
    except OSError as exc:
        return f"supervisor.shm_dir {shm_dir!r} cannot be read: {exc.strerror}"
    if free >= need:
        return None
    return (f"supervisor.shm_dir {shm_dir!r} has {free / 2**20:.0f} MiB free but {len(shares)} members' "
            f"rings need {need / 2**20:.0f} MiB together: give it more, or lower workers.processes, "
            "workers.ring_bytes or --members")


def exit_status(returncode: int) -> int:
    """A member's exit status as the parent reports it: killed by a signal is 128 + signal."""
    return 128 - returncode if returncode < 0 else returncode


def die_with_parent() -> bool:
    """In a member, first thing: a SIGTERM (a graceful stop) when the parent dies (SIGKILL,
    OOM), so no member runs on without the process that forwards signals and judges the run
    (Linux's PR_SET_PDEATHSIG; elsewhere nothing). Done here rather than between fork and exec:
    the parent may have librdkafka threads (the config check's clients), and a fork with
    threads may only exec. False: the parent is already gone (the member should not start)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    parent = os.environ.get(PARENT_ENV, "")
    return not parent.isdigit() or os.getppid() == int(parent)


class Members:
    """The running members and what the parent decided about them."""

    def __init__(self, settings: Settings, config: str, n: int, until_caught_up: bool,
                 summary: bool, summary_json: str | None) -> None:
        self.settings = settings
        self.n = n
        self.until_caught_up = until_caught_up
        self.budget = budget(settings, n)
        self.ttin_next = 0  # budget moves so far (TTIN +1, TTOU -1): who gets the next one
        self.stopping = False
        self.first_failure: int | None = None
        self.summary_dir = Path(tempfile.mkdtemp(prefix="ringmaster-members-")) if summary_json else None
        self.summary_json = summary_json
        self.args = [sys.executable, "-m", "runtime.cli", "run", "-c", config, "--no-progress"]
        if until_caught_up:
            self.args.append("--until-caught-up")
        if summary:
            self.args.append("--summary")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.codes: dict[int, int] = {}

    def start(self) -> None:
        for i in range(self.n):
            env = {**os.environ, MEMBER_ENV: str(i), PARENT_ENV: str(os.getpid()),
                   "RINGMASTER__SUPERVISOR__MEMBERS": "1",
                   "RINGMASTER__WORKERS__PROCESSES": str(self.budget.processes[i]),
                   "RINGMASTER__WORKERS__MAX_PROCESSES": str(self.budget.max_processes[i])}
            args = list(self.args)
            if self.summary_dir is not None:
                args += ["--summary-json", str(self.summary_dir / f"{i}.json")]
            self.procs.append(subprocess.Popen(args, env=env))
        log.info("members started", extra={
            "members": self.n, "pids": ",".join(str(p.pid) for p in self.procs),
            "workers": ",".join(map(str, self.budget.processes))})

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if i not in self.codes]

    def send(self, sig: int, to: list[int] | None = None) -> None:
        for i in self.running() if to is None else to:
            with contextlib.suppress(ProcessLookupError):
                self.procs[i].send_signal(sig)

    def stop_all(self, why: str) -> None:
        if not self.stopping:
            self.stopping = True
            log.info("stopping every member", extra={"why": why})
            self.send(signal.SIGTERM)

    def on_signal(self, sig: signal.Signals) -> None:
        if sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            self.stop_all(sig.name)
        elif sig in (signal.SIGHUP, signal.SIGUSR1):
            self.send(sig)
        elif sig in (signal.SIGTTIN, signal.SIGTTOU):
            # Round-robin from the members the split left with one worker fewer, so that a
            # TTIN then a TTOU land on the same member and the members stay within one.
            base = self.settings.workers.processes % self.n
            if sig == signal.SIGTTOU:
                self.ttin_next -= 1
            target = (base + self.ttin_next) % self.n
            if sig == signal.SIGTTIN:
                self.ttin_next += 1
            if target in self.running():
                self.send(sig, [target])
        else:
            log.info("signal ignored", extra={"signal": sig.name})

    def on_exit(self, i: int, returncode: int) -> None:
        code = exit_status(returncode)
        self.codes[i] = code
        log.info("member exited", extra={"member": i, "pid": self.procs[i].pid, "status": code})
        if code != 0 and self.first_failure is None:
            self.first_failure = code
        if code != 0:
            self.stop_all(f"member {i} exited with status {code}")
        elif not self.stopping and not self.until_caught_up:
            self.stop_all(f"member {i} stopped")

    def wait(self, signals: SignalQueue) -> int:
        while self.running():
            for sig in signals.drain():
                self.on_signal(sig)
            for i in self.running():
                rc = self.procs[i].poll()
                if rc is not None:
                    self.on_exit(i, rc)
            if self.running():
                time.sleep(_POLL_S)
        self.clean_up()
        return self.first_failure or 0

    def clean_up(self) -> None:
        """What a killed member left: segments (named by its dead pid) and its socket."""
        reclaim_stale(self.settings.supervisor.shm_dir)
        base = control_socket_path(self.settings)
        if base is not None:
            clear_stale(base)
        if self.summary_dir is not None and self.summary_json is not None:
            docs = []
            for i in range(self.n):
                path = self.summary_dir / f"{i}.json"
                docs.append(json.loads(path.read_text()) if path.exists() else None)
                path.unlink(missing_ok=True)
            self.summary_dir.rmdir()
            Path(self.summary_json).write_text(json.dumps({"members": docs}, indent=2))


def run_members(settings: Settings, config: str, n: int, until_caught_up: bool, summary: bool,
                summary_json: str | None, signals: SignalQueue) -> int:
    """Start ``n`` members and wait for them; the exit status the parent reports. A config the
    split refuses is a ConfigError and too little shared memory a SharedMemoryError, before
    any member starts."""
    members = Members(settings, config, n, until_caught_up, summary, summary_json)
    problem = shm_problem(settings, members.budget.processes)
    if problem is not None:
        raise SharedMemoryError(problem)
    # A stop asked for before the members exist stops the run before it starts.
    early = signals.drain()
    if any(s in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT) for s in early):
        return 0
    members.start()
    return members.wait(signals)
