"""Processes a plugin starts end with their worker, however they detach (issue 29.8), and
what is covered when the supervisor itself is SIGKILLed (docs/operations.md, "Processes a
plugin starts"). Real daemons, real workers, real forks: the probe plugin's ``forkdaemon``
(a child of the worker), ``forksetsid`` (a daemon's double fork: a grandchild in a session of
its own whose parent is gone) and ``popen`` (``sleep`` started with subprocess)."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import Ringmaster, daemon_config, make_topics, produce, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STARTS = ["forkdaemon:a", "forksetsid:b", "popen:c"]


def alive(pid: int) -> bool:
    """Running (a zombie has ended: it only waits for whoever is its parent now to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def started_by_plugin(pid_dir: Path, n: int) -> dict[str, int]:
    """{command: pid} of the processes the plugin recorded (probe.py names the files), once all
    n are there."""
    def read() -> dict[str, int] | None:
        found = {}
        for p in pid_dir.glob("*.pid"):
            text = p.read_text()
            if text:
                cmd = p.stem.rpartition("-")[0] or "forkdaemon"
                found[cmd] = int(text)
        return found if len(found) >= n else None
    got: dict[str, int] = wait_for(read, 60, f"{n} processes started by the plugin")
    return got


def kill_all(pids: Any) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start(broker: Any, names: dict[str, str], tmp: Path, **workers: Any) -> tuple[Ringmaster, Path]:
    pid_dir = tmp / "pids"
    pid_dir.mkdir()
    make_topics(broker.bootstrap, 1, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp, settings={"pid_dir": str(pid_dir)}, processes=1, **workers)
    rm = Ringmaster(cfg, tmp)
    rm.wait_status(lambda s: s["workers"] and all(w["alive"] for w in s["workers"]), 60, "the worker")
    produce(broker.bootstrap, names["in"], STARTS, 1)
    return rm, pid_dir


def test_what_a_plugin_starts_ends_when_its_worker_dies_however_it_detached(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    rm, pid_dir = start(broker, names, tmp_path)
    pids: dict[str, int] = {}
    try:
        pids = started_by_plugin(pid_dir, len(STARTS))
        worker = rm.worker_pids()[0]
        assert all(alive(p) for p in pids.values()), "they run while their worker runs"
        os.kill(worker, signal.SIGKILL)  # as the OOM killer would
        wait_for(lambda: not any(alive(p) for p in pids.values()), 30,
                 "the plugin's processes to end with their worker")
        assert rm.proc.poll() is None, "the daemon goes on"
        rm.wait_status(lambda s: any(w["alive"] and w["pid"] != worker for w in s["workers"]), 60,
                       "a new worker")
        assert rm.terminate() == 0
        assert "ended a process left by the plugin" in rm.log_tail(400)
    finally:
        kill_all(pids.values())
        rm.close()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_a_sigkilled_supervisor_takes_its_workers_and_what_they_forked(
        broker: Any, names: dict[str, str], tmp_path: Path, start_method: str) -> None:
    """Nothing of the supervisor runs after a SIGKILL: its workers die by PR_SET_PDEATHSIG,
    and what their plugin forked from the worker by the same, asked at the fork. Programs
    started with subprocess and double-forked daemons are not covered there (the cgroup of a
    service manager or a container's pid namespace is: docs/operations.md)."""
    rm, pid_dir = start(broker, names, tmp_path, start_method=start_method)
    pids: dict[str, int] = {}
    try:
        pids = started_by_plugin(pid_dir, len(STARTS))
        forked = pids["forkdaemon"]
        worker = rm.worker_pids()[0]
        rm.kill()
        wait_for(lambda: not alive(worker) and not alive(forked), 30,
                 "the worker and the child it forked to die with the supervisor")
    finally:
        kill_all(pids.values())  # the uncovered ones, and any left by a failure
        rm.close()
        rm.reclaim()
