"""`ringmaster spark ...` without the `spark` extra: one line naming the extra, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["in"]
[workers]
plugin = "workers.fingerprint"
[output]
topic = "out"
"""


def run_without(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with `module` shadowed by a package whose import fails as a missing one does."""
    fake = tmp_path / "hide" / module
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{module}'\", name={module!r})\n")
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "hide"), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "runtime.cli", "spark", *args, "-c", str(config)],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


@pytest.mark.parametrize(("module", "command"), [
    ("pyspark", "run"), ("pyspark", "backfill"), ("pyarrow", "backfill"),
])
def test_spark_commands_without_the_extra_say_how_to_install_it(tmp_path: Path, module: str,
                                                                command: str) -> None:
    r = run_without(module, tmp_path, command)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ringmaster: error: the Spark backend needs ")
    assert "pip install 'kafka-ringmaster[spark]'" in lines[0]


def test_an_unrelated_import_error_keeps_its_traceback(tmp_path: Path) -> None:
    r = run_without("rich", tmp_path, "backfill")
    assert r.returncode != 0
    assert "Traceback" in r.stderr and "No module named 'rich'" in r.stderr
