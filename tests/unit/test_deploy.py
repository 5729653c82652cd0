"""The deployment files work as shipped: the Procfile's commands run from a clean clone's
root with the project's virtualenv and nothing on PATH; the systemd unit is valid
(systemd-analyze), creates and keeps the directory of the example status file, does not
restart on exit codes 2 and 3, and says truthfully what PrivateTmp= covers."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "config" / "ringmaster.service"


def procfile() -> dict[str, tuple[dict[str, str], list[str]]]:
    """name -> (environment it sets, argv)."""
    out = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, command = line.partition(":")
        argv = shlex.split(command)
        env = {}
        if argv[0] == "env":
            argv.pop(0)
            while "=" in argv[0]:
                key, _, value = argv.pop(0).partition("=")
                env[key] = value
        out[name.strip()] = (env, argv)
    return out


def test_the_procfile_runs_the_projects_virtualenv_not_whatever_is_on_path() -> None:
    entries = procfile()
    assert set(entries) == {"broker", "supervisor"}
    for _name, (_env, argv) in entries.items():
        assert argv[0] == ".venv/bin/ringmaster", f"{argv[0]} would need the virtualenv on PATH"
        assert (ROOT / argv[0]).exists()


@pytest.mark.parametrize("name", ["broker", "supervisor"])
def test_each_procfile_command_starts_from_the_repository_root_with_a_bare_path(name: str) -> None:
    env, argv = procfile()[name]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RINGMASTER__", "VIRTUAL_ENV"))}
    base.update(env, PATH="/usr/bin:/bin")
    # The daemon's config must be valid and its plugin importable: check it; the rest, --help.
    argv = [argv[0], "check", "--shallow", *argv[2:]] if argv[1] == "run" else [*argv, "--help"]
    r = subprocess.run(argv, cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    if name == "supervisor":
        assert '"session.timeout.ms": "6000"' in r.stdout, "the fast joins reach the consumer"


def unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_creates_and_keeps_the_directory_of_the_example_status_file() -> None:
    example = re.search(r'status_file = "([^"]+)"', (ROOT / "config" / "ringmaster.toml").read_text())
    assert example is not None
    service = unit()["Service"]
    assert Path(example.group(1)).parent == Path("/run") / service["RuntimeDirectory"]
    assert service["RuntimeDirectoryPreserve"] == "yes", "the final status must outlive the stop"
    assert set(service["RestartPreventExitStatus"].split()) == {"2", "3", "14"}


def test_the_unit_says_what_private_tmp_covers() -> None:
    lines = UNIT.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("PrivateTmp="))
    above = []
    while at > 0 and lines[at - 1].startswith("#"):
        at -= 1
        above.insert(0, lines[at])
    comment = " ".join(line.lstrip("# ") for line in above)
    assert "/tmp and /var/tmp only" in comment
    assert not re.search(r"/dev/shm[^.]*private", comment), "PrivateTmp= does not make /dev/shm private"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_unit_is_valid_for_systemd(tmp_path: Path) -> None:
    ours = str(ROOT / ".venv" / "bin" / "ringmaster")
    text = UNIT.read_text().replace("/opt/ringmaster/.venv/bin/ringmaster", ours)
    copy = tmp_path / "ringmaster.service"
    copy.write_text(text)
    r = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (r.stdout + r.stderr).splitlines() if "ringmaster.service" in line]
    assert r.returncode == 0 and not problems, r.stdout + r.stderr
