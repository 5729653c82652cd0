"""A daemon with nothing to do: the clients it keeps and how often its loop turns. Many
daemons sit on quiet topics most of the day, each on a host shared with other work."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import Ringmaster, daemon_config, make_topics, produce, read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _threads(pid: int) -> dict[int, str]:
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = (task / "comm").read_text().strip()
        except OSError:  # a thread that ended meanwhile
            continue
    return out


def _wakeups(pid: int) -> int:
    """Times the supervisor's main thread gave up the CPU (a wait) or had it taken."""
    text = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return sum(int(n) for n in re.findall(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", text, re.M))


def test_an_idle_daemon_keeps_only_the_clients_it_uses_and_turns_slowly(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """Idle: the supervisor holds one librdkafka client a job (the group's consumer, the
    control topic's reader, the console's status producer; the dead-letter producer is made
    when a letter comes), not the admin client that waited for the cluster at start. Its loop
    waits 100 ms a turn with nothing under way, not 20 (waits.py), and a record still flows
    through at once."""
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path)
    cfg["control"] = {"status_interval_s": 5.0}  # the console's records: the default, said here
    rm = Ringmaster(cfg, tmp_path)
    try:
        rm.wait_status(lambda s: s["ready"] and len(s["partitions"]) == 2, 60, "both partitions assigned")
        clients = [name for name in _threads(rm.proc.pid).values() if name == "rdk:main"]
        assert len(clients) == 3, f"librdkafka clients in the supervisor: {len(clients)}, expected 3"

        before, t0 = _wakeups(rm.proc.pid), time.monotonic()
        time.sleep(3.0)  # the measured span itself, not a wait for an event
        rate = (_wakeups(rm.proc.pid) - before) / (time.monotonic() - t0)
        # 100 ms a turn: ~10 waits a second, and the status written every status_interval_s;
        # at the 20 ms wait it was ~50.
        assert rate < 30, f"the idle supervisor's main thread woke {rate:.0f} times a second"

        produce(broker.bootstrap, names["in"], ["one"], 2)
        assert len(read_topic(broker.bootstrap, names["out"], 1)) == 1, "a record after the idle spell"
        assert rm.terminate() == 0
    finally:
        rm.close()
