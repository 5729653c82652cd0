"""More partitions than ``supervisor.max_partitions`` against the real broker (issue 29): two
members, 12 partitions, 8 slots each; one stops cleanly and the group gives the survivor all
12. It used to exit 1 ("more than 8 partitions assigned"); now it holds 4 over capacity
(paused, not read, reported) and lives. A member joining frees slots: every record is then
processed and committed, nothing lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import Ringmaster, committed, daemon_config, make_topics, produce, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PARTITIONS = 12


def test_a_member_given_more_partitions_than_max_partitions_lives_and_reports_the_rest(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, PARTITIONS, names["in"], names["out"], names["dlq"])
    counts = produce(broker.bootstrap, names["in"], [f"r{i}" for i in range(1200)], PARTITIONS)
    cfg = daemon_config(broker, names, tmp_path)
    cfg["supervisor"]["max_partitions"] = 8
    a, b, c = Ringmaster(cfg, tmp_path, "a"), None, None
    try:
        a.wait_status(lambda s: s["records"] > 0, 60, "A to work")
        b = Ringmaster(cfg, tmp_path, "b")
        b.wait_status(lambda s: len(s["partitions"]) == PARTITIONS // 2, 60, "B to take half")
        assert b.terminate() == 0, b.log_tail()
        s = a.wait_status(lambda s: len(s["over_capacity"]) == PARTITIONS - 8, 60,
                          "A to hold what does not fit over capacity")
        assert len(s["partitions"]) == 8 and a.status() is not None
        assert "held over capacity, not read" in a.log_tail(200)
        more = produce(broker.bootstrap, names["in"], [f"s{i}" for i in range(600)], PARTITIONS)
        c = Ringmaster(cfg, tmp_path, "c")
        total = {p: counts[p] + more[p] for p in counts}
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], PARTITIONS) == total, 120,
                 "every offset committed once a member joined and freed slots", interval_s=0.3)
        assert not a.status()["over_capacity"], "taken in or handed over"  # type: ignore[index]
        assert c.terminate() == 0, c.log_tail()
        assert a.terminate() == 0, a.log_tail()
    finally:
        for rm in (a, b, c):
            if rm is not None:
                rm.close()
    got = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 1800)}
    assert got == {f"r{i}" for i in range(1200)} | {f"s{i}" for i in range(600)}
