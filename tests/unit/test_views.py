"""`ringmaster status` and `top` against a status file: a daemon that stopped or whose process
is gone is reported as not running (status exits 3), nothing to read is exit 1 (top keeps
waiting and says why and what to do), and no number is ever cut, whatever the width."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from runtime.ops.status import (
    PartitionStatus,
    StatusSnapshot,
    Stopped,
    WindowCpu,
    WorkerStatus,
    process_started_at,
)
from runtime.ops.views import Reading, daemon_state, render, show

BIG = 13_567_890_123


def snapshot(pid: int, started_at: float, stopped: Stopped | None = None,
             ready: bool = True) -> dict[str, Any]:
    why = {"operator": "deploying the new scoring model, back at noon"}
    parts = [PartitionStatus(tp=f"a-rather-long-topic-name-for-orders[{i}]", topic="a-rather-long-topic-name",
                             partition=i, worker=i % 2, paused=i == 0,
                             pause_reasons=["operator"] if i == 0 else [], holds=why if i == 0 else {},
                             blocked=None, committed=BIG + i, done_through=BIG + i, high=BIG + 1000 + i,
                             lag=1000, pending_batches=0, records=BIG, consumed=BIG, outputs=BIG,
                             dead_letters=0, rate=123_456.0) for i in range(3)]
    workers = [WorkerStatus(index=i, pid=100_000 + i, alive=True, state="ready", cpu_s=1.0, records=BIG,
                            in_flight=3, ring_fill=0.5, restarts=12_345, rss=2**30, heartbeat_age_s=0.2,
                            last_exit="killed by the supervisor (SIGKILL): batch exceeded its deadline of "
                                      "300 s (workers.batch_timeout_s)") for i in range(2)]
    snap = StatusSnapshot(
        pid=pid, group="scoring", ordering="partition", elapsed_s=10.0, window_s=9.0, join_s=1.0,
        supervisor_cpu_s=2.0, window_cpu_s=WindowCpu(1.0, 2.0), supervisor_rss=2**22, records=BIG, rate=100.0,
        outputs=BIG, dead_letters=3, discarded=0, batches=10, consumed=BIG, deferred=1, restarts=2, paused=1,
        lag=3000, partitions=parts, workers=workers, revocations=[], committed={}, ready=ready,
        stopped=stopped, started_at=started_at, recent_rate=370_368.0)
    return snap.to_dict()


def config(tmp_path: Path, status_file: Path | None) -> Path:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["in"]\n'
                   '[workers]\nplugin = "workers.enrich"\n'
                   + (f'[supervisor]\nstatus_file = "{status_file}"\n' if status_file else ""))
    return cfg


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def dead_pid() -> tuple[int, float]:
    """The pid and start time of a process that has exited."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    import psutil

    started = psutil.Process(p.pid).create_time()
    p.wait()
    return p.pid, started


# ---------------------------------------------------------------------- is it running?
def test_a_snapshot_of_a_live_process_is_running() -> None:
    assert daemon_state(snapshot(os.getpid(), process_started_at()), answered=False) == (True, "ready")
    assert daemon_state(snapshot(os.getpid(), process_started_at(), ready=False), answered=False) == \
        (True, "starting")


def test_a_snapshot_whose_pid_is_gone_is_not_running() -> None:
    pid, started = dead_pid()
    running, state = daemon_state(snapshot(pid, started), answered=False)
    assert not running and state.startswith(f"not running: pid {pid} is gone without a clean stop")


def test_a_pid_now_used_by_another_process_is_not_the_daemon() -> None:
    running, state = daemon_state(snapshot(os.getpid(), process_started_at() - 3600), answered=False)
    assert not running and "gone" in state


def test_a_clean_stop_says_when_and_why() -> None:
    pid, started = dead_pid()
    at = time.time() - 5
    running, state = daemon_state(snapshot(pid, started, Stopped(0, "SIGTERM received", at)), answered=False)
    assert not running
    assert state == f"stopped at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(at))} " \
                    "(exit 0: SIGTERM received)"
    running, state = daemon_state(snapshot(os.getpid(), process_started_at(), Stopped(3, "the plugin cannot "
                                                                                         "start")), False)
    assert not running and state == "stopping (exit 3: the plugin cannot start)"


# ---------------------------------------------------------------------- ringmaster status
def test_status_of_a_running_daemon_exits_0(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps(snapshot(os.getpid(), process_started_at())))
    r = cli("status", "-c", str(config(tmp_path, path)))
    assert r.returncode == 0, r.stderr
    assert "ready" in r.stdout


