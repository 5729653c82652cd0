"""Two daemons through four faults of a three-node cluster (issue 40's check), judged by an
independent reader of the topics, never by the daemons' logs.

One fault per chunk of 10,000 input records, written at a steady rate over 6 partitions while
two daemons of the group (two workers each) process them:
  a. the leader of ``in-0`` killed, and started again 15 s later;
  b. the group coordinator's node frozen (SIGSTOP) for 20 s;
  c. the leader of the output's partition 0 killed, and started again 15 s later;
  d. one supervisor SIGKILLed and replaced at once.
What must hold: 0 records lost, and under exactly-once 0 duplicates to a read_committed reader;
each fault recovered (tests/cluster/flow.py: the outputs of every input partition flowing again)
within RECOVERY_S of its end; every offset committed; the daemons still running exit 0 on
SIGTERM. Each run prints its figures (``FAILOVER {json}``), and appends them to the file
RINGMASTER_FAILOVER_FIGURES names, if set.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Ringmaster, base_config, read_all, unique, wait_for

from runtime.kafka.admin import create_topic

from .drive import HOSTS, NetCluster, heal
from .flow import (
    CommitSampler,
    FaultSpan,
    OutputReader,
    SteadyInput,
    committed_now,
    recovery,
    transactions_settled,
    wait_steady,
)
from .who import Who

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

PARTITIONS = 6
CHUNK = 10_000
RATE = 250.0  # input records a second: a fault every ~40 s, two daemons far from busy
DOWN_S = 15.0  # a killed node comes back after
FROZEN_S = 20.0
# The aim: outputs flowing within 15 s of a single-node fault's end under
# at-least-once, 30 s under exactly-once; held to it with RINGMASTER_CLUSTER_AIMS=1 (a quiet
# machine), else to SETTLE_S: recovered, not stuck (test_cluster_matrix.py says why).
RECOVERY_S = {"at-least-once": 15.0, "exactly-once": 30.0}
AIMS = os.environ.get("RINGMASTER_CLUSTER_AIMS") == "1"
SETTLE_S = 120.0  # the most a fault's recovery is waited for before the next one


def daemon_config(bootstrap: str, names: dict[str, str], tmp: Path, guarantee: str) -> dict[str, Any]:
    cfg = base_config(bootstrap, names["in"], names["group"], tmp, settings={"sleep_ms": 1.0})
    cfg["output"] = {"topic": names["out"], "guarantee": guarantee}
    cfg["dead_letter"] = {"topic": names["dlq"]}
    return cfg


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_two_daemons_recover_from_leader_kills_a_frozen_coordinator_and_a_supervisor_sigkill(
        guarantee: str, netcluster: NetCluster, tmp_path: Path) -> None:
    eos = guarantee == "exactly-once"
    cluster = netcluster.cluster
    names = {"in": unique("in"), "out": unique("out"), "dlq": unique("dlq"), "group": unique("g")}
    props = {"bootstrap.servers": cluster.bootstrap}
    for topic in (names["in"], names["out"], names["dlq"]):  # the cluster's replication (3), not 1
        create_topic(props, topic, PARTITIONS, replication_factor=-1)
    who = Who(props)
    cfg = daemon_config(cluster.bootstrap, names, tmp_path, guarantee)
    host = netcluster.net.prefix_for("h1", HOSTS["h1"])  # both daemons on one host
    daemons: list[Ringmaster] = []

    def start(name: str) -> Ringmaster:
        rm = Ringmaster(cfg, tmp_path, name, prefix=host)
        daemons.append(rm)
        return rm

    source = SteadyInput(props, names["in"], PARTITIONS, RATE)
    reader = OutputReader(props, names["out"], eos)
    sampler = CommitSampler(props, names["group"], names["in"], PARTITIONS)
    spans: list[FaultSpan] = []
    exits: dict[str, int] = {}
    try:
        a, b = start("a"), start("b")
        for rm in (a, b):
            rm.wait_status(lambda s: s["partitions"], 180, f"{rm.log_path.stem} to join")
        reader.start()
        sampler.start()
        source.start()
        assert wait_steady(reader, 0.0, PARTITIONS, 5.0, SETTLE_S), "outputs never flowed before the faults"

        def node_down(pick: Callable[[], int], hold_s: float, freeze: bool) -> Callable[[], dict[str, Any]]:
            def fault() -> dict[str, Any]:
                node = cluster.node(pick())
                if freeze:
                    node.freeze()
                    time.sleep(hold_s)  # the fault's length: held on purpose
                    node.thaw()
                else:
                    node.kill()
                    time.sleep(hold_s)
                    node.start()
                return {"node": node.node_id}
            return fault

        def replace_supervisor() -> dict[str, Any]:
            nonlocal a
            a.kill()
            a = start("a2")
            return {"killed": daemons[0].proc.pid}

        faults = [
            ("input-leader-killed", node_down(lambda: who.leader_of(names["in"], 0), DOWN_S, False)),
            ("group-coordinator-frozen",
             node_down(lambda: who.group_coordinator(names["group"]), FROZEN_S, True)),
            ("output-leader-killed", node_down(lambda: who.leader_of(names["out"], 0), DOWN_S, False)),
            ("supervisor-killed", replace_supervisor),
        ]
        for k, (kind, fault) in enumerate(faults):
            wait_for(lambda k=k: source.sent >= k * CHUNK + CHUNK // 5, 600, f"chunk {k + 1} under way")
            start_t = time.monotonic()
            detail = fault()
            spans.append(FaultSpan(kind, start_t, time.monotonic(), detail))
            wait_steady(reader, spans[-1].end, PARTITIONS, 5.0, SETTLE_S)
        wait_for(lambda: source.sent >= len(faults) * CHUNK, 600, "the last chunk written")
        stopped_at = time.monotonic()
        source.finish()
        counts = dict(source.counts)
        caught_up = _wait_committed(props, names, counts, 300)
        live = [rm for rm in daemons if rm is not daemons[0]]
        exits = {rm.log_path.stem: rm.terminate(120) for rm in live}
        final = committed_now(props, names["group"], names["in"], PARTITIONS)
    finally:
        source._halt.set()
        reader.finish()
        sampler.finish()
        for rm in daemons:
            rm.close()
        # Killed on purpose: a2 reclaimed its segments at its start (issue 40 found two left).
        unreclaimed = [x for rm in daemons[:1] for x in rm.reclaim()]
        heal(netcluster)
        ends = [s.start for s in spans[1:]] + [locals().get("stopped_at", time.monotonic())]
        figures = [recovery(s, until, reader.arrivals, PARTITIONS, sampler.samples).figures()
                   for s, until in zip(spans, ends, strict=False)]
        print("FAILOVER recovery " + json.dumps(figures))

    assert reader.error is None, reader.error
    assert transactions_settled(props, [names["out"], names["dlq"]], 180), "a transaction stayed open"
    # librdkafka reads read_committed by default: aborted transactions' outputs are not counted
    outputs = read_all(cluster.bootstrap, names["out"], timeout_s=120)
    ids = _ids(outputs)
    produced = set(source.values)
    lost = sorted(produced - set(ids))
    duplicates = sum(n - 1 for n in ids.values() if n > 1)
    letters = read_all(cluster.bootstrap, names["dlq"], timeout_s=60)
    result = {"guarantee": guarantee, "records": len(produced), "lost": len(lost), "duplicates": duplicates,
              "dead_letters": len(letters), "exits": exits, "caught_up": caught_up, "recovery": figures,
              "load": os.getloadavg()}
    print("FAILOVER " + json.dumps(result))
    if os.environ.get("RINGMASTER_FAILOVER_FIGURES"):
        with open(os.environ["RINGMASTER_FAILOVER_FIGURES"], "a") as f:
            f.write(json.dumps(result) + "\n")
    assert not lost, f"{len(lost)} records lost, e.g. {lost[:5]}"
    assert not letters, f"good records dead-lettered: {[m.value()[:40] for m in letters[:5]]}"
    if eos:
        twice = {i for i, n in ids.items() if n > 1}
        copies = [(m.partition(), m.offset(), m.value()[:120]) for m in outputs
                  if json.loads(m.value())["id"] in twice][:10]
        assert duplicates == 0, f"{duplicates} duplicates to a read_committed reader: {copies}"
    assert all(code == 0 for code in exits.values()), exits
    assert not unreclaimed, f"segments of the killed supervisor left behind: {unreclaimed}"
    assert final == counts, f"committed {final}, written {counts}"
    limit = RECOVERY_S[guarantee] if AIMS else SETTLE_S
    slow = [f for f in figures if f["steady_s"] is None or f["steady_s"] > limit]
    assert not slow, f"recovered later than {limit} s: {slow}"


def _wait_committed(props: dict[str, Any], names: dict[str, str], counts: dict[int, int],
                    timeout_s: float) -> bool:
    """Until the group has committed every record written (False: not within ``timeout_s``;
    the final assertion says which partition is short)."""
    try:
        wait_for(lambda: committed_now(props, names["group"], names["in"], PARTITIONS) == counts, timeout_s,
                 "every offset committed", interval_s=1.0)
        return True
    except AssertionError:
        return False


def _ids(outputs: list[Any]) -> dict[str, int]:
    from collections import Counter

    return Counter(json.loads(m.value())["id"] for m in outputs)
