from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.config import consumer_properties, load_settings, redacted
from runtime.errors import ConfigError, PluginError

GOOD = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["in"]
[kafka.consumer]
"sasl.password" = "hunter2"
[workers]
plugin = "workers.fingerprint"
processes = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_good_config_and_defaults(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD), env={})
    assert s.workers.processes == 2
    assert s.workers.pause_above > s.workers.resume_below
    props = consumer_properties(s)
    assert props["enable.auto.commit"] is False
    assert props["partition.assignment.strategy"] == "cooperative-sticky"


def test_env_overrides(tmp_path: Path) -> None:
    env = {"RINGMASTER__WORKERS__PROCESSES": "5",
           "RINGMASTER__KAFKA__CONSUMER__FETCH_MAX_BYTES": "1048576",
           "RINGMASTER__OUTPUT__TOPIC": "out"}
    s = load_settings(write(tmp_path, GOOD), env=env)
    assert s.workers.processes == 5
    assert s.kafka.consumer["fetch.max.bytes"] == 1048576
    assert s.output.topic == "out"


def test_secrets_are_redacted(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD), env={})
    assert redacted(s)["kafka"]["consumer"]["sasl.password"] == "***"
    assert "hunter2" not in str(redacted(s))


@pytest.mark.parametrize(("text", "needle"), [
    (GOOD.replace('group_id = "g"\n', ""), "kafka.group_id: required key is missing"),
    (GOOD.replace("processes = 2", 'processes = "two"'), "workers.processes"),
    (GOOD + "colour = 'blue'\n", "workers.colour: unknown key"),
    (GOOD.replace('"workers.fingerprint"', '"no.such.module"'), "cannot import 'no.such.module'"),
    ("this is [not toml", "is not valid TOML"),
    (GOOD.replace("processes = 2", "processes = 2\npause_above = 0.3\nresume_below = 0.5"), "hysteresis"),
    (GOOD.replace('"sasl.password" = "hunter2"', '"enable.auto.commit" = true'), "managed by ringmaster"),
])
def test_bad_config_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises((ConfigError, PluginError)) as info:
        load_settings(write(tmp_path, text), env={})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", [
    GOOD.replace('topics = ["in"]\n', ""),
    GOOD.replace('"workers.fingerprint"', '"workers.nope"'),
    "[kafka\n",
])
def test_cli_bad_config_one_line_nonzero_exit_before_kafka(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "-c", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ringmaster: error: ")
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30  # the broker 127.0.0.1:1 was never contacted


def test_cli_check_prints_effective_config_redacted(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", "-c", str(write(tmp_path, GOOD))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '"sasl.password": "***"' in r.stdout and "hunter2" not in r.stdout


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})
