"""The cluster of the suites that need replication: a leader to lose, a coordinator to move.

``netcluster``: three KRaft nodes (RF 3, min ISR 2, the tests' fast groups) and two daemon
"hosts", each in a network namespace of its own on one bridge, so that links can be cut and
slowed (tests/cluster/netns.py). One per session, started from the main thread (a node dies
with the thread that started it); every test leaves it whole (drive.heal)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from helpers import KAFKA_TEST_SERVER

from runtime.dev.kafkacluster import ApacheKafkaCluster, NodePlace

from .drive import HOSTS, NetCluster
from .netns import Network, network_problem, sweep_dead


@pytest.fixture(scope="session")
def netcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetCluster]:
    problem = network_problem()
    if problem is not None:
        pytest.skip(f"the cluster fault matrix needs network namespaces: {problem}")
    sweep_dead()
    net = Network()
    try:
        places = []
        for i in (1, 2, 3):
            address = net.add(f"n{i}")
            places.append(NodePlace(address, 9092, 9093, 9094, net.prefix_for(f"n{i}")))
        for host in HOSTS:
            net.add(host)
        logs = tmp_path_factory.mktemp("netcluster")
        with ApacheKafkaCluster(3, log_dir=logs, overrides=KAFKA_TEST_SERVER, places=places) as c:
            yield NetCluster(net, c)
    finally:
        left = net.qdiscs()
        net.close()
        assert not left, f"qdiscs left behind: {left}"
