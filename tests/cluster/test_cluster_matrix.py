"""The cluster fault matrix (tests/cluster/matrix.py), against a three-node Apache Kafka cluster
and real daemons on two "hosts" (network namespaces), one row at a time: each fault hits the
whole cluster. Judged by independent readers of the topics (tests/cluster/drive.py).

``./scripts/test --cluster`` runs every row; ``./scripts/test --all`` (CI) the rows marked
``ci``: a leader kill, a coordinator move and a network split, at-least-once and exactly-once.
Each row prints its figures (``CLUSTER {json}``) and appends them to the file
RINGMASTER_CLUSTER_FIGURES names, if set (docs/brokers.md's failover table is made from it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import drive
from .drive import NetCluster, Observation
from .matrix import EOS, NETEM, ROWS, SHARE, Row
from .netns import netem_problem

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
# The aim (issue 40): outputs of every partition flow again within 15 s of a single-node
# fault's end under at-least-once (and in a share group), within 30 s under exactly-once. A
# time is a measurement, and on a machine shared with other work it measures the machine too:
# every row must recover within drive.SETTLE_S (never stuck), and only with
# RINGMASTER_CLUSTER_AIMS=1 (a quiet machine) within its aim. The figures are printed either way.
RECOVERY_S = {"at-least-once": 15.0, "share": 15.0, "exactly-once": 30.0}
AIMS = os.environ.get("RINGMASTER_CLUSTER_AIMS") == "1"


def _param(row: Row) -> object:
    marks = [pytest.mark.cluster_ci] if row.ci else []
    return pytest.param(row, id=row.id, marks=marks)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_cluster_fault(row: Row, netcluster: NetCluster, tmp_path: Path) -> None:
    if row.kind in NETEM and (problem := netem_problem()) is not None:
        pytest.skip(problem)
    obs = drive.run(row, netcluster, tmp_path)
    line = drive.dump(obs)
    print("CLUSTER " + line)
    if os.environ.get("RINGMASTER_CLUSTER_FIGURES"):
        with open(os.environ["RINGMASTER_CLUSTER_FIGURES"], "a") as f:
            f.write(line + "\n")
    judge(obs)


def judge(obs: Observation) -> None:
    row = obs.row
    logs = "\n".join(f"--- {n}\n{t}" for n, t in obs.logs.items())
    assert not obs.exited_early, f"members exited by themselves: {obs.exited_early}\n{logs}"
    assert all(code == 0 for code in obs.exits.values()), f"exits {obs.exits}\n{logs}"
    assert obs.settled, "a transaction stayed open on the outputs for 180 s after the run"
    produced = obs.produced
    poison = {v.split(":", 1)[1] for v in produced if v.startswith("raise:")}
    good = {v for v in produced if not v.startswith("raise:")}
    lost = sorted(good - set(obs.outputs))
    assert not lost, f"{len(lost)} records lost, e.g. {lost[:5]}\n{logs}"
    letters = {v.split(":", 1)[1] for v in obs.letters}
    assert letters == poison, \
        f"dead letters {sorted(letters ^ poison)[:5]} differ from the poison records\n{logs}"
    if row.mode == EOS:
        twice = {i: n for i, n in obs.outputs.items() if n > 1}
        assert not twice, f"{len(twice)} outputs twice to a read_committed reader: {list(twice)[:5]}"
        assert all(n == 1 for n in obs.letters.values()), "a dead letter twice"
    if row.mode != SHARE:
        assert obs.committed == obs.written, f"committed {obs.committed}, written {obs.written}\n{logs}"
    assert not obs.unreclaimed, f"segments of the killed supervisor never reclaimed: {obs.unreclaimed}"
    if "replacement" in obs.detail:  # seen by the console: it made and wrote its status topic
        assert obs.detail["replacement"] in obs.members, \
            f"the replacement published no status: members {sorted(obs.members)}\n{logs}"
    if row.batch_run:  # it ended by itself (drive.run waits 240 s at most), at the true end: judged above
        return
    recovered = (obs.recovery or {}).get("steady_s")
    assert recovered is not None and recovered < drive.SETTLE_S, f"outputs never flowed again: {obs.recovery}"
    limit = RECOVERY_S[row.mode]
    assert not (AIMS and row.aim) or recovered <= limit, \
        f"outputs flowed again {recovered} s after the fault's end (aim: {limit} s): {obs.recovery}"
