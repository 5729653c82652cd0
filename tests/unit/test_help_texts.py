"""Every exit status a ``--help`` text, a config description or the operations page names is
the one the code exits with: the codes are read from runtime/errors.py's tables (and its
classes), not copied."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import runtime.errors as errors
from runtime.cli import main
from runtime.config import KafkaSettings, SupervisorSettings, WorkerSettings

ROOT = Path(__file__).resolve().parents[2]


def _tables() -> dict[str, dict[int, str]]:
    """errors.py's docstring tables: the command they are for -> {code: meaning}."""
    doc = errors.__doc__ or ""
    out: dict[str, dict[int, str]] = {}
    for head, body in re.findall(r"Exit codes of (.+?):\n\n=+\s+=+\n(.*?)\n=+\s+=+", doc, re.S):
        rows = {int(m.group(1)): m.group(2) for m in re.finditer(r"^(\d+)\s+(.*)$", body, re.M)}
        for command in re.findall(r"``ringmaster (\w+)``", head):
            out[command] = rows
    return out


TABLES = _tables()


def _help(*args: str) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    return result.output


def _epilog_codes(text: str) -> set[int]:
    block = text.split("Exit status:" if "Exit status:" in text else "Exit codes:", 1)[1]
    return {int(m) for m in re.findall(r"^\s+(\d+)\s", block.split("\n\n")[0], re.M)}


def _classes() -> list[type[errors.RingmasterError]]:
    return [c for c in vars(errors).values()
            if isinstance(c, type) and issubclass(c, errors.RingmasterError) and "exit_code" in vars(c)]


def test_the_tables_in_errors_py_are_read() -> None:
    assert set(TABLES) == {"run", "redrive", "reload", "scale"}
    assert TABLES["run"][errors.NotCaughtUp.exit_code].startswith("``--until-caught-up`` ended before")


def test_every_exit_code_class_of_run_is_in_the_run_table_with_its_number() -> None:
    for cls in (errors.ConfigError, errors.PluginError, errors.SharedMemoryError, errors.KafkaError,
                errors.KafkaUnreachable, errors.WorkerCrashLoop, errors.PartitionsBlocked, errors.NotCaughtUp,
                errors.AdminListenFailed, errors.KafkaAccessRefused):
        assert cls.exit_code in TABLES["run"], cls.__name__
    assert {c.exit_code for c in _classes()} <= set(TABLES["run"]) | set(TABLES["reload"])


@pytest.mark.parametrize("command, table", [(("run",), "run"), (("redrive",), "redrive"),
                                            (("reload",), "reload"), (("scale",), "scale")])
def test_the_exit_status_list_of_each_help_is_the_table_of_errors_py(command: tuple[str, ...],
                                                                    table: str) -> None:
    assert _epilog_codes(_help(*command)) == set(TABLES[table])


def test_run_help_says_the_exit_status_the_code_has_for_each_outcome() -> None:
    text = " ".join(_help("run").split())
    assert f"Exit {errors.NotCaughtUp.exit_code} (one line says what is left)" in text
    assert f"exit {errors.PartitionsBlocked.exit_code} if partitions are blocked" in text
    # every "exit N" in the prose is one of run's codes
    for n in re.findall(r"\b[Ee]xit (\d+)", text):
        assert int(n) in TABLES["run"], n


def test_run_help_says_what_hup_ttin_and_ttou_do() -> None:
    text = " ".join(_help("run").split())
    assert "change nothing" not in text
    assert "HUP reloads the plugin" in text and "TTIN and TTOU add and remove one worker" in text


def _walk(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = []
    for name, cmd in group.commands.items():
        found.append((*prefix, name))
        if isinstance(cmd, click.Group):
            found.extend(_walk(cmd, (*prefix, name)))
    return found


@pytest.mark.parametrize("command", _walk(main))
def test_every_exit_status_a_help_names_exists(command: tuple[str, ...]) -> None:
    known = {0, 1} | {c.exit_code for c in _classes()}
    for n in re.findall(r"\b[Ee]xit (?:status:? )?(\d+)", " ".join(_help(*command).split())):
        assert int(n) in known, (command, n)


def test_config_descriptions_name_the_exit_codes_of_errors_py() -> None:
    caught_up = SupervisorSettings.model_fields["caught_up_timeout_s"].description or ""
    assert f"exit {errors.NotCaughtUp.exit_code}" in caught_up
    connect = KafkaSettings.model_fields["connect_timeout_s"].description or ""
    assert f"exit {errors.KafkaUnreachable.exit_code}" in connect
    attempts = WorkerSettings.model_fields["start_attempts"].description or ""
    assert f"exit {errors.PluginError.exit_code}" in attempts


def test_the_operations_page_lists_the_run_table() -> None:
    page = (ROOT / "docs" / "operations.md").read_text()
    section = page.split("## Exit codes", 1)[1].split("`ringmaster reload` and", 1)[0]
    assert {int(n) for n in re.findall(r"^\| (\d+) \|", section, re.M)} == set(TABLES["run"])


def test_the_systemd_unit_names_the_codes_of_errors_py() -> None:
    unit = (ROOT / "config" / "ringmaster.service").read_text()
    assert f"fails the systemctl call (exit {errors.CommandFailed.exit_code})" in unit
    prevent = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert prevent and set(prevent.group(1).split()) == {str(errors.ConfigError.exit_code),
                                                        str(errors.PluginError.exit_code),
                                                        str(errors.KafkaAccessRefused.exit_code)}
