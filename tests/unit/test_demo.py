"""The commands scripts/demo prints can be pasted into a shell at the clone's root (issue 28:
they were printed without `ringmaster`)."""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _demo():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("demo_script", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_printed_command_is_the_command_run_with_the_clones_ringmaster() -> None:
    demo = _demo()
    config = ROOT / "run" / "demo" / "a config with spaces.toml"
    cmd = [str(demo.RINGMASTER), "run", "-c", str(config), "--until-caught-up", "--expect-records", "250000"]
    line = demo.shown(cmd)
    assert line.startswith("$ .venv/bin/ringmaster run -c ")
    words = shlex.split(line[2:])
    assert words == [".venv/bin/ringmaster", "run", "-c", "run/demo/a config with spaces.toml",
                     "--until-caught-up", "--expect-records", "250000"]
    assert [str(ROOT / w) if w.startswith((".venv", "run/")) else w for w in words] == cmd


def test_the_printed_command_runs_in_a_shell_at_the_clones_root() -> None:
    demo = _demo()
    line = demo.shown([str(demo.RINGMASTER), "--version"])
    done = subprocess.run(["bash", "-c", line[2:]], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "version" in done.stdout, done.stderr
