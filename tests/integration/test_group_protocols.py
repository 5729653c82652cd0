"""Both group protocols against a broker that has them (Apache Kafka): two members share a
topic and hand partitions over when one leaves, and a static member (`group.instance.id`)
restarted within its session timeout gets its partitions back without the other member
seeing a rebalance (the rolling restart of systemd and Kubernetes).

Tansu has no KIP-848 and its static membership is flaky (BROKER.md): there the classic rows
run and the static-membership ones are skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from helpers import (
    GROUP_PROTOCOLS,
    TEST_BROKER,
    Ringmaster,
    committed,
    daemon_config,
    make_topics,
    produce,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
PARTITIONS = 4
STATIC_SESSION_MS = 45_000  # far longer than a daemon's restart on a loaded machine


def held(rm: Ringmaster) -> set[int]:
    """The partitions a member holds; a member that exited fails the test at once."""
    assert rm.proc.poll() is None, f"{rm.log_path.name} exited with {rm.proc.returncode}:\n{rm.log_tail()}"
    return {p["partition"] for p in (rm.status() or {}).get("partitions", [])}


@pytest.mark.parametrize("protocol", GROUP_PROTOCOLS)
def test_two_members_share_the_partitions_and_one_takes_all_when_the_other_stops(
        broker: Any, names: dict[str, str], tmp_path: Path, protocol: str) -> None:
    make_topics(broker.bootstrap, PARTITIONS, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, processes=1)
    cfg["kafka"]["consumer"] = _group(protocol)
    a = Ringmaster(cfg, tmp_path, "a")
    b: Ringmaster | None = None
    try:
        wait_for(lambda: len(held(a)) == PARTITIONS, 60, "a to hold every partition")
        b = Ringmaster(cfg, tmp_path, "b")
        wait_for(lambda: held(a) and held(b) and held(a) | held(b) == set(range(PARTITIONS))
                 and not held(a) & held(b), 60, "the partitions shared")
        counts = produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(200)], PARTITIONS)
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], PARTITIONS) == counts, 60,
                 "every offset committed by the two", interval_s=0.3)
        assert b.terminate() == 0
        wait_for(lambda: len(held(a)) == PARTITIONS, 60, "a to take every partition back")
        more = produce(broker.bootstrap, names["in"], [f"s{i}" for i in range(200)], PARTITIONS)
        total = {p: counts[p] + more[p] for p in counts}
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], PARTITIONS) == total, 60,
                 "every offset committed by a alone", interval_s=0.3)
        assert a.terminate() == 0
    finally:
        for rm in (a, b):
            if rm is not None:
                rm.close()


@pytest.mark.skipif(TEST_BROKER != "kafka", reason="Tansu's static membership is flaky (BROKER.md)")
@pytest.mark.parametrize("protocol", GROUP_PROTOCOLS)
def test_a_static_member_restarted_within_the_session_timeout_keeps_its_partitions(
        broker: Any, names: dict[str, str], tmp_path: Path, protocol: str) -> None:
    make_topics(broker.bootstrap, PARTITIONS, names["in"], names["out"], names["dlq"])
    if protocol == "consumer":
        # KIP-848: the session timeout is the group's, set on the broker (the test broker's
        # default is 2 s, for the other tests' lost members).
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        res = ConfigResource(ResourceType.GROUP, names["group"], incremental_configs=[ConfigEntry(
            "consumer.session.timeout.ms", str(STATIC_SESSION_MS),
            incremental_operation=AlterConfigOpType.SET)])
        for fut in admin.incremental_alter_configs([res]).values():
            fut.result(30)
    cfg = daemon_config(broker, names, tmp_path, processes=1)
    members = {}
    try:
        for name in ("a", "b"):
            c = dict(cfg, kafka=dict(cfg["kafka"], consumer={**_group(protocol, static=True),
                                                            "group.instance.id": unique(name)}))
            members[name] = (c, Ringmaster(c, tmp_path, name))
        a, b = members["a"][1], members["b"][1]
        wait_for(lambda: held(a) and held(b) and held(a) | held(b) == set(range(PARTITIONS)), 90,
                 "the partitions shared")
        before = (held(a), held(b))
        b_rebalances, b_revoked = (b.status() or {})["rebalances"], len((b.status() or {})["revocations"])
        assert a.terminate() == 0
        a2 = Ringmaster(members["a"][0], tmp_path, "a2")
        members["a2"] = (members["a"][0], a2)
        wait_for(lambda: held(a2), 60, "a's restart to get partitions")
        assert (held(a2), held(b)) == before, "the restarted member got other partitions"
        counts = produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(200)], PARTITIONS)
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], PARTITIONS) == counts, 60,
                 "every offset committed", interval_s=0.3)
        st = b.status() or {}
        assert len(st["revocations"]) == b_revoked, "the other member gave up partitions"
        if protocol == "consumer":
            assert st["rebalances"] == b_rebalances, "the other member saw a rebalance"
        # Classic protocol: when the restarted static member was the group's leader, the
        # coordinator runs the assignment again (the leader's subscription may have changed);
        # nothing moves, so the other member sees an empty incremental callback, no revocation.
        assert held(b) == before[1]
        for rm in (a2, b):
            assert rm.terminate() == 0
    finally:
        for _, rm in members.values():
            rm.close()


def _group(protocol: str, static: bool = False) -> dict[str, Any]:
    from helpers import group_settings
    props = group_settings(protocol)
    if static and protocol == "classic":
        props["session.timeout.ms"] = STATIC_SESSION_MS  # librdkafka: at most max.poll.interval.ms
        props["max.poll.interval.ms"] = max(STATIC_SESSION_MS, props["max.poll.interval.ms"])
    return props
