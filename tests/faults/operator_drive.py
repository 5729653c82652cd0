"""Running one row of the control-plane matrix (operator_matrix.py) against the real broker,
real `ringmaster run` members and the real operator commands, and recording what happened
(an Observation) for test_operator_matrix.py to judge.

Drivers:

* ``members``: hostile records in the control topic before the members start, members
  joining, more records while they run, the row's operator commands; then records
  produced, the row's effect awaited (paused: every partition held, then `resume`), every
  offset committed; then `pause` and `resume` once more with more records; then SIGTERM.
* ``unreachable_daemon``: a daemon started where nothing listens yet; a broker started
  there later; the daemon must go on by itself.
* ``unreachable_batch`` / ``unreachable_command``: `run --until-caught-up`, `pause`,
  `resume` against an address where nothing listens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from helpers import (
    PLUGINS,
    ROOT,
    TEST_BROKER,
    Ringmaster,
    base_config,
    committed,
    make_topics,
    new_broker,
    produce,
    read_all,
    to_toml,
    unique,
    wait_for,
)

from runtime.dev.tansu import free_port
from runtime.kafka.admin import create_topic

from .operator_matrix import Command, OperatorFault, Record

PARTITIONS = 4
FIRST, MORE = 200, 40  # records produced for the row, then for the pause/resume check after it
CONNECT_TIMEOUT_S = 3.0  # kafka.connect_timeout_s of the rows where nothing listens


@dataclass
class Ran:
    """One operator command."""

    command: Command
    exit: int
    out: str
    seconds: float
    stored: int  # records it added to the control topic (-1: not counted)


@dataclass
class Observation:
    fault: OperatorFault
    produced: dict[int, int] = field(default_factory=dict)  # records per partition
    committed: dict[int, int] = field(default_factory=dict)
    outputs: Counter[str] = field(default_factory=Counter)  # output id -> times
    exits: list[int | None] = field(default_factory=list)  # each member's exit status
    alive_before_stop: list[bool] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    status_bytes: list[int] = field(default_factory=list)
    commands: list[Ran] = field(default_factory=list)
    shm_left: list[str] = field(default_factory=list)  # segments of members that exited by themselves
    extra: dict[str, Any] = field(default_factory=dict)


class Group:
    """The row's topics, members and commands."""

    def __init__(self, fault: OperatorFault, bootstrap: str, tmp: Path) -> None:
        self.fault = fault
        self.bootstrap = bootstrap
        self.tmp = tmp
        self.names = {k: unique(k) for k in ("in", "out", "dlq", "group")}
        self.control = f"_ringmaster.control.{self.names['group']}"
        self.members: list[Ringmaster] = []
        self.cfg = base_config(bootstrap, self.names["in"], self.names["group"], tmp, fault.protocol,
                               processes=1)
        self.cfg["output"] = {"topic": self.names["out"]}
        self.cfg["dead_letter"] = {"topic": self.names["dlq"]}
        self.cfg["kafka"]["connect_timeout_s"] = CONNECT_TIMEOUT_S
        self.produced: dict[int, int] = {}
        self.sequence = 0

    # ------------------------------------------------------------------ the cluster side
    def create_topics(self) -> None:
        make_topics(self.bootstrap, PARTITIONS, self.names["in"], self.names["out"], self.names["dlq"])
        create_topic({"bootstrap.servers": self.bootstrap}, self.control, 1, 1,
                     {"cleanup.policy": self.fault.control_policy})

    def write_control(self, records: tuple[Record, ...]) -> None:
        if not records:
            return
        p = Producer({"bootstrap.servers": self.bootstrap, "message.max.bytes": 4_000_000, "linger.ms": 20})
        for key, value in records:
            key = key.replace(b"{in}", self.names["in"].encode()) if key is not None else None
            while True:
                try:
                    p.produce(self.control, value, key)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(30) == 0

    def control_records(self) -> int:
        return len(read_all(self.bootstrap, self.control))

    def produce(self, n: int) -> None:
        ids = [f"r{i}" for i in range(self.sequence, self.sequence + n)]
        self.sequence += n
        for part, count in produce(self.bootstrap, self.names["in"], ids, PARTITIONS).items():
            self.produced[part] = self.produced.get(part, 0) + count

    def all_committed(self, timeout_s: float = 90) -> None:
        wait_for(lambda: committed(self.bootstrap, self.names["group"], self.names["in"], PARTITIONS)
                 == self.produced, timeout_s, "every offset committed", interval_s=0.3)

    # ------------------------------------------------------------------ members
    def start(self, n: int) -> None:
        for i in range(n):
            self.members.append(Ringmaster(self.cfg, self.tmp, f"m{i}"))
        if n:
            self.wait_assigned()

    def wait_assigned(self) -> None:
        def owned() -> bool:
            parts = [m.status() for m in self.members]
            if any(s is None or not s["partitions"] for s in parts):
                return False
            return sorted(p["tp"] for s in parts for p in s["partitions"]) == \
                sorted(f"{self.names['in']}[{i}]" for i in range(PARTITIONS))
        for m in self.members:
            m.wait_status(lambda s: True, 60, "a first status")
        wait_for(owned, 90, "every member to own partitions, all of them owned once")

    def wait_held(self, held: bool) -> None:
        for m in self.members:
            m.wait_status(lambda s: bool(s["partitions"]) and all(
                ("operator" in p["pause_reasons"]) == held for p in s["partitions"]), 30,
                "every partition held" if held else "no partition held")

    def wait_logged(self, text: str, times: int) -> None:
        for m in self.members:
            wait_for(lambda m=m: m.log_path.read_text(errors="replace").count(text) >= times, 30,
                     f"{m.log_path.name} to say {text!r} {times} time(s)")

    # ------------------------------------------------------------------ operator commands
    def config_for_commands(self) -> Path:
        cfg = json.loads(json.dumps(self.cfg))
        if self.members:
            cfg["supervisor"]["status_file"] = str(self.members[0].status_path)
        if self.fault.plugin:
            cfg["workers"]["plugin"] = self.fault.plugin
        path = self.tmp / "operator.toml"
        path.write_text(to_toml(cfg))
        return path

    def run(self, command: Command, count_stored: bool = True) -> Ran:
        args = [a.replace("{in}", self.names["in"]) for a in command.args]
        before = self.control_records() if count_stored else -1
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]), COLUMNS="200")
        cmd = [sys.executable, "-m", "runtime.cli", *args, "-c", str(self.config_for_commands())]
        started = time.monotonic()
        if args[0] == "top":
            out, code = _top(cmd, env)
        else:
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
            out, code = r.stdout + r.stderr, r.returncode
        seconds = time.monotonic() - started
        stored = self.control_records() - before if count_stored else -1
        return Ran(command, code, out, seconds, stored)

    def stop(self, obs: Observation) -> None:
        obs.alive_before_stop = [m.proc.poll() is None for m in self.members]
        obs.exits = [m.terminate(60) if m.proc.poll() is None else m.proc.returncode for m in self.members]

    def close(self, obs: Observation) -> None:
        for m in self.members:
            exited = m.proc.poll() is not None
            m.close()
            left = m.reclaim()  # a member close() killed (after a failure) could not unlink its own
            if exited:
                obs.shm_left += left  # one that exited by itself must have (invariant 7)
        obs.logs = [m.log_path.read_text(errors="replace") for m in self.members]
        obs.status_bytes = [m.status_path.stat().st_size if m.status_path.exists() else 0
                            for m in self.members]
        obs.produced = dict(self.produced)
        if self.produced:
            obs.committed = committed(self.bootstrap, self.names["group"], self.names["in"], PARTITIONS)
            outputs = read_all(self.bootstrap, self.names["out"])
            obs.outputs = Counter(json.loads(m.value())["id"] for m in outputs)


