"""Helpers for tests that drive the real broker and the real `ringmaster` CLI."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from proxy import Proxy

from runtime.dev.kafkabroker import ApacheKafkaBroker
from runtime.dev.tansu import DevBroker, free_port
from runtime.kafka.admin import ensure_topics

ROOT = Path(__file__).resolve().parent.parent
PLUGINS = ROOT / "tests" / "plugins"
# Tansu forms groups in about session.timeout.ms / 2. During a rebalance it waits for a
# member that died (SIGKILL) for that member's rebalance timeout, max.poll.interval.ms
# (default 300 s), instead of expiring it after session.timeout.ms as Apache Kafka does;
# the supervisor calls consume() every few ms, so 20 s is safe and keeps chaos runs short.
FAST_GROUP = {"session.timeout.ms": 2000, "heartbeat.interval.ms": 300, "max.poll.interval.ms": 20000}

# The broker the integration tests, the fault matrices and chaos run against:
# RINGMASTER_TEST_BROKER=tansu (the default: starts in 50 ms, memory-only) or kafka (Apache
# Kafka itself, runtime/dev/kafkabroker.py: the reference for every guarantee).
TEST_BROKER = os.environ.get("RINGMASTER_TEST_BROKER", "tansu").strip().lower()
if TEST_BROKER not in ("tansu", "kafka"):
    raise SystemExit(f"RINGMASTER_TEST_BROKER={TEST_BROKER!r}: expected tansu or kafka")
Broker = DevBroker | ApacheKafkaBroker
# Under KIP-848 the session timeout is the broker's: the same 2 s as FAST_GROUP's.
KAFKA_TEST_SERVER = {"group.consumer.session.timeout.ms": "2000",
                     "group.consumer.heartbeat.interval.ms": "300",
                     # share groups: a test may shorten a group's acquisition lock to seconds
                     "group.share.min.record.lock.duration.ms": "1000",
                     # a transaction past its transaction.timeout.ms is aborted within a second,
                     # not at the next 10 s sweep (the default): a test of it waits that less
                     "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000"}
# The group protocol of the daemons a session starts (base_config): classic (the default) or
# consumer (KIP-848, Apache Kafka only). Suites that parametrize by protocol use
# GROUP_PROTOCOLS: both on Apache Kafka, classic alone on Tansu.
TEST_GROUP_PROTOCOL = os.environ.get("RINGMASTER_TEST_GROUP_PROTOCOL", "classic").strip().lower()
if TEST_GROUP_PROTOCOL not in ("classic", "consumer"):
    raise SystemExit(f"RINGMASTER_TEST_GROUP_PROTOCOL={TEST_GROUP_PROTOCOL!r}: expected classic or consumer")
if TEST_GROUP_PROTOCOL == "consumer" and TEST_BROKER != "kafka":
    raise SystemExit("RINGMASTER_TEST_GROUP_PROTOCOL=consumer needs RINGMASTER_TEST_BROKER=kafka "
                     "(Tansu has no KIP-848)")
GROUP_PROTOCOLS = ("classic", "consumer") if TEST_BROKER == "kafka" else ("classic",)


def group_settings(protocol: str | None = None) -> dict[str, Any]:
    """The consumer settings of a test daemon's group: FAST_GROUP under the classic protocol;
    under KIP-848 the broker's timing (KAFKA_TEST_SERVER), the client keeping only its poll
    interval."""
    if (protocol or TEST_GROUP_PROTOCOL) == "consumer":
        return {"group.protocol": "consumer", "max.poll.interval.ms": FAST_GROUP["max.poll.interval.ms"]}
    return dict(FAST_GROUP)


def new_broker(port: int | None = None, log_path: Path | None = None,
               advertised_port: int | None = None) -> Broker:
    """A broker of the session's kind (not started): ``with new_broker() as b``."""
    if TEST_BROKER == "kafka":
        return ApacheKafkaBroker(port, log_path=log_path, advertised_port=advertised_port,
                                 overrides=KAFKA_TEST_SERVER)
    return DevBroker(port, log_path=log_path, advertised_port=advertised_port)


@contextlib.contextmanager
def proxied_broker(tmp: Path) -> Iterator[tuple[Broker, Proxy]]:
    """A broker of the session's kind and of its own, behind a TCP proxy that can be cut
    (tests/proxy.py): an outage without touching the session's broker. Its log goes in tmp."""
    back = free_port()
    proxy = Proxy(0, back).start()
    broker = new_broker(back, log_path=tmp / f"{TEST_BROKER}.log", advertised_port=proxy.listen_port).start()
    try:
        yield broker, proxy
    finally:
        proxy.close()
        broker.stop()


