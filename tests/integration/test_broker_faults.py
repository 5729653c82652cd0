"""The broker goes away and comes back: nothing lost, every offset committed in the end,
the supervisor neither stops nor hangs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Ringmaster, base_config, committed, make_topics, produce, read_topic, unique, wait_for
from proxy import Proxy

from runtime.devbroker import DevBroker, free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[DevBroker, Proxy]]:
    front, back = free_port(), free_port()
    proxy = Proxy(front, back).start()
    broker = DevBroker(back, log_path=tmp_path / "tansu.log", advertised_port=front).start()
    try:
        yield broker, proxy
    finally:
        proxy.close()
        broker.stop()


def test_broker_outage_loses_nothing_and_commits_everything(proxied: tuple[DevBroker, Proxy],
                                                             tmp_path: Path) -> None:
    broker, proxy = proxied
    names = {k: unique(k) for k in ("in", "out", "dlq", "g")}
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(6000)]
    counts = produce(broker.bootstrap, names["in"], values, 4)
    cfg = base_config(broker.bootstrap, names["in"], names["g"], tmp_path, settings={"sleep_ms": 1})
    cfg["output"] = {"topic": names["out"]}
    cfg["dead_letter"] = {"topic": names["dlq"]}
    rm = Ringmaster(cfg, tmp_path)
    try:
        rm.wait_status(lambda s: s["records"] >= 1000, 60, "progress")
        proxy.cut()
        cut_at = rm.status()
        time.sleep(4)  # the outage itself: what we measure is what happens after it
        during = rm.status()
        assert rm.proc.poll() is None, "the supervisor must ride out an outage"
        proxy.restore()
        wait_for(lambda: committed(broker.bootstrap, names["g"], names["in"], 4) == counts, 120,
                 "every offset committed after the outage", interval_s=0.5)
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    assert cut_at is not None and during is not None
    outs = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 6000)}
    assert outs == set(values)
