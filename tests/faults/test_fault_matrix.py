"""The fault matrix (tests/faults/matrix.py), against the real broker and real processes.

Rows are independent (own topics, group, directories) and spend most of their time waiting
(group joins, restarts, back-offs), so the selected rows run a few at a time in a thread
pool, once per session; each row is still its own test, judged on its own observation.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import journal

from . import drive
from .matrix import BY_ID, FAULTS, Fault

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]
PARALLEL = int(os.environ.get("RINGMASTER_MATRIX_PARALLEL", "4"))


@pytest.fixture(scope="session")
def observations(request: pytest.FixtureRequest, broker: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    selected = [item.callspec.params["fault_id"] for item in request.session.items
                if item.originalname == "test_fault" and hasattr(item, "callspec")]
    results: dict[str, Any] = {}
    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        futures = {pool.submit(drive.run, BY_ID[fid], broker.bootstrap, tmp_path_factory.mktemp(fid)): fid
                   for fid in selected}
        for fut in concurrent.futures.as_completed(futures):
            fid = futures[fut]
            try:
                results[fid] = fut.result()
            except BaseException as exc:  # reported by that row's test
                results[fid] = exc
    yield results


def ident(value: bytes | None) -> str:
    text = (value or b"").decode(errors="replace").split("#", 1)[0]
    return text.split(":", 1)[1] if ":" in text else text


@pytest.mark.parametrize("fault_id", [f.id for f in FAULTS])
def test_fault(fault_id: str, observations: dict[str, Any]) -> None:
    obs = observations[fault_id]
    if isinstance(obs, BaseException):
        raise obs
    f: Fault = obs.fault
    tail = "\n".join(obs.log.splitlines()[-40:])
    assert obs.exit == f.exit, f"exit {obs.exit}, expected {f.exit}:\n{tail}"
    for needle in f.log:
        assert needle in obs.log, f"the log does not say {needle!r}:\n{tail}"
    dead = {ident(m.value()): dict(m.headers() or [])["ringmaster.error.type"].decode() for m in obs.dead}
    assert dead == dict(f.dead), f"dead letters {dead}, expected {dict(f.dead)}:\n{tail}"
    if f.exit == 0:
        assert obs.committed == obs.counts, f"committed {obs.committed}, produced {obs.counts}:\n{tail}"
        outputs = {b["id"] for b in obs.bodies()}
        expected = {ident(v) for v in obs.values} - set(f.dead) - f.no_output
        assert outputs == expected, (f"outputs missing {sorted(expected - outputs)[:10]}, "
                                     f"unexpected {sorted(outputs - expected)[:10]}:\n{tail}")
    if f.check:
        CHECKS[f.check](obs)


# ---------------------------------------------------------------------------- extra checks
def null_and_empty(obs: drive.Observation) -> None:
    assert len(obs.outputs) == obs.fault.n, "one output per record, empty and null ones included"
    keys = Counter(m.key() for m in obs.outputs)
    assert keys[None] and keys[b""] and keys[b"k"], f"keys kept as they were: {keys}"


def dead_letter_keeps_headers(obs: drive.Observation) -> None:
    (m,) = obs.dead
    h = m.headers()
    originals = [(k, v) for k, v in h if not k.startswith("ringmaster.")]
    assert len(originals) == 2000 and originals[7] == ("h7", b"\xff\xfe\x00\x07"), originals[:3]


def dead_letter_truncated(obs: drive.Observation) -> None:
    (m,) = obs.dead
    h = dict(m.headers())
    original = int(h["ringmaster.value.truncated"])
    assert original > len(m.value()) and len(m.value()) > 1000, (original, len(m.value()))
    assert h["ringmaster.source.offset"], "where the record is stays in the headers"


def exactly_once(obs: drive.Observation) -> None:
    ids = Counter(b["id"] for b in obs.bodies())
    assert ids["r5"] == 1 and len(obs.outputs) == obs.fault.n, ids.most_common(3)


def children_gone(obs: drive.Observation) -> None:
    pids = [int(p.read_text()) for p in obs.dirs["pids"].glob("*.pid")]
    assert pids, "the plugin started a child"
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes started by the plugin outlived the daemon: {alive}"


def blocked_at_failure(obs: drive.Observation) -> None:
    """Record 21 is partition 1, offset 10 (round-robin over 2): nothing from it on is
    committed or output; partition 0 is processed to its end."""
    assert obs.committed[0] == obs.counts[0]
    assert obs.committed[1] <= 10, obs.committed  # negative: nothing committed
    late = [b for b in obs.bodies() if b["p"] == 1 and b["o"] > 10]
    assert not late, f"records after the failing one were processed: {late[:3]}"
    assert "exit" not in obs.log or "partition(s) stopped at a failing record" in obs.log
    assert obs.status and [p["tp"] for p in obs.status["partitions"] if p["blocked"]] == \
        [f"{obs.names['in']}[1]"], "the status names the blocked partition"


def routed(obs: drive.Observation) -> None:
    got = {json.loads(m.value())["id"] for m in obs.extra["routed"]}
    assert got == {f"r{i}" for i in range(0, 40, 5)}, got


def discarded_counted(obs: drive.Observation) -> None:
    assert obs.status is not None, "a final status was written"
    assert obs.status["discarded"] == obs.fault.n, obs.status["discarded"]


def outage_recovered(obs: drive.Observation) -> None:
    during = obs.extra["during"]
    assert not obs.extra["dead_during"], "records were dead-lettered because of an outage"
    assert obs.extra["committed_during"] != obs.counts, "offsets committed while outputs were not delivered"
    holds = [p["holds"].get("delivery", "") for p in during["partitions"]]
    assert any(holds), f"the status shows why partitions wait: {during['partitions']}"
    assert "WorkerCrashed" not in obs.log


def in_order_once_backed_off(obs: drive.Observation) -> None:
    offsets = [off for _ns, _part, off, _pid in journal(obs.dirs["journal"])]
    assert offsets == sorted(offsets), "after a back-off the partition goes on in order"
    assert "batch deferred" in obs.log


CHECKS = {name: fn for name, fn in globals().items() if callable(fn) and name in {
    f.check for f in FAULTS if f.check}}
assert set(CHECKS) == {f.check for f in FAULTS if f.check}, "every check named in the matrix exists"


def test_every_row_has_a_distinct_when() -> None:
    whens = Counter(f.when for f in FAULTS)
    assert max(whens.values()) == 1, [w for w, c in whens.items() if c > 1]


def test_readme_table_matches_the_matrix() -> None:
    from .table import README, render

    text = Path(README).read_text()
    assert render() in text, "README's table is stale: python -m tests.faults.table --write"
