"""The control plane's fault matrix (tests/faults/operator_matrix.py), against the real broker,
real members and the real operator commands. Rows run a few at a time (they spend most of
their time waiting for group joins and commands), each judged on its own observation: every
member alive, every exit status, no record lost, no duplicate, every offset committed,
`pause` and `resume` working afterwards, what the logs say (and how often), and that no
client line or traceback reached the terminal."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from . import operator_drive as drive
from .operator_matrix import OPERATOR_FAULTS, REBALANCE_ROWS
from .parallel import observe_selected
from .protocols import with_variants

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(1200)]
RAW_CLIENT_LINE = re.compile(r"^%\d\|", re.M)
# Every row, and the rebalance rows again under the broker's other group protocol.
ROWS = with_variants(OPERATOR_FAULTS, REBALANCE_ROWS)
ROWS_BY_ID = {f.id: f for f in ROWS}
PROMPT_S = 30.0  # an operator command, Kafka round trips included, on a loaded 2-core machine


@pytest.fixture(scope="session")
def operator_observations(request: pytest.FixtureRequest, broker: Any,
                          tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield observe_selected(request, "test_operator_fault", ROWS_BY_ID, drive.run, broker.bootstrap,
                           tmp_path_factory, lambda f: f.driver == "unreachable_daemon")  # its own broker


def clean(text: str, what: str) -> None:
    assert not RAW_CLIENT_LINE.search(text), f"{what}: a raw librdkafka line reached the terminal"
    assert "Traceback" not in text and "internal error" not in text, f"{what}: a traceback:\n{text[-3000:]}"


@pytest.mark.parametrize("fault_id", [f.id for f in ROWS])
def test_operator_fault(fault_id: str, operator_observations: dict[str, Any]) -> None:
    obs = operator_observations[fault_id]
    if isinstance(obs, BaseException):
        raise obs
    f = obs.fault
    tail = "\n".join("\n".join(log.splitlines()[-25:]) for log in obs.logs)
    for ran in obs.commands:
        c = ran.command
        what = f"`ringmaster {' '.join(c.args)[:60]}`"
        assert ran.exit == c.exit, f"{what} exited {ran.exit}, expected {c.exit}:\n{ran.out}"
        for needle in c.says:
            assert needle in ran.out, f"{what} does not say {needle!r}:\n{ran.out}"
        for needle in c.says_not:
            assert needle not in ran.out, f"{what} says {needle!r}:\n{ran.out}"
        if c.stores is not None and ran.stored >= 0:
            assert (ran.stored > 0) == c.stores, f"{what} wrote {ran.stored} control record(s)"
        assert ran.seconds < PROMPT_S, f"{what} took {ran.seconds:.1f} s"
        clean(ran.out, what)
        if ran.exit != 0:
            assert len(ran.out.strip().splitlines()) == 1, f"{what}: one line, not:\n{ran.out}"
    for i, log in enumerate(obs.logs):
        clean(log, f"member {i}")
    assert not obs.shm_left, f"shared memory left behind by members that exited: {obs.shm_left}"
    CHECKS[f.driver](obs, tail)


def members(obs: drive.Observation, tail: str) -> None:
    f = obs.fault
    assert obs.alive_before_stop and all(obs.alive_before_stop), f"a member died:\n{tail}"
    assert obs.exits == [0] * len(obs.exits), f"exit statuses {obs.exits}:\n{tail}"
    assert obs.committed == obs.produced, f"committed {obs.committed}, produced {obs.produced}:\n{tail}"
    expected = {f"r{i}" for i in range(sum(obs.produced.values()))}
    lost = sorted(expected - set(obs.outputs))
    assert not lost, f"{len(lost)} record(s) lost: {lost[:10]}"
    duplicates = {k: n for k, n in obs.outputs.items() if n > 1}
    assert not duplicates, f"duplicates (a stable group and a fenced pause allow none): {duplicates}"
    for text, times in f.logged:
        for i, log in enumerate(obs.logs):
            said = log.count(text)
            assert said == times, f"member {i} says {text!r} {said} time(s), not {times}"
    sizes = [*obs.status_bytes, *obs.extra.get("status_bytes_while_paused", [])]
    assert max(sizes) <= f.max_status_bytes, f"status files of {sizes} bytes"
    if f.effect == "pauses":
        # Nothing past the start: a partition still empty when its first report came is
        # committed at its end, 0 (runtime/supervisor/partition/offsets.py start_at_end); a record
        # processed while paused would move it past 0.
        during = obs.extra["committed_while_paused"]
        assert all(offset <= 0 for offset in during.values()), f"committed while paused: {during}"


def unreachable_daemon(obs: drive.Observation, tail: str) -> None:
    members(obs, tail)
    waiting = obs.extra["waiting_lines"]
    assert obs.extra["alive_while_waiting"], "the daemon waits, it does not exit"
    assert len(waiting) <= 4, "5 s of waiting log at most a few lines:\n" + "\n".join(waiting)
    first = next(line for line in obs.logs[0].splitlines() if "cannot reach the Kafka cluster" in line)
    assert "bootstrap=127.0.0.1:" in first, first


def unreachable_batch(obs: drive.Observation, tail: str) -> None:
    assert obs.exits == [8], f"exit {obs.exits}:\n{tail}"
    assert obs.extra["seconds"] < drive.CONNECT_TIMEOUT_S + 25, obs.extra["seconds"]
    errors = [line for line in obs.logs[0].splitlines() if line.startswith("ringmaster: error:")]
    assert len(errors) == 1 and "127.0.0.1:" in errors[0] and "kafka.connect_timeout_s" in errors[0], tail
    assert len(obs.logs[0].splitlines()) <= 8, f"a few lines, not a flood:\n{tail}"


def unreachable_command(obs: drive.Observation, tail: str) -> None:
    (ran,) = obs.commands
    assert "127.0.0.1:" in ran.out and "kafka.connect_timeout_s" in ran.out, ran.out


CHECKS = {"members": members, "unreachable_daemon": unreachable_daemon,
          "unreachable_batch": unreachable_batch, "unreachable_command": unreachable_command}
assert set(CHECKS) == {f.driver for f in OPERATOR_FAULTS}


def test_every_row_has_a_distinct_when() -> None:
    whens = [f.when for f in OPERATOR_FAULTS]
    assert len(set(whens)) == len(whens)


def test_readme_table_matches_the_matrix() -> None:
    from .table import DOC, render_operator

    assert render_operator() in DOC.read_text(), \
        "docs/operations.md's table is stale: python -m tests.faults.table --write"
