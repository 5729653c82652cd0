"""`ringmaster broker --apache-kafka`: Apache Kafka itself in the foreground, started and
stopped the way a developer does it, leaving no JVM and no log dir behind; and what it says
when Java or Maven is missing (one line, exit 1)."""

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
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"),
                      "auto.offset.reset": "earliest", "isolation.level": "read_committed",
                      "group.protocol": "consumer"})
        try:
            c.subscribe([topic])
            seen: list[bytes] = []

            def read_last() -> bool:
                m = c.poll(0.5)
                if m is not None and m.error() is None:
                    seen.append(m.value() or b"")
                return b"last" in seen
            wait_for(read_last, 60, "the last committed record")
            assert seen == [b"kept", b"last"]
        finally:
            c.close()
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
