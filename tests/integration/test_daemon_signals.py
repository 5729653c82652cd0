"""Every signal an operator, a terminal or a process manager may send (issue 17.6), to the
supervisor and to its whole process group while records flow: the daemon and its workers
live on, or stop gracefully (TERM, INT, QUIT: exit 0); nothing is lost, everything ends
committed, no segment is left (the no_leftovers fixture checks)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    TEST_BROKER,
    Ringmaster,
    committed,
    daemon_config,
    make_topics,
    produce,
    read_topic,
    run_until_caught_up,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

# (signal, what the log says each time it arrives). SIGHUP, SIGTTIN and SIGTTOU reload and
# resize: the fault matrix's rows `sighup` and `sigttin-sigttou` send them the same way.
CARRY_ON = [(signal.SIGUSR1, "status: "),
            (signal.SIGUSR2, "SIGUSR2 ignored"),
            (signal.SIGWINCH, "SIGWINCH ignored"),
            (signal.SIGPIPE, None)]


def send(rm: Ringmaster, sig: int, target: str) -> None:
    if target == "group":
        os.killpg(rm.proc.pid, sig)  # a terminal's hangup, Ctrl-C, Ctrl-\ reach everyone
    else:
        rm.proc.send_signal(sig)


def output_ids(bootstrap: str, topic: str, expect: int) -> set[str]:
    return {json.loads(m.value())["id"] for m in read_topic(bootstrap, topic, expect)}


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_operator_signals_to_the_supervisor_and_to_its_group_change_nothing(
        broker: Any, names: dict[str, str], tmp_path: Path, start_method: str) -> None:
    """With forkserver, the fork server is in the group too: were it killed by a hangup, its
    workers would die with it (they die with their parent)."""
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(20000)]
    counts = produce(broker.bootstrap, names["in"], values, 4)
    cfg = daemon_config(broker, names, tmp_path, settings={"sleep_ms": 1}, start_method=start_method)
    rm = Ringmaster(cfg, tmp_path, new_session=True)
    try:
        first = rm.wait_status(lambda s: s["records"] >= 200 and all(w["alive"] for w in s["workers"]), 60,
                               "progress")
        pids = [w["pid"] for w in first["workers"]]
        for target in ("supervisor", "group"):
            for sig, _ in CARRY_ON:
                before = (rm.status() or first)["records"]
                send(rm, sig, target)
                rm.wait_status(lambda s, b=before: s["records"] > b, 30,
                               f"records to keep flowing after {sig.name} to the {target}")
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 4) == counts, 120,
                 "every record committed", interval_s=0.3)
        last = rm.status()
        assert last is not None
        assert [w["pid"] for w in last["workers"]] == pids and last["restarts"] == 0, \
            "no worker died or was replaced"
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    log = rm.log_path.read_text().splitlines()
    for sig, needle in CARRY_ON:
        if needle is None:
            continue
        lines = [line for line in log if needle in line]
        assert len(lines) == 2, f"{sig.name}: one line per arrival ({needle!r}):\n{rm.log_tail()}"
    assert output_ids(broker.bootstrap, names["out"], len(values)) == set(values), "nothing lost"


@pytest.mark.parametrize("target", ["supervisor", "group"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_stop_signal_stops_gracefully_and_loses_nothing(broker: Any, names: dict[str, str], tmp_path: Path,
                                                          sig: signal.Signals, target: str) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(4000)]
    counts = produce(broker.bootstrap, names["in"], values, 2)
    cfg = daemon_config(broker, names, tmp_path, settings={"sleep_ms": 1})
    rm = Ringmaster(cfg, tmp_path, new_session=True)
    try:
        rm.wait_status(lambda s: s["records"] >= 300, 60, "progress")
        send(rm, sig, target)
        assert rm.wait(60) == 0, rm.log_tail()
    finally:
        rm.close()
    log = rm.log_path.read_text()
    assert f"signal={sig.name}" in log and "stop requested" in log, rm.log_tail()
    assert "WorkerCrashed" not in log and "did not stop in time" not in log, rm.log_tail()
    final = rm.status()
    assert final is not None and final["records"] < len(values), "stopped mid-run"
    done = committed(broker.bootstrap, names["group"], names["in"], 2)
    assert sum(max(o, 0) for o in done.values()) <= final["records"], "nothing committed past what was done"
    # A second run finishes the rest: together, every record is output and committed.
    cfg["workers"]["settings"] = {}
    run_until_caught_up(cfg, tmp_path, "second")
    assert committed(broker.bootstrap, names["group"], names["in"], 2) == counts
    assert output_ids(broker.bootstrap, names["out"], len(values)) == set(values)


def test_members_stopped_together_end_within_the_shutdown_bound_and_lose_nothing(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """Two members SIGTERMed one right after the other: the second closes its client while the
    group rebalances over the first's leaving, where librdkafka's close can wait for good (and
    confluent-kafka's rebalance callback hold the GIL meanwhile: runtime/ops/backstop.py). Each
    ends with exit 0 within supervisor.shutdown_timeout_s and its last resort's grace; what each
    did is committed, and a second run finishes the rest."""
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    values = [f"r{i}" for i in range(4000)]
    counts = produce(broker.bootstrap, names["in"], values, 4)
    cfg = daemon_config(broker, names, tmp_path, settings={"sleep_ms": 1}, processes=1)
    bound_s = cfg["supervisor"]["shutdown_timeout_s"] + 2 + 5  # + the close's and the release's grace
    members = [Ringmaster(cfg, tmp_path, f"m{i}") for i in range(2)]
    try:
        for m in members:
            m.wait_status(lambda s: bool(s["partitions"]) and s["records"] >= 100, 90, "each member working")
        for m in members:
            m.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + bound_s  # both stop at once: one bound for the two
        exits = [m.wait(max(deadline - time.monotonic(), 0.1)) for m in members]
    finally:
        for m in members:
            m.close()
    assert exits == [0, 0], "\n".join(m.log_tail() for m in members)
    if TEST_BROKER == "tansu":
        # Tansu: after two members left at once, a new member of the group was not assigned a
        # partition in 120 s (the default run of 2026-11-26; Apache Kafka assigns it at once).
        # What follows, the second run finishing the rest, is judged on Apache Kafka (CI).
        return
    run_until_caught_up(cfg, tmp_path, "second")
    assert committed(broker.bootstrap, names["group"], names["in"], 4) == counts
    assert output_ids(broker.bootstrap, names["out"], len(values)) == set(values)
