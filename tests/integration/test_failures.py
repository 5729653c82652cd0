"""Invariant 8 against the real broker: failures are contained, nothing is dropped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Ringmaster,
    base_config,
    committed,
    make_topics,
    produce,
    read_topic,
    run_until_caught_up,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def setup_run(broker: Any, names: dict[str, str], tmp_path: Path, values: list[str], partitions: int = 2,
              dead_letter: bool = True, **workers: Any) -> tuple[dict[int, int], dict[str, Any]]:
    make_topics(broker.bootstrap, partitions, names["in"], names["out"], names["dlq"])
    counts = produce(broker.bootstrap, names["in"], values, partitions)
    cfg = base_config(broker.bootstrap, names["in"], names["group"], tmp_path, **workers)
    cfg["output"] = {"topic": names["out"]}
    cfg["dead_letter"] = {"retry_backoff_s": 0.01, "max_attempts": 2}
    if dead_letter:
        cfg["dead_letter"]["topic"] = names["dlq"]
    return counts, cfg


def headers(m: Any) -> dict[str, bytes]:
    return dict(m.headers() or [])


def test_raising_and_rejected_records_are_dead_lettered_and_the_rest_goes_on(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(2000)]
    poison = {7: "raise:r7", 1001: "raise:r1001", 1500: "reject:r1500"}
    for i, v in poison.items():
        values[i] = v
    counts, cfg = setup_run(broker, names, tmp_path, values)
    run_until_caught_up(cfg, tmp_path, timeout_s=120)
    dead = read_topic(broker.bootstrap, names["dlq"], 3)
    assert sorted(m.value().decode() for m in dead) == sorted(poison.values())
    for m in dead:
        h = headers(m)
        value = m.value().decode()
        expected_type = b"Rejected" if value.startswith("reject:") else b"ValueError"
        assert h["ringmaster.error.type"] == expected_type
        assert int(h["ringmaster.source.offset"]) == values.index(value) // 2  # round-robin over 2
        assert m.key() == str(values.index(value)).encode(), "original key kept"
        if expected_type == b"ValueError":
            assert b"poison record" in h["ringmaster.error.message"]
            assert b"Traceback" in h["ringmaster.error.traceback"]
    good = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 1997)}
    assert good == {v for v in values if ":" not in v}
    assert committed(broker.bootstrap, names["group"], names["in"], 2) == counts


def test_a_record_that_kills_its_worker_is_isolated_and_dead_lettered(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(1000)]
    values[333] = "crash:r333"
    counts, cfg = setup_run(broker, names, tmp_path, values, batch_max_records=64)
    rm = run_until_caught_up(cfg, tmp_path, timeout_s=180)
    dead = read_topic(broker.bootstrap, names["dlq"], 1)
    assert [m.value() for m in dead] == [b"crash:r333"]
    h = headers(dead[0])
    assert h["ringmaster.error.type"] == b"WorkerCrashed"
    assert b"exited with status 13" in h["ringmaster.error.message"]
    good = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 999)}
    assert good == {v for v in values if ":" not in v}
    assert committed(broker.bootstrap, names["group"], names["in"], 2) == counts
    final = rm.status()
    assert final is not None and final["restarts"] >= 2


def test_a_batch_past_its_deadline_kills_the_worker_and_is_isolated(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(200)]
    values[50] = "hang:r50"
    counts, cfg = setup_run(broker, names, tmp_path, values, partitions=1, batch_max_records=4,
                            batch_timeout_s=1.0)
    rm = run_until_caught_up(cfg, tmp_path, timeout_s=180)
    dead = read_topic(broker.bootstrap, names["dlq"], 1)
    assert [m.value() for m in dead] == [b"hang:r50"]
    assert committed(broker.bootstrap, names["group"], names["in"], 1) == counts
    assert "exceeded its deadline" in rm.log_path.read_text()


def test_without_a_dead_letter_topic_the_partition_stops_at_the_failing_record(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(400)]
    values[100] = "raise:r100"  # partition 0, offset 50
    counts, cfg = setup_run(broker, names, tmp_path, values, dead_letter=False)
    rm = Ringmaster(cfg, tmp_path)
    try:
        s = rm.wait_status(lambda s: any(p["blocked"] for p in s["partitions"]) and
                           s["committed"].get(f"{names['in']}[1]") == counts[1], 60,
                           "partition 0 blocked and partition 1 done")
        blocked = [p for p in s["partitions"] if p["blocked"]]
        assert [p["tp"] for p in blocked] == [f"{names['in']}[0]"]
        assert "offset 50" in blocked[0]["blocked"]
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    done = committed(broker.bootstrap, names["group"], names["in"], 2)
    assert done[1] == counts[1]
    assert done[0] <= 50, f"committed past the failing record: {done[0]}"
    outs = {json.loads(m.value())["id"]
            for m in read_topic(broker.bootstrap, names["out"], 300, timeout_s=10)}
    assert not {f"r{i}" for i in range(102, 400, 2)} & outs, "records after the failure were processed"


def test_a_plugin_that_cannot_start_stops_the_daemon_with_a_clear_message(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    _, cfg = setup_run(broker, names, tmp_path, ["r0"], settings={"fail_setup": True})
    rm = Ringmaster(cfg, tmp_path)
    try:
        code = rm.wait(60)
    finally:
        rm.close()
    assert code == 3
    assert "setup refused: fail_setup is set" in rm.log_path.read_text()


def test_recycling_by_batch_count_neither_loses_nor_repeats_work(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    values = [f"r{i}" for i in range(3000)]
    counts, cfg = setup_run(broker, names, tmp_path, values, batch_max_records=50, max_batches=8)
    rm = run_until_caught_up(cfg, tmp_path, timeout_s=120)
    outs = [json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 3000)]
    assert sorted(outs) == sorted(values), "every record exactly once"
    assert committed(broker.bootstrap, names["group"], names["in"], 2) == counts
    log = rm.log_path.read_text()
    assert log.count("worker recycled") >= 2, "workers were replaced between batches"
    final = rm.status()
    assert final is not None and final["restarts"] >= 2


def test_a_record_larger_than_a_ring_is_dead_lettered_not_hung(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    big = "big:" + "z" * 70_000  # a 64 KiB ring takes frames of at most 32 KiB
    values = [f"r{i}" for i in range(100)]
    values[41] = big
    counts, cfg = setup_run(broker, names, tmp_path, values, partitions=1, ring_bytes=65536)
    cfg["kafka"]["producer"]["message.max.bytes"] = 1_000_000
    run_until_caught_up(cfg, tmp_path, timeout_s=120)
    dead = read_topic(broker.bootstrap, names["dlq"], 1)
    assert [m.value().decode() for m in dead] == [big]
    assert dict(dead[0].headers())["ringmaster.error.type"] == b"RecordTooLarge"
    outs = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], 99)}
    assert outs == set(values) - {big}
    assert committed(broker.bootstrap, names["group"], names["in"], 1) == counts
