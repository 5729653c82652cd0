"""Parallelism beyond the partition count (workers.ordering = "key" / "unordered") against the
real broker: every worker busy on one partition, each key in offset order, exact commits,
bounded run-ahead and bounded revocation with many lanes."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Ringmaster,
    assert_runs_in_order,
    committed,
    daemon_config,
    journal_with_keys,
    kill_workers_in_turn,
    make_topics,
    produce_rows,
    read_all,
    run_until_caught_up,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def keyed(n: int, keys: int, start: int = 0) -> list[tuple[bytes | None, bytes, None]]:
    return [(f"k{i % keys}".encode(), f"r{i}".encode(), None) for i in range(start, start + n)]


def config(broker: Any, names: dict[str, str], tmp_path: Path, **workers: Any) -> dict[str, Any]:
    return daemon_config(broker, names, tmp_path, journal=True, **workers)


def assert_key_order(rows: list[tuple[int, int, int, int, str]]) -> dict[Any, int]:
    """Per key (and partition): one worker at a time, in offset order, nothing skipped."""
    by_key: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for _ns, part, off, pid, key in rows:
        by_key[(part, key)].append((off, pid))
    return assert_runs_in_order(by_key)


def test_key_ordering_keeps_every_worker_busy_on_one_partition_in_key_order(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 1, names["in"], names["out"], names["dlq"])
    counts = produce_rows(broker.bootstrap, names["in"], keyed(4000, 200), 1)
    rm = run_until_caught_up(config(broker, names, tmp_path, ordering="key", settings={"sleep_ms": 0.2}),
                             tmp_path)
    final = rm.status()
    assert final is not None
    shares = [w["records"] for w in final["workers"]]
    assert min(shares) > 1000, f"one partition, both workers busy: {shares}"
    assert committed(broker.bootstrap, names["group"], names["in"], 1) == counts
    outs = {json.loads(m.value())["id"] for m in read_all(broker.bootstrap, names["out"])}
    assert outs == {f"r{i}" for i in range(4000)}
    runs = assert_key_order(journal_with_keys(tmp_path / "journal"))
    assert set(runs.values()) == {1}, "no fault: each key stayed on one worker"


def test_key_order_holds_across_worker_kills(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    counts = produce_rows(broker.bootstrap, names["in"], keyed(6000, 50), 2)
    cfg = config(broker, names, tmp_path, ordering="key", settings={"sleep_ms": 0.4})
    rm = Ringmaster(cfg, tmp_path, args=["--until-caught-up"])
    try:
        kill_workers_in_turn(rm, 2, every_records=1500)
        assert rm.wait(120) == 0, rm.log_tail()
    finally:
        rm.close()
    assert committed(broker.bootstrap, names["group"], names["in"], 2) == counts
    outs = {json.loads(m.value())["id"] for m in read_all(broker.bootstrap, names["out"])}
    assert outs == {f"r{i}" for i in range(6000)}
    assert_key_order(journal_with_keys(tmp_path / "journal"))


def test_unordered_spreads_one_partition_over_every_worker_and_commits_exactly(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 1, names["in"], names["out"], names["dlq"])
    counts = produce_rows(broker.bootstrap, names["in"], keyed(3000, 7), 1)
    rm = run_until_caught_up(config(broker, names, tmp_path, ordering="unordered",
                                    settings={"sleep_ms": 0.2}), tmp_path)
    final = rm.status()
    assert final is not None and min(w["records"] for w in final["workers"]) > 500
    assert committed(broker.bootstrap, names["group"], names["in"], 1) == counts
    outs = [json.loads(m.value())["id"] for m in read_all(broker.bootstrap, names["out"])]
    assert sorted(set(outs)) == sorted(f"r{i}" for i in range(3000))


def test_a_slow_key_cannot_run_the_partition_further_ahead_than_the_bound(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """One key is slow, the others fast: the fast lane would run ahead without limit (the
    memory blow-up Parallel Consumer users hit); past max_uncommitted_records the partition
    pauses instead, and says why."""
    make_topics(broker.bootstrap, 1, names["in"], names["out"], names["dlq"])
    rows = [(b"slow" if i % 10 == 0 else f"k{i}".encode(), f"r{i}".encode(), None) for i in range(3000)]
    counts = produce_rows(broker.bootstrap, names["in"], rows, 1)
    cfg = config(broker, names, tmp_path, ordering="key", max_uncommitted_records=200)
    cfg["workers"]["settings"]["slow_keys"] = {"slow": 20}
    rm = Ringmaster(cfg, tmp_path, args=["--until-caught-up"])
    seen = []
    try:
        deadline = time.monotonic() + 120
        while rm.proc.poll() is None and time.monotonic() < deadline:
            s = rm.status()
            if s and s["partitions"]:
                p = s["partitions"][0]
                seen.append((p["consumed"] - p["records"], p["pause_reasons"]))
            time.sleep(0.05)
        assert rm.wait(60) == 0, rm.log_tail()
    finally:
        rm.close()
    assert any("uncommitted" in reasons for _, reasons in seen), "the bound paused the partition"
    # Ahead of what is done: the bound, plus one fetch and one cut already on their way.
    assert max(ahead for ahead, _ in seen) < 200 + 1000, max(ahead for ahead, _ in seen)
    assert committed(broker.bootstrap, names["group"], names["in"], 1) == counts


def test_revocation_is_bounded_with_a_full_backlog_in_key_mode(broker: Any, names: dict[str, str],
                                                                tmp_path: Path) -> None:
    """Invariant 5 with many lanes: a partition's batches sit in every worker's ring and in
    its lanes; revocation waits only for the batches in progress and no worker of the old
    owner touches a record of a moved partition afterwards."""
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    produce_rows(broker.bootstrap, names["in"], keyed(3000, 100), 2)
    cfg = config(broker, names, tmp_path, ordering="key", processes=2, ring_bytes=65536,
                 batch_max_records=1, settings={"sleep_ms": 200})
    a = Ringmaster(cfg, tmp_path, "a")
    b = None
    try:
        a.wait_status(lambda s: all(w["in_flight"] >= 1 for w in s["workers"])
                      and sum(p["pending_batches"] for p in s["partitions"]) >= 100, 60, "a full backlog")
        a_workers = set(a.worker_pids())
        b = Ringmaster(cfg, tmp_path, "b")
        s = a.wait_status(lambda s: s["revocations"], 60, "a revocation")
        revocation = s["revocations"][0]
        assert revocation["fenced_ms"] < 200 + 800, f"revocation waited {revocation['fenced_ms']} ms"
        b.wait_status(lambda s: s["records"] >= 5, 60, "B to work on the moved partition")
        assert a.terminate() == 0
    finally:
        a.close()
        if b is not None:
            b.terminate()
            b.close()
    moved = {int(label.rsplit("[", 1)[1].rstrip("]")) for label in revocation["partitions"]}
    late = [row for row in journal_with_keys(tmp_path / "journal")
            if row[3] in a_workers and row[1] in moved and row[0] > revocation["end_ns"]]
    assert not late, f"the old owner processed {len(late)} records after revocation returned"
