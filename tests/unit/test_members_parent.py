"""``ringmaster run --members``: the parent's rules, on fake member processes (the real ones are
tests/integration/test_members.py): the worker budget's split, which member a TTIN or TTOU
moves, and when a member's exit stops the others and what the parent exits with."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from fakes import settings

from runtime.cli import main
from runtime.errors import ConfigError
from runtime.supervisor.control.signals import SignalQueue
from runtime.supervisor.daemon.members import Members, budget, exit_status, split

CONFIG = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["t"]
[workers]
plugin = "workers.enrich"
processes = 1
"""

SENT_TO: list[FakeProc] = []  # every member a signal was sent to, in order


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sent: list[int] = []

    def send_signal(self, sig: int) -> None:
        self.sent.append(sig)
        SENT_TO.append(self)


def members(n: int, until_caught_up: bool = False, **workers: Any) -> Members:
    SENT_TO.clear()
    m = Members(settings(**workers), "/x.toml", n, until_caught_up, False, None)
    m.procs = [FakeProc(100 + i) for i in range(n)]  # type: ignore[misc]
    return m


def sent(m: Members) -> list[list[int]]:
    return [p.sent for p in m.procs]  # type: ignore[attr-defined]


def test_the_budget_splits_evenly_the_first_members_taking_the_remainder() -> None:
    assert split(7, 2) == [4, 3]
    assert split(8, 3) == [3, 3, 2]
    assert split(2, 2) == [1, 1]
    b = budget(settings(processes=5, max_processes=9), 2)
    assert (b.processes, b.max_processes) == ([3, 2], [5, 4])
    assert budget(settings(processes=4), 2).max_processes == [0, 0]  # 0: each its own processes


def test_a_member_never_gets_a_max_below_its_processes() -> None:
    for n in range(1, 9):
        for p in range(n, 20):
            for mx in range(p, 24):
                b = budget(settings(processes=p, max_processes=mx), n)
                assert all(m >= q >= 1 for m, q in zip(b.max_processes, b.processes, strict=True))
                assert sum(b.processes) == p and sum(b.max_processes) == mx


def test_fewer_workers_than_members_is_a_config_error_naming_both_keys() -> None:
    with pytest.raises(ConfigError, match=r"workers.processes \(1\) is fewer than supervisor.members \(2\)"):
        budget(settings(processes=1), 2)


def test_ttin_and_ttou_move_one_worker_round_robin_from_the_smaller_members() -> None:
    m = members(3, processes=4)  # split 2, 1, 1: the next worker goes to member 1
    for _ in range(4):
        m.on_signal(signal.SIGTTIN)
    assert [p.pid - 100 for p in SENT_TO] == [1, 2, 0, 1]
    m = members(3, processes=4)
    m.on_signal(signal.SIGTTIN)
    assert sent(m) == [[], [signal.SIGTTIN], []]
    m.on_signal(signal.SIGTTOU)  # takes back the one just added
    assert sent(m) == [[], [signal.SIGTTIN, signal.SIGTTOU], []]
    m.on_signal(signal.SIGTTOU)  # then from the member before it: the one with the remainder
    assert sent(m) == [[signal.SIGTTOU], [signal.SIGTTIN, signal.SIGTTOU], []]


def test_stop_hup_and_usr1_reach_every_member_and_a_stop_is_sent_once() -> None:
    m = members(2, processes=2)
    m.on_signal(signal.SIGHUP)
    m.on_signal(signal.SIGUSR1)
    m.on_signal(signal.SIGINT)
    m.on_signal(signal.SIGTERM)
    assert sent(m) == [[signal.SIGHUP, signal.SIGUSR1, signal.SIGTERM]] * 2
    m.on_signal(signal.SIGUSR2)  # ignored
    assert len(sent(m)[0]) == 3


def test_a_member_that_fails_stops_the_others_and_its_status_is_the_parents() -> None:
    m = members(3, processes=3)
    m.on_exit(1, -signal.SIGKILL)
    assert m.stopping and sent(m) == [[signal.SIGTERM], [], [signal.SIGTERM]]
    m.on_exit(0, 0)
    m.on_exit(2, 9)  # stopped by the parent, not caught up: the first failure stays
    assert m.first_failure == 128 + signal.SIGKILL == exit_status(-signal.SIGKILL)


def test_a_daemon_member_that_stops_by_itself_stops_the_rest_with_status_0() -> None:
    m = members(2, processes=2)
    m.on_exit(0, 0)
    assert m.stopping and sent(m) == [[], [signal.SIGTERM]] and m.first_failure is None


def test_until_caught_up_a_member_done_leaves_the_others_running_and_any_failure_counts() -> None:
    m = members(2, until_caught_up=True, processes=2)
    m.on_exit(0, 0)
    assert not m.stopping and sent(m) == [[], []]
    m.on_exit(1, 9)
    assert m.first_failure == 9


FEWER = "workers.processes (1) is fewer than supervisor.members"


@pytest.mark.parametrize(("args", "env", "says"), [
    (["--members", "2"], {}, f"{FEWER} (2)"),
    ([], {"RINGMASTER__SUPERVISOR__MEMBERS": "3"}, f"{FEWER} (3)"),
    (["--members", "2", "--progress"], {"RINGMASTER__WORKERS__PROCESSES": "2"},
     "--progress draws one daemon"),
])
def test_a_members_run_the_parent_refuses_says_one_line_exit_2_and_starts_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str],
        says: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    started: list[Any] = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    monkeypatch.setattr(SignalQueue, "install", lambda self: self)  # the test process keeps its handlers
    result = CliRunner().invoke(main, ["run", "-c", str(config), "--no-progress", *args]
                                if "--progress" not in args else ["run", "-c", str(config), *args])
    assert result.exit_code == ConfigError.exit_code, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ringmaster: error: {says}"), result.output
    assert started == []


def test_the_parent_counts_every_members_rings_against_shm_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.supervisor.daemon.members as members_mod
    from runtime.supervisor.daemon.run import shm_needed

    s = settings(processes=4)
    need = shm_needed(s, 3) * 2  # 2 members of 2 workers, each with room for a reload's extra one
    monkeypatch.setattr(members_mod, "free_bytes", lambda _d: need)
    assert members_mod.shm_problem(s, [2, 2]) is None
    monkeypatch.setattr(members_mod, "free_bytes", lambda _d: need - 1)
    problem = members_mod.shm_problem(s, [2, 2])
    assert problem is not None and "2 members' rings need" in problem
    assert shm_needed(s, 3) <= need - 1, "each member alone would have fitted"
