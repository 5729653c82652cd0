"""`ringmaster broker --apache-kafka` (and ``--nodes 3``): Apache Kafka itself in the foreground,
started and stopped the way a developer does it, leaving no JVM and no log dir behind; and
what it says when Java or Maven is missing (one line, exit 1)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from helpers import ROOT, exited, make_topics, unique, wait_for

from runtime.dev.kafkabroker import KAFKA_VERSION, cache_dir
from runtime.dev.tansu import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _kafka_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("ringmaster-kafka-*")}


@pytest.mark.kafka
def test_the_apache_kafka_broker_serves_transactions_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    dirs_before = _kafka_dirs()
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "broker", "--apache-kafka", "--port", str(port)],
        stderr=subprocess.PIPE, cwd=ROOT)
    try:
        banner = b""

        def said_it() -> bool:
            nonlocal banner
            assert proc.stderr is not None
            assert proc.poll() is None, banner.decode()
            if select.select([proc.stderr], [], [], 0.2)[0]:
                banner += os.read(proc.stderr.fileno(), 4096)
            return b"Ctrl-C stops it" in banner

        wait_for(said_it, 240, "the banner")
        assert f"Apache Kafka {KAFKA_VERSION} listening on 127.0.0.1:{port}" in banner.decode()
        jvm = [c for c in psutil.Process(proc.pid).children(recursive=True)
               if "kafka.Kafka" in " ".join(c.cmdline())]
        assert len(jvm) == 1
        bootstrap = f"127.0.0.1:{port}"
        topic = unique("apache")
        make_topics(bootstrap, 1, topic)
        # An aborted transaction between two committed ones: read_committed skips it.
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("tx")})
        p.init_transactions(30)
        for value, commit in ((b"kept", True), (b"aborted", False), (b"last", True)):
            p.begin_transaction()
            p.produce(topic, value)
            p.flush(30)
            (p.commit_transaction if commit else p.abort_transaction)(30)
        seen = _read_until({"bootstrap.servers": bootstrap, "isolation.level": "read_committed",
                            "group.protocol": "consumer"}, topic, b"last", 60, "the last committed record")
        assert seen == [b"kept", b"last"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        assert exited(jvm[0])
        assert _kafka_dirs() == dirs_before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _cli_without(tmp_path: Path, keep: tuple[str, ...], cache: Path) -> subprocess.CompletedProcess[str]:
    """The CLI with a PATH holding only the named programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in keep:
        found = shutil.which(name)
        if found:
            (bin_dir / name).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env.update(PATH=str(bin_dir), XDG_CACHE_HOME=str(cache))
    return subprocess.run([sys.executable, "-m", "runtime.cli", "broker", "--apache-kafka", "--port", "0"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


def test_without_java_the_apache_kafka_broker_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = _cli_without(tmp_path, ("mvn",), tmp_path / "cache")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1:] == [
        "ringmaster: error: Apache Kafka needs Java 17 or newer and 'java' is not on PATH "
        "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)"]


def test_without_maven_a_first_run_is_one_line_and_exit_1(tmp_path: Path) -> None:
    done = _cli_without(tmp_path, ("java",), tmp_path / "cache")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1] == (f"ringmaster: error: resolving Apache Kafka {KAFKA_VERSION} needs Maven and 'mvn' "
                         "is not on PATH (Debian/Ubuntu: apt-get install maven)")
    home = tmp_path / "cache" / "kafka-ringmaster" / f"kafka-{KAFKA_VERSION}"
    assert lines[:-1] == [f"resolving Apache Kafka {KAFKA_VERSION} with Maven into {home} (first run only)"]
    assert cache_dir().name == f"kafka-{KAFKA_VERSION}"