@pytest.mark.parametrize("as_json", [False, True])
def test_status_of_a_daemon_that_stopped_cleanly_exits_3_and_says_why(tmp_path: Path, as_json: bool) -> None:
    pid, started = dead_pid()
    path = tmp_path / "status.json"
    path.write_text(json.dumps(snapshot(pid, started, Stopped(0, "SIGTERM received"))))
    r = cli("status", "-c", str(config(tmp_path, path)), *(["--json"] if as_json else []))
    assert r.returncode == 3, r.stderr
    assert r.stderr.startswith("ringmaster: the daemon is not running: stopped at ")
    assert "(exit 0: SIGTERM received)" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    if as_json:
        assert json.loads(r.stdout)["stopped"]["reason"] == "SIGTERM received"
    else:
        assert "stopped at" in r.stdout


def test_status_of_a_daemon_that_died_exits_3(tmp_path: Path) -> None:
    pid, started = dead_pid()
    path = tmp_path / "status.json"
    path.write_text(json.dumps(snapshot(pid, started)))
    r = cli("status", "-c", str(config(tmp_path, path)))
    assert r.returncode == 3 and "gone without a clean stop" in r.stderr, r.stderr


def test_status_with_nothing_to_read_exits_1_and_says_what_to_do(tmp_path: Path) -> None:
    r = cli("status", "-c", str(config(tmp_path, tmp_path / "nope.json")))
    assert r.returncode == 1
    assert "does not exist" in r.stderr and "Start it (ringmaster run -c CONFIG)" in r.stderr
    r = cli("status", "-c", str(config(tmp_path, None)))
    assert r.returncode == 1 and "sets neither [admin] listen nor supervisor.status_file" in r.stderr


def _every_number_whole(text: str) -> None:
    assert "…" not in text
    for number in (f"{BIG:,}", f"{BIG + 1002:,}", "123,456", "370,368/s", "12,345", "1,024", "3,000"):
        assert number in text, f"{number} is cut or missing:\n{text}"


@pytest.mark.parametrize("columns", [None, "40"])
def test_status_piped_or_redirected_never_cuts_a_number(tmp_path: Path, columns: str | None) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps(snapshot(os.getpid(), process_started_at())))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = columns
    r = cli("status", "-c", str(config(tmp_path, path)), env=env)
    assert r.returncode == 0, r.stderr
    _every_number_whole(r.stdout)
    row = [line for line in r.stdout.splitlines() if "orders[0]" in line]
    assert len(row) == 1 and "deploying the new scoring model, back at noon" in row[0], \
        "not a terminal: each row on one line"


