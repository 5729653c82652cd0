"""`ringmaster check` starts the plugin the way the daemon's workers do (import, setup(),
teardown() in a throw-away worker, bounded by workers.setup_timeout_s), and reports a
plugin that cannot start in one line with exit 3; `--shallow` only imports it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CONFIG = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["in"]
[workers]
plugin = "{plugin}"
setup_timeout_s = {timeout}
start_method = "{method}"
[workers.settings]
model_path = "{model}"
"""

PLUGINS = {
    "fine": """
        import json
        def setup(context):
            global model
            with open(context.settings["model_path"]) as f:
                model = json.load(f)
        def process(batch):
            return [model["prefix"] + r.value for r in batch]
        def teardown():
            pass
    """,
    "undefined_name": """
        def setup(context):
            global model
            model = load_model(context.settings["model_path"])
        def process(batch):
            return None
    """,
    "raises_in_setup": """
        def setup(context):
            raise RuntimeError("the scoring service is not reachable")
        def process(batch):
            return None
    """,
    "exits_in_setup": """
        import sys
        def setup(context):
            sys.exit(4)
        def process(batch):
            return None
    """,
    "hangs_in_setup": """
        import time
        def setup(context):
            time.sleep(600)
        def process(batch):
            return None
    """,
    "crashes_in_setup": """
        import os, signal
        def setup(context):
            os.kill(os.getpid(), signal.SIGSEGV)
        def process(batch):
            return None
    """,
    "teardown_raises": """
        def process(batch):
            return None
        def teardown():
            raise ValueError("closing twice")
    """,
}


def check(tmp_path: Path, plugin: str, *args: str, timeout: float = 20, method: str = "spawn"
          ) -> subprocess.CompletedProcess[str]:
    (tmp_path / f"{plugin}.py").write_text(textwrap.dedent(PLUGINS[plugin]))
    (tmp_path / "model.json").write_text('{"prefix": "scored:"}')
    cfg = tmp_path / "c.toml"
    cfg.write_text(CONFIG.format(plugin=plugin, timeout=timeout, method=method,
                                 model=tmp_path / "model.json"))
    return subprocess.run([sys.executable, "-m", "runtime.cli", "check", "-c", str(cfg), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)


def last_line(r: subprocess.CompletedProcess[str]) -> str:
    return r.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_plugin_whose_setup_works_passes(tmp_path: Path, method: str) -> None:
    r = check(tmp_path, "fine", method=method)
    assert r.returncode == 0, r.stderr
    assert "plugin 'fine' starts in a worker" in r.stderr and "teardown() ran" in r.stderr


@pytest.mark.parametrize(("plugin", "needle"), [
    ("undefined_name", "setup() failed: NameError: name 'load_model' is not defined"),
    ("raises_in_setup", "setup() failed: RuntimeError: the scoring service is not reachable"),
    ("exits_in_setup", "setup() called sys.exit(4)"),
    ("crashes_in_setup",
     "the worker died (killed by SIGSEGV) while importing the plugin or running its setup()"),
])
def test_a_plugin_that_cannot_start_fails_check_in_one_line_with_exit_3(tmp_path: Path, plugin: str,
                                                                         needle: str) -> None:
    r = check(tmp_path, plugin)
    assert r.returncode == 3, r.stderr
    line = last_line(r)
    assert line.startswith("ringmaster: error: workers.plugin: the plugin cannot start: "), line
    assert needle in line, line
    assert "Traceback" not in r.stderr


def test_a_setup_that_hangs_fails_check_after_setup_timeout_s(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = check(tmp_path, "hangs_in_setup", timeout=2)
    took = time.monotonic() - t0
    assert r.returncode == 3, r.stderr
    assert "did not finish import and setup() within 2 s (workers.setup_timeout_s)" in last_line(r)
    assert took < 60, "bounded by the timeout, not by the plugin"


def test_a_teardown_that_raises_is_a_warning_as_in_the_daemon(tmp_path: Path) -> None:
    r = check(tmp_path, "teardown_raises")
    assert r.returncode == 0, r.stderr
    assert "warning: teardown() failed: ValueError: closing twice" in r.stderr


def test_shallow_only_imports_the_plugin(tmp_path: Path) -> None:
    r = check(tmp_path, "undefined_name", "--shallow")
    assert r.returncode == 0, r.stderr
    assert "starts in a worker" not in r.stderr
