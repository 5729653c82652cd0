"""What a newcomer reads is true (issue 43, point 3): the help texts say what the commands do
(exit 8 for batch runs only, check not contacting the cluster unless --connect, tail's isolation
level), `top` without a terminal prints one view, `run --progress` without a terminal writes
progress lines, the exactly-once summary has each partition's committed offset, exactly-once on
the development broker is refused in one line."""

from __future__ import annotations

import io
import json
import os
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console
from test_status_file import snapshot
from test_views import snapshot as view_snapshot

from runtime.cli.app import main
from runtime.ops.cluster import TANSU_CLUSTER_ID, cluster_problem
from runtime.ops.progress import ProgressDisplay, summary_table
from runtime.ops.status import Stopped, process_started_at


def help_of(*command: str) -> str:
    result = CliRunner().invoke(main, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def test_the_help_texts_say_what_the_commands_do() -> None:
    run = help_of("run")
    assert "8 --until-caught-up: the cluster did not answer within kafka.connect_timeout_s; a daemon waits " \
        "for it as long as it takes" in run
    assert "the control socket's directory is another user's or not private" in run, "exit 4's cases"
    check = help_of("check")
    assert "It does not contact the Kafka cluster unless --connect is given" in check
    assert "read_committed" in help_of("tail")
    assert "prints the view once and exits" in help_of("top")


def test_top_without_a_terminal_prints_one_view(tmp_path: Path) -> None:
    status = tmp_path / "status.json"
    status.write_text(json.dumps(view_snapshot(os.getpid(), process_started_at())))
    config = tmp_path / "c.toml"
    config.write_text(f'[kafka]\nbootstrap_servers = "x:1"\ngroup_id = "g"\ntopics = ["in"]\n'
                      f'[workers]\nplugin = "workers.enrich"\n[supervisor]\nstatus_file = "{status}"\n')
    result = CliRunner().invoke(main, ["top", "-c", str(config)])
    assert "a-rather-long-topic-name-for-orders[0]" in result.output, result.output
    assert result.exit_code == 0


def test_progress_without_a_terminal_is_a_line_every_so_often() -> None:
    out = io.StringIO()
    clock = [0.0]
    display = ProgressDisplay(100, Console(file=out, force_terminal=False), clock=lambda: clock[0])
    live = snapshot(records=10, stopped=None)
    display.update(live)
    clock[0] += 1
    display.update(live)  # within LINE_EVERY_S: no line
    clock[0] += ProgressDisplay.LINE_EVERY_S
    display.update(replace(live, records=50))
    display.update(replace(live, records=100, stopped=Stopped(0, "caught up")))  # the last at once
    lines = out.getvalue().splitlines()
    assert [line.split(" records done")[0] for line in lines] == [
        "progress: 10 of 100", "progress: 50 of 100", "progress: 100 of 100"]
    display.close()


def test_the_exactly_once_summary_has_each_partitions_committed_offset() -> None:
    snap = snapshot(committed={}, transactions_committed=3, transactions_aborted=1)
    out = io.StringIO()
    Console(file=out, width=200).print(summary_table(snap))
    text = out.getvalue()
    assert "committed in[0]" in text and "(in the workers' transactions)" in text
    assert "3 committed, 1 aborted" in text


def test_exactly_once_on_the_development_broker_is_refused_in_one_line() -> None:
    from fakes import settings

    s = settings()
    eo = s.model_copy(update={"output": s.output.model_copy(update={"guarantee": "exactly-once"})})
    problem = cluster_problem(eo, TANSU_CLUSTER_ID)
    assert problem is not None and "Tansu" in problem and "\n" not in problem
    assert cluster_problem(eo, "kafka-cluster-id") is None
    assert cluster_problem(s, TANSU_CLUSTER_ID) is None, "at-least-once runs there"
