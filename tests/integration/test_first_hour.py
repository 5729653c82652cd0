"""What a new user and an operator meet first, against the real broker and CLI: the dev
broker's banner says how to make joins fast, a daemon says at start that its input topic
does not exist, `produce` and `tail` move test records in and out, and a clean stop is
written in the status that `ringmaster status` then reports as not running (exit 3)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import PLUGINS, ROOT, Ringmaster, daemon_config, make_topics, wait_for

from runtime.dev.tansu import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))


def cli(*args: str, stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], input=stdin, capture_output=True,
                          text=True, env=ENV, cwd=ROOT, timeout=timeout)


@pytest.mark.tansu
def test_the_dev_brokers_banner_says_how_to_make_joins_fast() -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "runtime.cli", "broker", "--port", str(port)],
                            stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    try:
        banner = b""

        def said_it() -> bool:
            nonlocal banner
            assert proc.stderr is not None
            if select.select([proc.stderr], [], [], 0.2)[0]:
                banner += os.read(proc.stderr.fileno(), 4096)
            return b"heartbeat.interval.ms" in banner

        wait_for(said_it, 30, "the banner")
        text = banner.decode()
        assert f"listening on 127.0.0.1:{port}" in text
        assert '"session.timeout.ms" = 6000' in text and '"heartbeat.interval.ms" = 500' in text
        assert "[kafka.consumer]" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_daemon_says_at_start_that_its_input_topic_does_not_exist(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 1, names["out"], names["dlq"])  # not names["in"]
    rm = Ringmaster(daemon_config(broker, names, tmp_path), tmp_path)
    try:
        wait_for(lambda: "input topic does not exist (yet)" in rm.log_tail(200), 60, "the warning")
        assert f"topic={names['in']}" in rm.log_tail(200)
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()


def test_a_clean_stop_is_in_the_status_and_status_reports_it_not_running(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    rm = Ringmaster(daemon_config(broker, names, tmp_path), tmp_path)
    try:
        rm.wait_status(lambda s: s["ready"], 60, "ready")
        running = cli("status", "-c", str(rm.config_path))
        assert running.returncode == 0, running.stderr
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    final = json.loads(rm.status_path.read_text())
    assert final["ready"] is False and final["stopped"]["code"] == 0
    assert final["stopped"]["reason"] == "SIGTERM received" and final["stopped"]["at"] > 0
    assert final["paused"] == 0, "a stop is not a pause"
    after = cli("status", "-c", str(rm.config_path))
    assert after.returncode == 3
    assert "not running: stopped at" in after.stderr and "(exit 0: SIGTERM received)" in after.stderr


def test_produce_and_tail_move_test_records_in_and_out(broker: Any, names: dict[str, str],
                                                       tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[kafka]\nbootstrap_servers = "{broker.bootstrap}"\ngroup_id = "{names["group"]}"\n'
                   f'topics = ["{names["in"]}"]\n[workers]\nplugin = "workers.enrich"\n'
                   f'[output]\ntopic = "{names["out"]}"\n')
    made = cli("produce", "-c", str(cfg), "--key-separator", "\t", stdin="k1\tone\nk2\ttwo\nthree\n")
    assert made.returncode == 0, made.stderr
    assert f"produced 3 record(s) to '{names['in']}' (created it with 4 partitions)" in made.stderr
    read = cli("tail", "-c", str(cfg), "--topic", names["in"], "--max", "3", "--keys", "--timeout", "30")
    assert read.returncode == 0, read.stderr
    assert sorted(read.stdout.splitlines()) == sorted(["k1\tone", "k2\ttwo", "\tthree"])
    short = cli("tail", "-c", str(cfg), "--topic", names["in"], "--max", "5", "--timeout", "3")
    assert short.returncode == 1 and len(short.stdout.splitlines()) == 3
    assert "only 3 of 5 record(s)" in short.stderr and len(short.stderr.strip().splitlines()) == 1
    again = cli("produce", "-c", str(cfg), "four")
    assert again.returncode == 0 and "created" not in again.stderr, "an existing topic is written to"
    no_dlq = cli("tail", "-c", str(cfg), "--dead-letters")
    assert no_dlq.returncode == 2 and "no [dead_letter] topic" in no_dlq.stderr


def test_tail_n_prints_the_last_n_records_of_each_partition_in_the_same_order_every_time(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """Issue 28: `tail -n N` returned the first N records, unlike Unix tail."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[kafka]\nbootstrap_servers = "{broker.bootstrap}"\ngroup_id = "{names["group"]}"\n'
                   f'topics = ["{names["in"]}"]\n[workers]\nplugin = "workers.enrich"\n')
    # keys a, d: two partitions (librdkafka's CRC32 partitioner), five records each, in order
    lines = "".join(f"{k}={k}{i}\n" for i in range(5) for k in "ad")
    made = cli("produce", "-c", str(cfg), "--key-separator", "=", "--partitions", "2", stdin=lines)
    assert made.returncode == 0, made.stderr
    runs = [cli("tail", "-c", str(cfg), "--topic", names["in"], "-n", "2", "--keys") for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr
    got = runs[0].stdout.splitlines()
    assert runs[1].stdout.splitlines() == got, "the same order every time"
    assert len(got) == 4, got
    first, second = got[:2], got[2:]
    for pair in (first, second):
        key = pair[0].split("\t")[0]
        assert pair == [f"{key}\t{key}3", f"{key}\t{key}4"], "the last two of one partition, in offset order"
    assert [first[0][0], second[0][0]] == ["d", "a"], "partition 0 (d) first, then 1 (a)"
    none = cli("tail", "-c", str(cfg), "--topic", names["in"], "-n", "0")
    assert none.returncode == 0 and none.stdout == ""
    more = cli("tail", "-c", str(cfg), "--topic", names["in"], "-n", "99")
    assert more.returncode == 0 and len(more.stdout.splitlines()) == 10, "fewer than N: all of them"