def _top(cmd: list[str], env: dict[str, str]) -> tuple[str, int]:
    """`ringmaster top` until its first screen is drawn, then Ctrl-C (SIGINT)."""
    out_path = Path(env.get("TMPDIR", "/tmp")) / f"top-{unique('out')}.txt"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**env, "FORCE_COLOR": "1"},
                                cwd=ROOT)
        try:
            def drawn() -> bool:
                return "ringmaster —" in out_path.read_text(errors="replace") or proc.poll() is not None
            wait_for(drawn, 30, "top to draw its first screen")
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            code = proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    text = out_path.read_text(errors="replace")
    out_path.unlink()
    return text, code


# ---------------------------------------------------------------------------- drivers
def members(fault: OperatorFault, bootstrap: str, tmp: Path) -> Observation:
    obs = Observation(fault)
    g = Group(fault, bootstrap, tmp)
    try:
        g.create_topics()
        g.write_control(fault.before)
        g.start(fault.members)
        if fault.effect in ("pauses", "resumes") and fault.before:
            g.wait_held(True)
        g.write_control(fault.during)
        for text, times in fault.logged:
            g.wait_logged(text, times)
        for command in fault.commands:
            obs.commands.append(g.run(command))
        g.produce(FIRST)
        if fault.effect == "pauses":
            g.wait_held(True)
            obs.extra["status_bytes_while_paused"] = [m.status_path.stat().st_size for m in g.members]
            obs.extra["committed_while_paused"] = committed(bootstrap, g.names["group"], g.names["in"],
                                                            PARTITIONS)
            obs.commands.append(g.run(Command(("resume",), says=("resumed",))))
        g.all_committed()
        # `pause` then `resume` work afterwards, and lose nothing.
        obs.commands.append(g.run(Command(("pause", "--reason", "after the row"), says=("paused",))))
        g.wait_held(True)
        g.produce(MORE)
        obs.commands.append(g.run(Command(("resume",), says=("resumed every topic of the group",))))
        g.all_committed()
        g.stop(obs)
    finally:
        g.close(obs)
    return obs


