"""The operator commands never import the plugin: with a plugin that fails to import or hangs
at import (a bad deploy), `status`, `top`, `pause`, `resume`, `produce`, `tail`, `reload` and
`scale` finish promptly with their usual result (here without a broker: those that need the
cluster give up on it with exit 8, one line, not 3, and do not hang; `reload`/`scale` find no
daemon, exit 11). `run` and `check` still import it. The full story, against the real
broker and members, is the control-plane matrix (tests/faults/operator_matrix.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugins"
PROMPT_S = 20.0


def config(tmp_path: Path, plugin: str) -> Path:
    path = tmp_path / f"{plugin}.toml"
    status = tmp_path / "status.json"
    # A running daemon's snapshot: a live pid with its start time (status checks both).
    me = psutil.Process()
    status.write_text(json.dumps({"group": "g", "operator_pauses": [], "pid": me.pid,
                                  "started_at": me.create_time(), "ready": True}))
    path.write_text(f"""
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["events"]
connect_timeout_s = 1.0
[workers]
plugin = "{plugin}"
[supervisor]
status_file = "{status}"
""")
    return path


def cli(*args: str, timeout_s: float = PROMPT_S) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=timeout_s)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - started


@pytest.mark.parametrize("plugin", ["broken_import", "hangs_import"])
def test_status_never_imports_the_plugin(tmp_path: Path, plugin: str) -> None:
    code, out, _ = cli("status", "--json", "-c", str(config(tmp_path, plugin)))
    assert code == 0 and json.loads(out)["group"] == "g", out


@pytest.mark.parametrize("plugin", ["broken_import", "hangs_import"])
@pytest.mark.parametrize("command", ["pause", "resume"])
def test_pause_and_resume_never_import_the_plugin(tmp_path: Path, plugin: str, command: str) -> None:
    code, out, seconds = cli(command, "-c", str(config(tmp_path, plugin)))
    assert code == 8, f"the cluster, not the plugin, is what stops it here:\n{out}"
    assert out.count("\n") == 1 and "127.0.0.1:1" in out, out
    assert seconds < PROMPT_S


@pytest.mark.parametrize("plugin", ["broken_import", "hangs_import"])
@pytest.mark.parametrize(("command", "expected"), [
    (("produce", "--topic", "events", "x"), 8), (("tail", "--topic", "out", "--max", "1"), 8),
    (("reload",), 11), (("scale", "-n", "3"), 11)])
def test_the_other_operator_commands_never_import_the_plugin(tmp_path: Path, plugin: str,
                                                            command: tuple[str, ...], expected: int) -> None:
    code, out, seconds = cli(command[0], "-c", str(config(tmp_path, plugin)), *command[1:])
    assert code == expected, out
    assert out.count("\n") == 1, f"one line, no client noise:\n{out}"
    assert seconds < PROMPT_S


@pytest.mark.parametrize("plugin", ["broken_import", "hangs_import"])
def test_top_never_imports_the_plugin(tmp_path: Path, plugin: str) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]), FORCE_COLOR="1")
    out_path = tmp_path / "top.out"
    with open(out_path, "w") as out:
        cmd = [sys.executable, "-m", "runtime.cli", "top", "-c", str(config(tmp_path, plugin))]
        # Started with SIGINT ignored, as a script's background job is: Ctrl-C still leaves.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
        try:
            deadline = time.monotonic() + PROMPT_S
            while "ringmaster —" not in out_path.read_text(errors="replace"):
                assert proc.poll() is None and time.monotonic() < deadline, out_path.read_text()
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(PROMPT_S) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_check_still_imports_the_plugin(tmp_path: Path) -> None:
    code, out, _ = cli("check", "-c", str(config(tmp_path, "broken_import")))
    assert code == 3 and "a bad deploy" in out, out
