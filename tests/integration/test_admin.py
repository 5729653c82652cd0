"""The admin endpoint of a real daemon: metrics that match what was processed, liveness that
fails only for a stuck worker (and recovers when it is replaced), never for a rebalance or a
pause, `ringmaster status --json` equal to /status, and `ringmaster top` in a terminal."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    PLUGINS,
    ROOT,
    Ringmaster,
    committed,
    daemon_config,
    make_topics,
    produce,
    read_all,
    wait_for,
)
from prometheus_client.parser import text_string_to_metric_families

from runtime.dev.tansu import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))


def config(broker: Any, names: dict[str, str], tmp_path: Path, **workers: Any) -> tuple[dict[str, Any], str]:
    port = free_port()
    c = daemon_config(broker, names, tmp_path, **workers)
    c["dead_letter"].update(max_attempts=2, retry_backoff_s=0.01)
    c["admin"] = {"listen": f"127.0.0.1:{port}"}
    return c, f"http://127.0.0.1:{port}"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def metrics(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    code, body = get(base + "/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


def one(m: dict[Any, float], name: str, **labels: str) -> float:
    found = [v for (n, lab), v in m.items()
             if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_metrics_match_what_reached_the_broker_and_a_worker_kill_is_counted(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """The counters against the topics, not only against /status (built from the same snapshot:
    a counter wrong in both places would pass that comparison). The run has no fault until
    every record is done, so each output and dead letter exists exactly once; then a worker
    is killed, and counted."""
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(3000)]
    for i in (10, 700, 1400, 2100, 2800):
        values[i] = f"raise:r{i}"
    counts = produce(broker.bootstrap, names["in"], values, 2)
    cfg, base = config(broker, names, tmp_path, settings={"sleep_ms": 0.5})
    rm = Ringmaster(cfg, tmp_path)
    try:
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 2) == counts, 120,
                 "every offset committed", interval_s=0.3)
        wait_for(lambda: (st := json.loads(get(base + "/status")[1] or b"{}")) and st.get("lag") == 0
                 and st.get("dead_letters_waiting") == 0 and all(p["committed"] == p["high"]
                                                                for p in st["partitions"]), 30,
                 "a snapshot with the lag at 0")
        st = json.loads(get(base + "/status")[1])
        m = metrics(base)
        outs = read_all(broker.bootstrap, names["out"])
        dead = read_all(broker.bootstrap, names["dlq"])
        poison = {v for v in values if ":" in v}
        assert sorted(json.loads(o.value())["id"] for o in outs) == sorted(set(values) - poison), \
            "each good record's output once"
        assert sorted(d.value().decode() for d in dead) == sorted(poison)
        assert one(m, "ringmaster_outputs_total") == len(outs) == st["outputs"]
        assert one(m, "ringmaster_dead_letters_total") == len(dead) == st["dead_letters"]
        assert one(m, "ringmaster_records_processed_total") == len(values) == st["records"]
        assert one(m, "ringmaster_records_consumed_total") == len(values) == st["consumed"]
        assert one(m, "ringmaster_lag") == 0
        for p in (0, 1):
            assert one(m, "kafka_consumergroup_group_lag", topic=names["in"], partition=str(p)) == 0
            offset = one(m, "kafka_consumergroup_group_offset", topic=names["in"], partition=str(p))
            assert offset == counts[p] == committed(broker.bootstrap, names["group"], names["in"], 2)[p]
        assert one(m, "ringmaster_batch_duration_seconds_count") == st["batches"]
        victim = st["workers"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        rm.wait_status(lambda s: s["restarts"] == 1 and s["workers"][0]["alive"]
                       and s["workers"][0]["pid"] != victim, 30, "the killed worker to be replaced")
        assert one(metrics(base), "ringmaster_worker_restarts_total", worker="0", cause="crashed") == 1
        # `ringmaster status --json` reads the same document from the same endpoint.
        cli = subprocess.run([sys.executable, "-m", "runtime.cli", "status", "-c", str(rm.config_path),
                              "--json"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=60)
        assert cli.returncode == 0, cli.stderr
        via_cli, via_http = json.loads(cli.stdout), json.loads(get(base + "/status")[1])
        stable = ("records", "outputs", "dead_letters", "committed", "lag", "consumed", "group", "pid")
        assert {k: via_cli[k] for k in stable} == {k: via_http[k] for k in stable}
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()


def test_liveness_fails_while_a_worker_is_stopped_and_recovers_once_it_is_replaced(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    cfg, base = config(broker, names, tmp_path, heartbeat_timeout_s=2.0)
    rm = Ringmaster(cfg, tmp_path)
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, 60, "ready")
        # Ready means one worker has started; the victim must be a started one (a starting
        # worker is judged by setup_timeout_s, not by its heartbeat).
        s = rm.wait_status(lambda s: len(s["workers"]) == 2
                           and all(w["state"] == "ready" for w in s["workers"]), 60, "both workers started")
        assert get(base + "/healthz")[0] == 200
        victim = s["workers"][0]["pid"]
        os.kill(victim, signal.SIGSTOP)
        _code, body = wait_for(lambda: (r := get(base + "/healthz"))[0] == 503 and r, 15,
                               "/healthz to fail", interval_s=0.05)
        assert "silent" in json.loads(body)["reasons"][0]
        wait_for(lambda: get(base + "/healthz")[0] == 200 and victim not in rm.worker_pids(), 30,
                 "the stuck worker to be replaced and /healthz to recover")
        # The status file is rewritten on its own interval: it may still show the worker
        # before its replacement when /healthz (answered live) already does.
        rm.wait_status(lambda s: sum(w["exits"].get("killed", 0) for w in s["workers"]) == 1, 10,
                       "the stuck worker's kill counted in the status")
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()


def test_liveness_holds_through_a_rebalance_and_an_operator_pause(broker: Any, names: dict[str, str],
                                                                  tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(4000)], 4)
    cfg, base = config(broker, names, tmp_path, settings={"sleep_ms": 1})
    a = Ringmaster(cfg, tmp_path, "a")
    b = None
    answers: list[int] = []
    done = threading.Event()

    def probe() -> None:
        while not done.is_set():
            answers.append(get(base + "/healthz")[0])
            time.sleep(0.1)

    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, 60, "ready")
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        cfg_b = json.loads(json.dumps(cfg))
        cfg_b["admin"] = {}
        b = Ringmaster(cfg_b, tmp_path, "b")
        a.wait_status(lambda s: s["revocations"], 60, "a rebalance that moves partitions")
        subprocess.run([sys.executable, "-m", "runtime.cli", "pause", "-c", str(a.config_path)], env=ENV,
                       cwd=ROOT, check=True, capture_output=True, timeout=60)
        a.wait_status(lambda s: s["partitions"] and all("operator" in p["pause_reasons"]
                                                        for p in s["partitions"]), 15, "the pause")
        subprocess.run([sys.executable, "-m", "runtime.cli", "resume", "-c", str(a.config_path)], env=ENV,
                       cwd=ROOT, check=True, capture_output=True, timeout=60)
        assert b.terminate() == 0, b.log_tail()
        a.wait_status(lambda s: len(s["partitions"]) == 4, 60, "A to take everything back")
        done.set()
        prober.join(5)
        assert answers and set(answers) == {200}, f"/healthz answered {sorted(set(answers))}"
        assert a.terminate() == 0, a.log_tail()
    finally:
        done.set()
        a.close()
        if b is not None:
            b.close()


def test_top_shows_a_running_daemon_in_a_terminal(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(500)], 2)
    cfg, base = config(broker, names, tmp_path)
    rm = Ringmaster(cfg, tmp_path)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    top = None
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, 60, "ready")
        top = subprocess.Popen([sys.executable, "-m", "runtime.cli", "top", "-c", str(rm.config_path),
                                "--interval", "0.3"], stdin=slave, stdout=slave, stderr=slave, env=ENV,
                               cwd=ROOT, start_new_session=True)
        os.close(slave)
        screen = b""
        deadline = time.monotonic() + 30
        label = names["in"].encode() + b"[1]"
        while time.monotonic() < deadline and not (label in screen and b"workers" in screen):
            if select.select([master], [], [], 0.2)[0]:
                try:
                    screen += os.read(master, 65536)
                except OSError:
                    break
        assert names["in"].encode() + b"[1]" in screen and b"workers" in screen, screen[-2000:]
        top.send_signal(signal.SIGINT)
        assert top.wait(10) == 0
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        if top is not None and top.poll() is None:
            top.kill()
            top.wait(5)
        os.close(master)
        rm.close()


def test_many_idle_and_slow_clients_neither_stop_the_daemon_nor_its_healthz(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """Issue 17.4: ~990 idle connections ran the supervisor out of file descriptors; psutil
    raised OSError inside the status and the daemon exited 1."""
    import socket

    import psutil

    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(6000)]
    counts = produce(broker.bootstrap, names["in"], values, 2)
    cfg, base = config(broker, names, tmp_path, settings={"sleep_ms": 1})
    cfg["admin"].update(max_connections=32, request_timeout_s=3.0)
    host, port = base.removeprefix("http://").split(":")
    rm = Ringmaster(cfg, tmp_path)
    idle: list[socket.socket] = []
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, 60, "ready")
        fds_before = psutil.Process(rm.proc.pid).num_fds()
        for i in range(1000):
            s = socket.create_connection((host, int(port)), timeout=5)
            if i % 50 == 0:
                s.send(b"GET /stat")  # slow: half a request, never finished
            idle.append(s)
        for _ in range(10):
            t0 = time.monotonic()
            assert get(base + "/healthz")[0] == 200, "liveness answers through the crowd"
            assert time.monotonic() - t0 < 2.0
            time.sleep(0.2)
        fds = psutil.Process(rm.proc.pid).num_fds()
        assert fds <= fds_before + 32 + 4, f"the daemon's descriptors are bounded: {fds_before} -> {fds}"
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 2) == counts, 120,
                 "every record committed", interval_s=0.3)
        assert rm.proc.poll() is None
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        for s in idle:
            s.close()
        rm.close()
    assert "internal error" not in rm.log_path.read_text()


def test_a_supervisor_out_of_file_descriptors_carries_on(broker: Any, names: dict[str, str],
                                                          tmp_path: Path) -> None:
    """Issue 17.4: fd exhaustion of the supervisor must never kill it. Its soft RLIMIT_NOFILE
    is lowered below what it holds, so every new descriptor fails with EMFILE: the endpoint
    stops accepting for a moment, the status goes on without what psutil cannot read
    (it raises OSError, not psutil.Error), records keep flowing on what is open."""
    import socket

    import psutil

    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    counts = produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(8000)], 2)
    cfg, base = config(broker, names, tmp_path, settings={"sleep_ms": 1})
    host, port = base.removeprefix("http://").split(":")
    rm = Ringmaster(cfg, tmp_path)
    conns: list[socket.socket] = []
    try:
        wait_for(lambda: get(base + "/readyz")[0] == 200, 60, "ready")
        proc = psutil.Process(rm.proc.pid)
        soft, hard = proc.rlimit(psutil.RLIMIT_NOFILE)
        # A new descriptor takes the lowest free number, and EMFILE comes only when that number
        # is at the limit: a limit below the count of open ones still leaves every hole lower
        # down free (closed sockets leave several), and five connections would land in them.
        open_fds = {int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd")}
        proc.rlimit(psutil.RLIMIT_NOFILE, (min(set(range(len(open_fds) + 1)) - open_fds), hard))
        for _ in range(5):  # accepted by the kernel, refused a descriptor by the process
            conns.append(socket.create_connection((host, int(port)), timeout=5))
        wait_for(lambda: "no file descriptor for a new connection" in rm.log_path.read_text(), 30,
                 "the endpoint to run out of descriptors")
        # (The status file cannot be written either: progress shows in the group's commits.)
        def done() -> int:
            offsets = committed(broker.bootstrap, names["group"], names["in"], 2)
            return sum(max(o, 0) for o in offsets.values())
        squeezed = done()
        wait_for(lambda: rm.proc.poll() is None and done() > squeezed + 200, 60,
                 "records to keep flowing while the supervisor has no descriptor to spare", interval_s=0.3)
        assert rm.proc.poll() is None
        for s in conns:
            s.close()
        conns.clear()
        proc.rlimit(psutil.RLIMIT_NOFILE, (soft, hard))
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 2) == counts, 120,
                 "every record committed", interval_s=0.3)
        assert get(base + "/healthz")[0] == 200
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        for s in conns:
            s.close()
        rm.close()
    assert "internal error" not in rm.log_path.read_text()