_EXACT_LATEST: dict[str, bool] = {}


def lists_latest_exactly(bootstrap: str) -> bool:
    """Whether the broker answers ListOffsets "latest" with the true end of a partition
    (Apache Kafka does; Tansu answers the base offset of the last batch + 1): probed once per
    broker with one batch of three records."""
    if bootstrap not in _EXACT_LATEST:
        from confluent_kafka.admin import AdminClient, OffsetSpec

        topic = unique("probe-latest")
        make_topics(bootstrap, 1, topic)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200})
        for i in range(3):
            p.produce(topic, f"p{i}".encode(), partition=0)
        assert p.flush(30) == 0
        tp = TopicPartition(topic, 0)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        end = admin.list_offsets({tp: OffsetSpec.latest()})[tp].result(30).offset
        _EXACT_LATEST[bootstrap] = end == 3
    return _EXACT_LATEST[bootstrap]


def is_broker_process(cmdline: str) -> bool:
    """A test broker's process (either kind), which lives as long as its fixture."""
    return "tansu" in cmdline or "kafka.Kafka" in cmdline


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def exited(p: psutil.Process | int) -> bool:
    """Gone, or a zombie (ended: it only waits to be reaped). A process can exit between
    two questions asked of it (CI saw NoSuchProcess from status() after is_running())."""
    try:
        p = p if isinstance(p, psutil.Process) else psutil.Process(p)
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll a condition (never a fixed sleep); fail with `what` when it does not happen."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def make_topics(bootstrap: str, partitions: int, *names: str) -> None:
    ensure_topics(bootstrap, names, partitions=partitions)


def produce(bootstrap: str, topic: str, values: Iterable[bytes | str], partitions: int) -> dict[int, int]:
    """Produce values round-robin over partitions; returns records per partition."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    counts: dict[int, int] = {}
    for i, v in enumerate(values):
        part = i % partitions
        data = v.encode() if isinstance(v, str) else v
        while True:
            try:
                p.produce(topic, data, key=str(i).encode(), partition=part)
                break
            except BufferError:
                p.poll(0.05)
        counts[part] = counts.get(part, 0) + 1
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(30) == 0
    return counts


def read_topic(bootstrap: str, topic: str, expect: int, timeout_s: float = 60.0,
               settle_s: float = 1.0) -> list[Any]:
    """Read a topic from the start with a throw-away group until `expect` records arrived
    (then `settle_s` more, to catch extra duplicates) or the timeout passes."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("reader"),
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, **FAST_GROUP})
    c.subscribe([topic])
    out: list[Any] = []
    deadline = time.monotonic() + timeout_s
    settle_until = None
    try:
        while time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                if m.error() is None:
                    out.append(m)
            if len(out) >= expect:
                settle_until = settle_until or time.monotonic() + settle_s
                if time.monotonic() >= settle_until:
                    break
    finally:
        c.close()
    return out


Row = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]  # key, value, headers