def unreachable_daemon(fault: OperatorFault, bootstrap: str, tmp: Path) -> Observation:
    """A daemon started where nothing listens waits; once a broker listens there, it goes on."""
    obs = Observation(fault)
    port = free_port()
    g = Group(fault, f"127.0.0.1:{port}", tmp)
    broker = None
    try:
        g.members.append(Ringmaster(g.cfg, tmp, "m0"))
        m = g.members[0]
        wait_for(lambda: "cannot reach the Kafka cluster" in m.log_path.read_text(errors="replace"), 30,
                 "the daemon to say it waits for the cluster")
        waited_from = time.monotonic()
        log_at = len(m.log_path.read_text(errors="replace").splitlines())
        # While it waits: a few seconds of log, which must stay quiet.
        wait_for(lambda: time.monotonic() - waited_from > 5 or m.proc.poll() is not None, 10,
                 "5 s of waiting")
        obs.extra["waiting_lines"] = m.log_path.read_text(errors="replace").splitlines()[log_at:]
        obs.extra["alive_while_waiting"] = m.proc.poll() is None
        broker = new_broker(port, log_path=tmp / f"{TEST_BROKER}.log").start()
        g.create_topics()
        g.produce(FIRST)
        g.wait_assigned()
        g.all_committed()
        obs.commands.append(g.run(Command(("pause",), says=("paused",))))
        g.wait_held(True)
        g.produce(MORE)
        obs.commands.append(g.run(Command(("resume",), says=("resumed",))))
        g.all_committed()
        g.stop(obs)
    finally:
        try:
            g.close(obs)
        finally:
            if broker is not None:
                broker.stop()
    return obs


def _nowhere(fault: OperatorFault, tmp: Path) -> Group:
    return Group(fault, f"127.0.0.1:{free_port()}", tmp)


def unreachable_batch(fault: OperatorFault, bootstrap: str, tmp: Path) -> Observation:
    obs = Observation(fault)
    g = _nowhere(fault, tmp)
    rm = Ringmaster(g.cfg, tmp, "batch", args=["--until-caught-up"])
    started = time.monotonic()
    try:
        obs.exits = [rm.wait(60)]
    finally:
        rm.close()
    obs.extra["seconds"] = time.monotonic() - started
    obs.logs = [rm.log_path.read_text(errors="replace")]
    return obs


def unreachable_command(fault: OperatorFault, bootstrap: str, tmp: Path) -> Observation:
    obs = Observation(fault)
    g = _nowhere(fault, tmp)
    obs.commands = [g.run(c, count_stored=False) for c in fault.commands]
    return obs


DRIVERS: dict[str, Callable[[OperatorFault, str, Path], Observation]] = {
    "members": members, "unreachable_daemon": unreachable_daemon, "unreachable_batch": unreachable_batch,
    "unreachable_command": unreachable_command,
}


def run(fault: OperatorFault, bootstrap: str, tmp: Path) -> Observation:
    return DRIVERS[fault.driver](fault, bootstrap, tmp)
