"""What `ringmaster run` prints at its end: the error once, as its last line (issue 28: the
"did not catch up" line came three times)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import runtime.supervisor.daemon.run as daemon
from runtime.cli import main
from runtime.errors import NotCaughtUp
from runtime.supervisor.control.signals import SignalQueue
from runtime.supervisor.daemon.run import RunResult

CONFIG = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["t"]
[workers]
plugin = "workers.enrich"
processes = 1
"""


def test_a_batch_run_that_did_not_catch_up_says_so_once(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    err = NotCaughtUp("--until-caught-up did not catch up: stopped by SIGTERM; 1 partition(s) left: t[0] ...")

    def fake_run(settings: Any, **_: Any) -> RunResult:
        import logging

        logging.getLogger("ringmaster.supervisor").info("supervisor stopped")
        return RunResult(err.exit_code, None, False, err)

    monkeypatch.setattr(daemon, "run_daemon", fake_run)
    monkeypatch.setattr(SignalQueue, "install", lambda self: self)  # the test process keeps its handlers
    result = CliRunner().invoke(main, ["run", "-c", str(config), "--until-caught-up", "--no-progress"])
    assert result.exit_code == NotCaughtUp.exit_code
    assert result.output.count("did not catch up") == 1, result.output
    assert result.output.rstrip().splitlines()[-1] == f"ringmaster: error: {err}"