def produce_rows(bootstrap: str, topic: str, rows: Iterable[Row], partitions: int,
                 extra: dict[str, Any] | None = None) -> dict[int, int]:
    """Produce (key, value, headers) rows round-robin over partitions; records per partition."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                  **(extra or {})})
    counts: dict[int, int] = {}
    for i, (key, value, headers) in enumerate(rows):
        part = i % partitions
        while True:
            try:
                p.produce(topic, value, key=key, partition=part, headers=headers)
                break
            except BufferError:
                p.poll(0.05)
        counts[part] = counts.get(part, 0) + 1
    assert p.flush(30) == 0
    return counts


def read_all(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every record of a topic, read by assignment (no group to join) up to the end of each
    partition (end-of-partition events come from fetch responses: right on Tansu too)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("read-all"),
                  "enable.partition.eof": True, "enable.auto.commit": False,
                  "fetch.message.max.bytes": 16 * 2**20, "receive.message.max.bytes": 64 * 2**20})
    try:
        meta = c.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(meta.partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        at_end: set[int] = set()
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(parts):
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic}: no end of partition after {timeout_s} s")
            for m in c.consume(1000, 0.2):
                err = m.error()
                if err is None:
                    out.append(m)
                    at_end.discard(m.partition())
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
        return out
    finally:
        c.close()


# What a group coordinator answers while it moves or loads its offsets partition (a fresh
# Apache Kafka loads its 8 offsets partitions as the first groups appear): ask again.
_COORDINATOR_BUSY = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                               KafkaError.COORDINATOR_NOT_AVAILABLE})


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                parts = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                break
            except KafkaException as exc:
                if exc.args[0].code() not in _COORDINATOR_BUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()
    return {p.partition: p.offset for p in parts}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(v)


def to_toml(config: dict[str, Any]) -> str:
    lines: list[str] = []

    def table(prefix: str, node: dict[str, Any]) -> None:
        scalars = {k: v for k, v in node.items() if not isinstance(v, dict)}
        if prefix:
            lines.append(f"[{prefix}]")
        lines.extend(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in scalars.items())
        for k, v in node.items():
            if isinstance(v, dict):
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", config)
    return "\n".join(lines) + "\n"


def base_config(bootstrap: str, topic: str, group: str, tmp: Path, protocol: str | None = None,
                **workers: Any) -> dict[str, Any]:
    """``protocol``: the group protocol (default: the session's, TEST_GROUP_PROTOCOL)."""
    return {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": group, "topics": [topic],
                  "consumer": group_settings(protocol), "producer": {"linger.ms": 2}},
        "workers": {"plugin": "probe", "processes": 2, "restart_backoff_s": 0.05, **workers},
        "supervisor": {"commit_interval_ms": 200, "status_interval_s": 0.1,
                       "revoke_timeout_s": 10.0, "shutdown_timeout_s": 20.0},
    }


