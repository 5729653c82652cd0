"""A daemon's start makes its status and control topics (create_topic) while a node of the
cluster has just died: a topic that exists is found, a new one is made, each within its
timeout (CONTROLLER_WAIT in runtime/kafka/admin.py). Asked of the controller alone, a create
in the seconds after a kill waited for the dead node its client's metadata named, and failed
after its whole timeout: a daemon started then went without its status topic, or did not
start (the control topic). A share group's daemon asks for the group's config at its start: the
same window."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import pytest
from helpers import unique

from runtime.kafka.admin import create_topic
from runtime.kafka.share_consumer import ShareGroupConfig, prepare_share_group

from .drive import NetCluster, heal

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_ci, pytest.mark.timeout(420)]

WINDOW_S = 12.0  # asked again and again for so long after the kill: the node is fenced within it
TIMEOUT_S = 20.0  # each ask's, as a daemon's kafka.connect_timeout_s


@pytest.mark.parametrize("victim", [1, 2])
def test_topics_are_found_and_made_while_a_node_has_just_died(victim: int, netcluster: NetCluster) -> None:
    props = netcluster.props
    existing = unique("exists")
    assert create_topic(props, existing, 1, replication_factor=-1, timeout_s=60.0) is True
    node = netcluster.cluster.node(victim)
    asks: list[dict[str, Any]] = []
    try:
        node.kill()
        killed_at = time.monotonic()
        while time.monotonic() - killed_at < WINDOW_S:
            for topic, made in ((existing, False), (unique("new"), True)):
                asks.append(_ask(topic, made, functools.partial(
                    create_topic, props, topic, 1, replication_factor=-1, timeout_s=TIMEOUT_S), killed_at))
            # A share group's daemon describes (and sets) the group's config at its start.
            asks.append(_ask("share group", True, lambda: isinstance(
                prepare_share_group(props, unique("share"), TIMEOUT_S), ShareGroupConfig), killed_at))
    finally:
        heal(netcluster)
    print("ASKS", asks)
    wrong = [a for a in asks if a["answer"] is not a["wanted"]]
    assert not wrong, f"{len(wrong)} of {len(asks)} asks not answered as they should: {wrong[:4]}"
    assert len(asks) >= 6, asks


def _ask(what: str, wanted: Any, ask: Callable[[], Any], killed_at: float) -> dict[str, Any]:
    began = time.monotonic()
    try:
        answer = ask()
    except Exception as exc:
        answer = f"{type(exc).__name__}: {exc}"
    return {"after_kill_s": round(began - killed_at, 1), "what": what, "wanted": wanted, "answer": answer,
            "took_s": round(time.monotonic() - began, 1)}
