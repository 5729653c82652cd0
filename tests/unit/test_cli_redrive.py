"""`ringmaster redrive`: options a user gets wrong are one line and exit 2, before anything
touches Kafka; --help documents every option and the exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from runtime.cli import main


def config(tmp_path: Path, dead_letter: bool = True) -> str:
    path = tmp_path / "c.toml"
    path.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:9"\ngroup_id = "g"\ntopics = ["in"]\n'
                    '[workers]\nplugin = "not.importable.here"\n'
                    + ('[dead_letter]\ntopic = "dlq"\n' if dead_letter else ""))
    return str(path)


@pytest.mark.parametrize(("args", "dead_letter", "message"), [
    ([], False, "redrive needs [dead_letter] topic"),
    (["--from", "yesterday"], True, "--from 'yesterday': expected an offset"),
    (["--to", "1:2,1:3"], True, "--to '1:2,1:3': a partition is given twice"),
    (["--rate", "0"], True, "--rate must be"),
    (["--max-redrives", "0"], True, "--max-redrives must be from 1"),
    # Numbers out of every Kafka type's range (issue 29): exit 2 with one line, never a traceback.
    (["--from", "9" * 5000], True, "is not an offset (0 to 2**63-1"),
    (["--to", f"{2**32}:5"], True, "is not a partition (0 to 2**31-1"),
    (["--from", "9" * 5000 + "s"], True, "expected an offset"),
    (["--max-redrives", str(2**40)], True, "--max-redrives must be from 1"),
    (["--rate", "1e400"], True, "--rate must be"),
    (["--rate", "nan"], True, "--rate must be"),
])
def test_a_bad_option_is_one_line_and_exit_2_before_kafka(tmp_path: Path, args: list[str], dead_letter: bool,
                                                          message: str) -> None:
    result = CliRunner().invoke(main, ["redrive", "-c", config(tmp_path, dead_letter), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and result.output.count("\n") == 1


def test_to_the_source_the_plugin_need_not_import_here_but_through_it_it_must(tmp_path: Path) -> None:
    through = CliRunner().invoke(main, ["redrive", "-c", config(tmp_path), "--through-plugin"])
    assert through.exit_code == 3 and "cannot import 'not.importable.here'" in through.output
    to_source = CliRunner().invoke(main, ["redrive", "-c", config(tmp_path), "--from", "nonsense"])
    assert to_source.exit_code == 2, "got past the plugin check: to the source needs no plugin"


def test_help_documents_every_option_and_the_exit_codes() -> None:
    text = CliRunner().invoke(main, ["redrive", "--help"]).output
    for option in ("--from", "--to", "--error-type", "--rate", "--max-redrives", "--to-source",
                   "--through-plugin", "--dry-run", "--json", "--group"):
        assert option in text
    for code in ("0  done", "2  invalid", "3  --through-plugin", "5  Kafka", "9  stopped"):
        assert code in text
