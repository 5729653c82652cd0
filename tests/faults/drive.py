"""Running one row of the fault matrix against the real broker and the real daemon, and
recording what happened (an Observation) for test_fault_matrix.py to judge.

Drivers:

* ``batch``: produce the row's records, `ringmaster run --until-caught-up`, read back.
* ``output_outage`` / ``output_outage_reset`` / ``dead_letter_outage``: a broker of its own
  behind a proxy that swallows (or resets on) Produce requests for a while, then lets them
  through; the daemon runs meanwhile and is stopped with SIGTERM at the end.
* ``supervisor_sigkill``, ``status_dir_removed``, ``idle_cpu``: deployment scenarios.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from helpers import (
    FAST_GROUP,
    Ringmaster,
    base_config,
    committed,
    make_topics,
    produce_rows,
    read_all,
    shm_segments,
    unique,
    wait_for,
)
from proxy import PRODUCE, Proxy

from runtime.devbroker import DevBroker, free_port

from .matrix import Fault

TEST_PRODUCER = {"message.max.bytes": 4_000_000}


@dataclass
class Observation:
    fault: Fault
    values: list[bytes | None]
    counts: dict[int, int]
    exit: int | None = None
    committed: dict[int, int] = field(default_factory=dict)
    outputs: list[Any] = field(default_factory=list)
    dead: list[Any] = field(default_factory=list)
    log: str = ""
    status: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)
    bootstrap: str = ""

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(m.value().split(b" ", 1)[0] if m.value().endswith(b" ") else m.value())
                for m in self.outputs]


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _rows(fault: Fault) -> list[tuple[bytes | None, bytes | None, Any]]:
    if fault.rows is not None:
        return fault.rows(fault.n)
    return [(str(i).encode(), fault.values.get(i, f"r{i}").encode(), None) for i in range(fault.n)]


def _config(fault: Fault, bootstrap: str, names: dict[str, str], tmp: Path,
            dirs: dict[str, Path]) -> dict[str, Any]:
    workers = {"processes": 1, **fault.workers}
    cfg = base_config(bootstrap, names["in"], names["group"], tmp, **workers)
    settings = {k: (str(dirs["journal"]) if v == "JOURNAL" else v) for k, v in fault.settings.items()}
    settings.update({"state_dir": str(dirs["state"]), "pid_dir": str(dirs["pids"])})
    cfg["workers"]["settings"] = settings
    cfg["output"] = {"topic": names["out"]} if fault.output else {}
    cfg["dead_letter"] = {"retry_backoff_s": 0.01, "max_attempts": 2}
    if fault.dead_letter:
        cfg["dead_letter"]["topic"] = names["dlq"]
    _merge(cfg, json.loads(json.dumps(fault.sections)))
    return cfg


def prepare(fault: Fault, bootstrap: str, tmp: Path) -> tuple[Observation, dict[str, Any]]:
    names = {k: unique(k) for k in ("in", "out", "dlq", "group", "routed")}
    dirs = {k: tmp / k for k in ("journal", "state", "pids")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    make_topics(bootstrap, fault.partitions, names["in"], names["out"], names["dlq"], names["routed"])
    rows = _rows(fault)
    rows = [(k, (v.replace(b"ROUTED", names["routed"].encode()) if v else v), h) for k, v, h in rows]
    counts = produce_rows(bootstrap, names["in"], rows, fault.partitions, TEST_PRODUCER)
    obs = Observation(fault, [v for _, v, _ in rows], counts, names=names, dirs=dirs, bootstrap=bootstrap)
    return obs, _config(fault, bootstrap, names, tmp, dirs)


def read_back(obs: Observation, rm: Ringmaster | None) -> Observation:
    n = obs.names
    obs.committed = committed(obs.bootstrap, n["group"], n["in"], len(obs.counts))
    obs.outputs = read_all(obs.bootstrap, n["out"])
    obs.dead = read_all(obs.bootstrap, n["dlq"])
    obs.extra["routed"] = read_all(obs.bootstrap, n["routed"])
    if rm is not None:
        obs.log = rm.log_path.read_text(errors="replace")
        obs.status = rm.status()
    return obs


# ---------------------------------------------------------------------------- drivers
def batch(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"])
    try:
        obs.exit = rm.wait(fault.timeout_s)
    finally:
        rm.close()
    return read_back(obs, rm)


def _outage(fault: Fault, tmp: Path, how: str, poison: dict[int, str]) -> Observation:
    front, back = free_port(), free_port()
    proxy = Proxy(front, back).start()
    broker = DevBroker(back, log_path=tmp / "tansu.log", advertised_port=front).start()
    try:
        f = Fault(fault.id, fault.group, fault.when, fault.then, values=poison, n=40, partitions=2,
                  workers={"processes": 2})
        obs, cfg = prepare(f, broker.bootstrap, tmp)
        obs.fault = fault
        _merge(cfg, {"output": {"delivery_timeout_s": 2.0, "retry_backoff_s": 0.5,
                                "retry_backoff_max_s": 2.0},
                     "kafka": {"producer": {"request.timeout.ms": 1000}}})
        def group_offsets() -> dict[int, int]:
            return committed(broker.bootstrap, obs.names["group"], obs.names["in"], 2)

        proxy.block(PRODUCE, how)
        rm = Ringmaster(cfg, tmp, "rm")
        try:
            during = rm.wait_status(lambda s: s["deferred"] >= 2 and any(
                "delivery" in p["pause_reasons"] for p in s["partitions"]), 60, "deliveries to be deferred")
            obs.extra["during"] = during
            obs.extra["dead_during"] = read_all(broker.bootstrap, obs.names["dlq"])
            obs.extra["committed_during"] = group_offsets()
            obs.extra["swallowed"] = proxy.swallowed
            proxy.unblock(PRODUCE)
            wait_for(lambda: group_offsets() == obs.counts, 90, "every offset committed after the outage",
                     interval_s=0.3)
            obs.exit = rm.terminate(60)
        finally:
            rm.close()
        return read_back(obs, rm)
    finally:
        proxy.close()
        broker.stop()


def output_outage(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "stall", {})


def output_outage_reset(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "reset", {})


def dead_letter_outage(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "stall", {7: "raise:r7"})


def supervisor_sigkill(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    f = Fault(fault.id, fault.group, fault.when, fault.then, n=400, partitions=2,
              workers=fault.workers, settings={"sleep_ms": 20})
    obs, cfg = prepare(f, bootstrap, tmp)
    obs.fault = fault
    a = Ringmaster(cfg, tmp, "a")
    try:
        s = a.wait_status(lambda s: s["records"] > 0 and all(w["alive"] for w in s["workers"]), 60,
                          "progress")
        workers = [psutil.Process(w["pid"]) for w in s["workers"]]
        segments = [x for x in shm_segments() if x.startswith(f"ringmaster-{a.proc.pid}-")]
        a.kill()

        def gone() -> bool:
            return all(not w.is_running() or w.status() == psutil.STATUS_ZOMBIE for w in workers)
        wait_for(gone, 10, "the workers of the killed supervisor to exit")
        obs.extra["segments_left"] = segments
    finally:
        a.close()
    cfg["workers"]["settings"]["sleep_ms"] = 0
    b = Ringmaster(cfg, tmp, "b", args=["--until-caught-up"])
    try:
        obs.exit = b.wait(fault.timeout_s)
    finally:
        b.close()
    obs.extra["segments_reclaimed"] = not set(obs.extra["segments_left"]) & set(shm_segments())
    return read_back(obs, b)


def status_dir_removed(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    f = Fault(fault.id, fault.group, fault.when, fault.then, n=40)
    obs, cfg = prepare(f, bootstrap, tmp)
    obs.fault = fault
    rm = Ringmaster(cfg, tmp, "rm", status_path=tmp / "missing" / "deeper" / "status.json")
    try:
        wait_for(lambda: rm.status_path.exists(), 30, "the status file in a directory created at start")
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "the first records committed")
        shutil.rmtree(tmp / "missing")
        (tmp / "missing").write_text("a file where the status directory was")  # writes must fail now
        rows = [(b"k", f"r{i}".encode(), None) for i in range(40, 80)]
        more = produce_rows(bootstrap, obs.names["in"], rows, 1)
        obs.counts = {p: obs.counts[p] + more[p] for p in obs.counts}
        obs.values += [v for _, v, _ in rows]
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "records after the directory vanished committed")
        assert rm.proc.poll() is None, rm.log_tail()
        obs.exit = rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


def idle_cpu(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm")
    try:
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "every record committed")
        proc = psutil.Process(rm.proc.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(3)
        obs.extra["idle_cpu_share"] = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        obs.exit = rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


DRIVERS: dict[str, Callable[[Fault, str, Path], Observation]] = {
    "batch": batch, "output_outage": output_outage, "output_outage_reset": output_outage_reset,
    "dead_letter_outage": dead_letter_outage, "supervisor_sigkill": supervisor_sigkill,
    "status_dir_removed": status_dir_removed, "idle_cpu": idle_cpu,
}


def run(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    try:
        return DRIVERS[fault.driver](fault, bootstrap, tmp)
    finally:
        # Processes a plugin started must not outlive the row (they are checked separately).
        for pid_file in (tmp / "pids").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                pid = int(pid_file.read_text())
                if psutil.pid_exists(pid):
                    os.kill(pid, signal.SIGKILL)


__all__ = ["FAST_GROUP", "Observation", "run"]