def _read_until(props: dict[str, str], topic: str, last: bytes, timeout_s: float, what: str) -> list[bytes]:
    """The topic's values from its start, read by a new group, up to ``last``."""
    c = Consumer({**props, "group.id": unique("g"), "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        seen: list[bytes] = []

        def read() -> bool:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                seen.append(m.value() or b"")
            return last in seen
        wait_for(read, timeout_s, what)
        return seen
    finally:
        c.close()


def _read_banner(proc: subprocess.Popen[bytes], until: bytes, timeout_s: float) -> str:
    banner = b""

    def said_it() -> bool:
        nonlocal banner
        assert proc.stderr is not None
        assert proc.poll() is None, banner.decode()
        if select.select([proc.stderr], [], [], 0.2)[0]:
            banner += os.read(proc.stderr.fileno(), 4096)
        return until in banner

    wait_for(said_it, timeout_s, "the banner")
    return banner.decode()


@pytest.mark.kafka
@pytest.mark.parametrize("scram", [False, True], ids=["plaintext", "sasl-scram"])
def test_three_nodes_replicate_every_topic_survive_a_node_killed_and_stop_on_sigterm(scram: bool) -> None:
    """``ringmaster broker --apache-kafka --nodes 3`` (issue 40): one line per node and the
    bootstrap list; topics (the internal ones too) with three replicas and min.insync.replicas
    2; a node killed as a user trying failover would, and the others go on; SIGTERM stops
    the rest and removes every log dir."""
    port = free_port()
    dirs_before = _kafka_dirs()
    args = ["--sasl-scram", "alice:alice-secret"] if scram else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "broker", "--apache-kafka", "--nodes", "3", "--port", str(port),
         *args], stderr=subprocess.PIPE, cwd=ROOT)
    try:
        # One read to the banner's last line: the SCRAM lines follow the cluster's at once, and a
        # read that stopped at "share groups are on." may have taken them already.
        banner = _read_banner(proc, b"password_file" if scram else b"share groups are on.", 300)
        nodes = [ln.split() for ln in banner.splitlines() if ln.startswith("node ")]
        assert [(n[1], n[2]) for n in nodes] == [(str(i), f"127.0.0.1:{port + i - 1}") for i in (1, 2, 3)]
        bootstrap = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
        assert f"bootstrap: {bootstrap}" in banner
        jvms = {int(n[4]) for n in nodes}
        assert {c.pid for c in psutil.Process(proc.pid).children(recursive=True)
                if "kafka.Kafka" in " ".join(c.cmdline())} == jvms
        props: dict[str, str] = {"bootstrap.servers": bootstrap}
        if scram:
            ca = banner.split('ca_location = "', 1)[1].split('"', 1)[0]
            props.update({"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                          "sasl.username": "alice", "sasl.password": "alice-secret", "ssl.ca.location": ca})
        topic = unique("replicated")
        admin = AdminClient(props)
        admin.create_topics([NewTopic(topic, 1)])[topic].result(60)
        def in_sync() -> int:  # the topic's partition may not be in a node's metadata yet
            parts = admin.list_topics(topic, timeout=10).topics[topic].partitions
            return len(parts[0].isrs) if 0 in parts else 0
        wait_for(lambda: in_sync() == 3, 60, "three in-sync replicas")
        configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        [described] = configs.values()
        assert described.result(30)["min.insync.replicas"].value == "2"
        p = Producer({**props, "acks": "all", "enable.idempotence": True})
        p.produce(topic, b"before")
        assert p.flush(60) == 0
        leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
        victim = int(nodes[leader - 1][4])
        os.kill(victim, signal.SIGKILL)  # as a user trying failover
        banner += _read_banner(proc, f"node {leader} (pid {victim}) exited".encode(), 60)
        p.produce(topic, b"after")
        assert p.flush(120) == 0, "a follower took over and two replicas acknowledged"
        seen = _read_until(props, topic, b"after", 120, "both records, from the new leader")
        assert seen == [b"before", b"after"]
        offsets = admin.list_topics("__consumer_offsets", timeout=10).topics["__consumer_offsets"]
        assert all(len(part.replicas) == 3 for part in offsets.partitions.values())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(90) == 0
        assert all(exited(pid) for pid in jvms)
        assert _kafka_dirs() == dirs_before
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