@pytest.mark.parametrize("width", [60, 100, 200])
def test_a_narrow_terminal_folds_text_but_never_cuts_a_number(width: int) -> None:
    console = Console(width=width, force_terminal=True, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    show(console, render(Reading(snapshot(os.getpid(), process_started_at()), "x", True, "ready")))
    _every_number_whole(console.export_text())


# ---------------------------------------------------------------------- ringmaster top
def _screen_until(master: int, needles: list[bytes], timeout_s: float) -> bytes:
    screen = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(n in screen for n in needles):
        if select.select([master], [], [], 0.2)[0]:
            try:
                screen += os.read(master, 65536)
            except OSError:
                break
    return screen


@pytest.mark.parametrize(("what", "needles"), [
    ("missing", [b"waiting for the daemon", b"does not exist", b"Start it"]),
    ("dead", [b"not running", b"gone without a clean stop"]),
])
def test_top_keeps_watching_and_says_why_there_is_nothing_running(tmp_path: Path, what: str,
                                                                  needles: list[bytes]) -> None:
    path = tmp_path / "status.json"
    if what == "dead":
        path.write_text(json.dumps(snapshot(*dead_pid())))
    master, slave = pty.openpty()
    top = subprocess.Popen([sys.executable, "-m", "runtime.cli", "top", "-c", str(config(tmp_path, path)),
                            "--interval", "0.2"], stdin=slave, stdout=slave, stderr=slave,
                           start_new_session=True, env={**os.environ, "COLUMNS": "200", "LINES": "60"})
    os.close(slave)
    try:
        screen = _screen_until(master, needles, 30)
        assert all(n in screen for n in needles), screen[-2000:]
        assert top.poll() is None, "top keeps waiting"
        top.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while top.poll() is None and time.monotonic() < deadline:
            _screen_until(master, [b"\0never"], 0.2)  # keep the terminal drained: top may be writing
        assert top.wait(1) == 0
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(5)
        os.close(master)


def test_top_with_nothing_it_could_ever_read_exits_1(tmp_path: Path) -> None:
    r = cli("top", "-c", str(config(tmp_path, None)))
    assert r.returncode == 1 and "sets neither [admin] listen nor supervisor.status_file" in r.stderr


def test_q_leaves_top_and_gives_the_terminal_back_as_it_was(tmp_path: Path) -> None:
    """Issue 28: `q` did not leave `top`."""
    import termios

    path = tmp_path / "status.json"
    path.write_text(json.dumps(snapshot(os.getpid(), process_started_at())))
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    top = subprocess.Popen([sys.executable, "-m", "runtime.cli", "top", "-c", str(config(tmp_path, path)),
                            "--interval", "0.2"], stdin=slave, stdout=slave, stderr=slave,
                           start_new_session=True, env={**os.environ, "COLUMNS": "200", "LINES": "60"})
    try:
        screen = _screen_until(master, [b"orders[0]"], 30)
        assert b"orders[0]" in screen, screen[-2000:]
        assert not termios.tcgetattr(slave)[3] & termios.ICANON, "keys come one at a time while it runs"
        os.write(master, b"q")
        deadline = time.monotonic() + 10
        while top.poll() is None and time.monotonic() < deadline:
            _screen_until(master, [b"\0never"], 0.2)
        assert top.poll() == 0, "q leaves, exit 0"
        assert termios.tcgetattr(slave) == before, "the terminal's mode is put back"
    finally:
        if top.poll() is None:
            top.kill()
            top.wait(5)
        os.close(slave)
        os.close(master)


def _realistic(reload_message: str) -> dict[str, Any]:
    """A daemon as most are: 12 partitions of one topic, 8 workers, offsets in the millions."""
    why = {"operator": "deploying the new scoring model, back at noon"}
    parts = [PartitionStatus(tp=f"orders-eu-west[{i}]", topic="orders-eu-west", partition=i, worker=i % 8,
                             paused=i == 0, pause_reasons=["operator"] if i == 0 else [],
                             holds=why if i == 0 else {}, blocked=None, committed=12_345_678 + i,
                             done_through=12_345_678 + i, high=12_346_678 + i, lag=1000, pending_batches=0,
                             records=99, consumed=99, outputs=99, dead_letters=0, rate=12_345.0)
             for i in range(12)]
    workers = [WorkerStatus(index=i, pid=1_234_567 + i, alive=True, state="ready", cpu_s=1.0,
                            records=123_456_789, in_flight=3, ring_fill=0.5, restarts=3, rss=2**28,
                            heartbeat_age_s=0.2, plugin_version="1.2.3",
                            last_exit="killed by the supervisor (SIGKILL): batch exceeded its deadline of "
                                      "300 s (workers.batch_timeout_s)" if i == 0 else None)
               for i in range(8)]
    snap = StatusSnapshot(
        pid=os.getpid(), group="scoring", ordering="partition", elapsed_s=10.0, window_s=9.0, join_s=1.0,
        supervisor_cpu_s=2.0, window_cpu_s=WindowCpu(1.0, 2.0), supervisor_rss=2**22, records=123_456_789,
        rate=100.0, outputs=123_456_789, dead_letters=3, discarded=0, batches=10, consumed=123_456_789,
        deferred=1, restarts=2, paused=1, lag=12_000, partitions=parts, workers=workers, revocations=[],
        committed={}, ready=True, started_at=process_started_at(), recent_rate=370_368.0,
        plugin="workers.enrich", plugin_version="1.2.3").to_dict()
    snap["reload"] = {"state": "succeeded", "requested_by": "SIGHUP", "started_ms": 1_764_000_000_000,
                      "message": reload_message}
    return snap


PROSE = ["every worker runs plugin workers.enrich version 1.2.3 now: " + "the old workers finished the "
         "batches in their rings and stopped while their partitions moved over; " * 6,
         "killed by the supervisor (SIGKILL): batch exceeded its deadline of 300 s (workers.batch_timeout_s)",
         "operator: deploying the new scoring model, back at noon"]


@pytest.mark.parametrize("width", [80, 100])
def test_at_80_and_100_columns_every_line_fits_and_no_word_is_cut(width: int) -> None:
    """Issue 28: a long "last reload" line widened the summary grid to 484 columns, and the
    workers table wrapped mid-word in 100 columns."""
    console = Console(width=width, force_terminal=True, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    show(console, render(Reading(_realistic(PROSE[0]), "status file", True, "ready")))
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, "\n".join(x for x in lines if len(x) > width)
    words = {w for line in lines for w in line.split()}
    for sentence in PROSE:
        for word in sentence.split():
            assert word in words, f"{word!r} cut across lines:\n{text}"
    for number in ("12,345,678", "12,346,689", "123,456,789", "370,368/s", "1,000", "12,345", "1234574"):
        assert number in words or number in text, f"{number} cut:\n{text}"
    for header in ("worker", "pid", "state", "records", "ring", "beat", "restarts", "committed", "lag"):
        assert header in words, f"header {header!r} cut:\n{text}"


def test_a_long_sentence_never_widens_the_view_piped_it_stays_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    path.write_text(json.dumps(_realistic(PROSE[0])))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = cli("status", "-c", str(config(tmp_path, path)), env=env)
    assert r.returncode == 0, r.stderr
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("last reload:")]
    assert PROSE[0].strip() in line, "not a terminal: a sentence stays whole on its line"
    others = [x for x in r.stdout.splitlines() if not x.startswith("last reload:")]
    assert max(len(x) for x in others) < 140, "and widens nothing else"