class Ringmaster:
    """One `ringmaster run` daemon in a subprocess, observed through its status file."""

    def __init__(self, config: dict[str, Any], tmp: Path, name: str = "rm",
                 args: Iterable[str] = (), env: dict[str, str] | None = None,
                 status_path: Path | None = None, plugin_dirs: Iterable[Path] = (),
                 new_session: bool = False, prefix: Iterable[str] = ()) -> None:
        """``new_session``: the daemon leads a process group of its own (its workers in it), so
        a test can signal the whole group as a terminal would (os.killpg(proc.pid, ...)).
        ``prefix``: a command the daemon runs through, which ends by exec'ing it (``ip netns
        exec``: on another "host", tests/cluster/netns.py), so that its pid is the daemon's."""
        self.dir = tmp
        self.status_path = status_path or tmp / f"{name}.status.json"
        self.log_path = tmp / f"{name}.log"
        config = json.loads(json.dumps(config))
        config.setdefault("supervisor", {})["status_file"] = str(self.status_path)
        # The session's segment directory, or a test's own (row_shm_dir): the environment's
        # RINGMASTER__SUPERVISOR__SHM_DIR would win over the config file, so it is set here.
        self.shm_dir = Path(config["supervisor"].get("shm_dir") or SHM_DIR)
        # Each daemon its own control socket (two daemons of one group may share a host here).
        config["supervisor"].setdefault("control_socket", str(SOCK_DIR / f"{uuid.uuid4().hex[:10]}.sock"))
        self.socket_path = Path(config["supervisor"]["control_socket"]) if config["supervisor"][
            "control_socket"] else None
        self.config_path = tmp / f"{name}.toml"
        self.config_path.write_text(to_toml(config))
        self.pythonpath = os.pathsep.join([*map(str, plugin_dirs), str(PLUGINS), str(ROOT)])
        # TMPDIR, the test's own directory: what a daemon killed with SIGKILL cannot remove
        # stays there, not in /tmp (the fork server's socket directory, pymp-*: one a run).
        env = dict(os.environ, TMPDIR=str(tmp), **(env or {}), PYTHONPATH=self.pythonpath,
                   RINGMASTER__SUPERVISOR__SHM_DIR=str(self.shm_dir))
        self._log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", "runtime.cli", "run", "-c", str(self.config_path),
             "--no-progress", *args], stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
            start_new_session=new_session)
        try:  # the start stamp its segments are named with (exec keeps a process's start time)
            self.stamp: int | None = int(psutil.Process(self.proc.pid).create_time() * 100)
        except psutil.NoSuchProcess:
            self.stamp = None

    def command(self, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        """`ringmaster <args> -c <this daemon's config>`, as an operator types it."""
        env = dict(os.environ, PYTHONPATH=self.pythonpath)
        return subprocess.run([sys.executable, "-m", "runtime.cli", *args, "-c", str(self.config_path)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout_s)

    def status(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return None

    def wait_status(self, pred: Callable[[dict[str, Any]], Any], timeout_s: float, what: str) -> Any:
        def check() -> Any:
            if self.proc.poll() is not None:
                raise AssertionError(f"ringmaster exited with {self.proc.returncode} while waiting "
                                     f"for {what}:\n{self.log_tail()}")
            s = self.status()
            return s is not None and pred(s) and s
        return wait_for(check, timeout_s, what)

    def worker_pids(self) -> list[int]:
        s = self.status() or {}
        return [w["pid"] for w in s.get("workers", []) if w["alive"] and w["pid"]]

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def terminate(self, timeout_s: float = 60) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def wait(self, timeout_s: float = 60) -> int:
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"ringmaster did not exit in {timeout_s} s:\n{self.log_tail()}") from None

    def log_tail(self, n: int = 60) -> str:
        if not self._log.closed:  # also readable after close()
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def close(self) -> None:
        """Tear down after a test, also a failed one: kill what is left and reclaim the
        segments a killed supervisor could not unlink, so one failure does not cascade."""
        if self.proc.poll() is None:
            for child in self.children():
                child.kill()
            self.proc.kill()
            self.proc.wait(10)
            self.reclaim()  # killed here, on a failure: not a leak of the daemon's own
        self._log.close()

    def segments(self) -> list[str]:
        """This daemon's segments still in its directory (a SIGKILL leaves them)."""
        return shm_segments(self.shm_dir, self.proc.pid, self.stamp)

    def reclaim(self) -> list[str]:
        """Unlink this daemon's segments, as its next start would; what was unlinked."""
        left = self.segments()
        for name in left:
            (self.shm_dir / name).unlink(missing_ok=True)
        return left


# Each test session keeps the daemons' segments in a directory of its own, so that sessions
# running side by side (worktrees, CI jobs) never see each other's segments as leftovers.
# Every daemon a test starts inherits it through the environment (supervisor.shm_dir).
SHM_DIR = Path(os.environ.setdefault("RINGMASTER__SUPERVISOR__SHM_DIR", f"/dev/shm/rmtest-{os.getpid()}"))
SHM_DIR.mkdir(mode=0o700, exist_ok=True)
# The daemons' control sockets: a short path (a Unix socket's is at most 107 bytes), one
# directory per session, emptied at its end (conftest.py).
SOCK_DIR = Path(tempfile.gettempdir()) / f"rmsock-{os.getpid()}"
SOCK_DIR.mkdir(mode=0o700, exist_ok=True)


def sweep_dead_sessions() -> list[str]:
    """Remove the segment and socket directories of test sessions that no longer run: a
    session killed before its end (SIGKILL, a CI timeout) cannot remove its own, and its
    segments would otherwise stay in /dev/shm until reboot. What was removed."""
    removed = []
    for base, prefix in ((SHM_DIR.parent, "rmtest-"), (SOCK_DIR.parent, "rmsock-")):
        for d in base.glob(f"{prefix}*"):
            pid = d.name.removeprefix(prefix)
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(str(d))
    return removed


def shm_segments(directory: Path = SHM_DIR, pid: int | None = None,
                 stamp: int | None = None) -> list[str]:
    """The segments in a directory (the session's by default), or those of one supervisor: its
    pid and, when given, its start stamp (runtime/transport/shm.py), so that a later supervisor
    that got the same pid (they are reused within minutes on a busy host) is not taken for it."""
    names = sorted(p.name for p in directory.glob("ringmaster-*" if pid is None else f"ringmaster-{pid}-*"))
    if stamp is None:
        return names
    return [n for n in names if n.split("-")[2].isdigit() and abs(int(n.split("-")[2]) - stamp) <= 1]


def row_shm_dir(name: str) -> Path:
    """A directory of its own for one scenario's daemons (a fault-matrix row): what they
    leave behind is that scenario's, whatever runs beside it (take_leftovers)."""
    d = SHM_DIR / name
    d.mkdir(mode=0o700)
    return d


def take_leftovers(directory: Path) -> list[str]:
    """What is left in a scenario's directory; removed with it, so that one leak is
    reported once, by its scenario."""
    left = sorted(p.name for p in directory.iterdir())
    shutil.rmtree(directory, ignore_errors=True)
    return left


def journal(dir_: Path) -> list[tuple[int, int, int, int]]:
    """(monotonic_ns, partition, offset, pid) of every processed record, by time."""
    return [row[:4] for row in journal_with_keys(dir_)]  # type: ignore[misc]


def journal_with_keys(dir_: Path) -> list[tuple[int, int, int, int, str]]:
    """(monotonic_ns, partition, offset, pid, key hex or "-") of every processed record, by time."""
    rows = []
    for f in dir_.glob("*.log"):
        for line in f.read_text().splitlines():
            _topic, part, off, pid, ns, key = line.split()
            rows.append((int(ns), int(part), int(off), int(pid), key))
    return sorted(rows)


def topic_names() -> dict[str, str]:
    """Fresh topic and group names for one test (Tansu: never reuse, never delete)."""
    return {"in": unique("in"), "out": unique("out"), "dlq": unique("dlq"), "group": unique("g")}


def daemon_config(broker: Any, names: dict[str, str], tmp: Path, journal: bool = False,
                  **workers: Any) -> dict[str, Any]:
    """A daemon reading names["in"], with an output and a dead-letter topic; ``journal``
    makes the probe plugin write what it processed under tmp/journal (see journal())."""
    if journal:
        jdir = tmp / "journal"
        jdir.mkdir(exist_ok=True)
        workers["settings"] = {"journal_dir": str(jdir), **workers.get("settings", {})}
    c = base_config(broker.bootstrap, names["in"], names["group"], tmp, **workers)
    c["output"] = {"topic": names["out"]}
    c["dead_letter"] = {"topic": names["dlq"]}
    return c


def assert_runs_in_order(seqs: dict[Any, list[tuple[int, int]]], exact: bool = False) -> dict[Any, int]:
    """Order (invariant 2, and key ordering's promise): for each sequence (a partition's, or
    a key's) of (offset, worker pid) in processing order: one worker at a time, offsets
    increasing within each worker's run, and a hand-over (a batch moving to another worker,
    a crash, a rebalance) resumes no later than the next offset seen after where the
    previous run stopped: a redelivery may repeat records, never skip one. Two workers on
    one sequence at the same time interleave its offsets, which this catches as a skip. A
    key's offsets are sparse; that is not a gap. ``exact`` (a run without faults): every
    offset exactly once, in offset order, however often the sequence moved between workers.
    Returns the number of runs per sequence."""
    runs_of = {}
    for name, seq in seqs.items():
        runs: list[tuple[int, list[int]]] = []
        for off, pid in seq:
            if not runs or runs[-1][0] != pid:
                runs.append((pid, []))
            runs[-1][1].append(off)
        for pid, offs in runs:
            assert all(b > a for a, b in itertools.pairwise(offs)), \
                f"{name}: worker {pid} processed out of order: {offs[:20]}"
        offsets = sorted({off for off, _ in seq})
        for (_, prev), (_, nxt) in itertools.pairwise(runs):
            later = [o for o in offsets if o > prev[-1]]
            assert not later or nxt[0] <= later[0], \
                f"{name}: a record skipped between runs {prev[-1]} -> {nxt[0]}"
        if exact:
            seen = [off for off, _ in seq]
            assert seen == sorted(set(seen)), f"{name}: not each record once in offset order"
        runs_of[name] = len(runs)
    return runs_of


def kill_workers_in_turn(rm: Ringmaster, times: int, every_records: int) -> None:
    """SIGKILL one worker each time `every_records` more records are done, and wait for its
    replacement."""
    for n in range(1, times + 1):
        s = rm.wait_status(lambda s, n=n: s["records"] >= every_records * n, 60, "progress")
        victim = s["workers"][n % len(s["workers"])]["pid"]
        os.kill(victim, signal.SIGKILL)
        rm.wait_status(lambda s, v=victim, n=n: s["restarts"] >= n and all(
            w["alive"] and w["pid"] != v for w in s["workers"]), 30, "the worker to be restarted")


def run_until_caught_up(config: dict[str, Any], tmp: Path, name: str = "rm",
                        timeout_s: float = 120, env: dict[str, str] | None = None) -> Ringmaster:
    """`ringmaster run --until-caught-up`; asserts exit 0 and returns the finished daemon
    (its status file and log stay readable)."""
    rm = Ringmaster(config, tmp, name, args=["--until-caught-up"], env=env)
    try:
        assert rm.wait(timeout_s) == 0, rm.log_tail()
    finally:
        rm.close()
    return rm
