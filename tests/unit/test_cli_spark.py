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


# --- a batch run on Spark reports success only at the end (issue 28) ---------------------------

def test_a_batch_run_is_caught_up_only_when_the_group_committed_the_end_of_every_partition(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from test_spark_offsets import FakeClient

    import runtime.spark.job as job
    from runtime.config import load_settings
    from runtime.errors import NotCaughtUp

    settings = load_settings(None, env={"RINGMASTER__KAFKA__BOOTSTRAP_SERVERS": "x:1",
                                        "RINGMASTER__KAFKA__GROUP_ID": "g", "RINGMASTER__KAFKA__TOPICS": "in",
                                        "RINGMASTER__WORKERS__PLUGIN": "workers.enrich"}, check_plugin=False)
    client = FakeClient({"in": 2}, highs={}, commits={("in", 0): 8, ("in", 1): 3})
    monkeypatch.setattr(job, "driver_client", lambda s: client)
    target = {"in": {"0": 8, "1": 5}}
    err = job.caught_up(settings, target, None)
    assert isinstance(err, NotCaughtUp) and err.exit_code == 9
    assert "1 partition(s) left: in[1] committed up to offset 3 of 5 (2 records left)" in str(err)
    assert "in[0]" not in str(err)
    stopped = job.caught_up(settings, target, "SIGTERM")
    assert stopped is not None and "stopped by SIGTERM" in str(stopped)
    client.commits[("in", 1)] = 5
    assert job.caught_up(settings, target, None) is None


def test_spark_run_prints_a_summary_and_exits_9_short_of_the_end(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import runtime.spark.job as job
    from runtime.cli import main
    from runtime.errors import NotCaughtUp

    config = tmp_path / "c.toml"
    config.write_text(CONFIG.replace("workers.fingerprint", "workers.enrich"))
    outcome: list[job.StreamResult] = [job.StreamResult(16, 2)]
    monkeypatch.setattr(job, "run_stream", lambda settings: outcome[0])
    ok = CliRunner().invoke(main, ["spark", "run", "-c", str(config), "--until-caught-up"])
    assert ok.exit_code == 0
    assert ok.output.strip().splitlines()[-1] == \
        "spark run: 16 record(s) in 2 micro-batch(es); caught up: the group committed the end of every " \
        "partition"
    outcome[0] = job.StreamResult(13, 2, NotCaughtUp("--until-caught-up did not catch up: ...; in[1] ..."))
    short = CliRunner().invoke(main, ["spark", "run", "-c", str(config), "--until-caught-up"])
    assert short.exit_code == 9
    lines = short.output.strip().splitlines()
    assert lines[-2] == "spark run: 13 record(s) in 2 micro-batch(es)"
    assert lines[-1].startswith("ringmaster: error: --until-caught-up did not catch up")
