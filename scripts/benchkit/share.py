"""``scripts/bench --share``: share groups (KIP-932) against consumer groups, on Apache Kafka.

Two daemons of one worker each, in one invocation, interleaved (run 1 of each case, then run
2, ...), each case over its own topic and group:

* share, 1 partition: both daemons take records of the one partition;
* consumer, 1 partition: one daemon gets the partition, the other stays idle;
* consumer ``unordered``, 8 partitions, and share, 8 partitions.

Throughput is records / (first record any daemon consumed → the records processed, summed
over both, reach the number produced), from the daemons' status files (window_s and taken_at
lie on one time line). A share group may process a record twice (a lock that ran out): the
sum counts every run. Printed and written to --out/share.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from confluent_kafka import Producer

from benchkit.work import calibrate
from runtime.dev.kafkabroker import ApacheKafkaBroker
from runtime.kafka.admin import ensure_topics


def _config(bootstrap: str, topic: str, group: str, group_type: str, iterations: int, status: Path) -> str:
    consumer = "" if group_type == "share" else '"session.timeout.ms" = 6000\n"heartbeat.interval.ms" = 500\n'
    return f"""[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "{group}"
topics = ["{topic}"]
group_type = "{group_type}"
[kafka.consumer]
{consumer}[workers]
plugin = "benchkit.work"
processes = 1
ordering = "unordered"
[workers.settings]
workload = "cpu"
iterations = {iterations}
[supervisor]
log_level = "WARNING"
status_file = "{status}"
control_socket = "{status.with_suffix(".sock")}"
status_interval_s = 0.2
"""


def _produce(bootstrap: str, topic: str, n: int) -> None:
    """256 B records in producer batches of 100: the broker hands a share group's records out
    a whole producer batch at a time (docs/share-groups.md), so big batches would go to one
    daemon whole. The same records for every case."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 100})
    blob = os.urandom(256)
    for i in range(n):
        while True:
            try:
                p.produce(topic, blob, key=str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def run_case(bench: ModuleType, bootstrap: str, topic: str, records: int, group_type: str,
             iterations: int, tmp: Path, daemons: int = 2) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    procs, statuses = [], []
    for i in range(daemons):
        status = tmp / f"{group}-{i}.status.json"
        cfg = tmp / f"{group}-{i}.toml"
        cfg.write_text(_config(bootstrap, topic, group, group_type, iterations, status))
        statuses.append(status)
        procs.append(subprocess.Popen([bench.PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--no-progress"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=bench.ENV,
                                      cwd=bench.ROOT))
    try:
        deadline = time.monotonic() + 900
        while True:
            snaps = []
            for s in statuses:
                with contextlib.suppress(OSError, ValueError):  # not written yet, or half-written
                    snaps.append(json.loads(s.read_text()))
            done = sum(s["records"] for s in snaps)
            if len(snaps) == daemons and done >= records:
                break
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError(f"{group_type}: {done} of {records} records processed")
            time.sleep(0.1)
        working = [s for s in snaps if s["records"]]
        start = min(s["taken_at"] - s["window_s"] for s in working)
        end = max(s["taken_at"] for s in snaps)
        return {"records": done, "window_s": end - start, "per_daemon": [s["records"] for s in snaps],
                "share": [s.get("share") for s in snaps]}
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def compare(args: argparse.Namespace, bench: ModuleType) -> int:
    iterations, work_us = calibrate(args.share_work_us)
    n = args.records
    bench.console.print(f"cpu work: {iterations} iterations = {work_us:.1f} µs/record; {n:,} records a case")
    cases = [("share, 1 partition", 1, "share"), ("consumer, 1 partition", 1, "consumer"),
             ("consumer unordered, 8 partitions", 8, "consumer"), ("share, 8 partitions", 8, "share")]
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _, _ in cases}
    with tempfile.TemporaryDirectory() as tmpdir, ApacheKafkaBroker() as broker:
        tmp = Path(tmpdir)
        topics = {}
        for parts in (1, 8):
            topic = f"bench-share-{parts}p-{uuid.uuid4().hex[:6]}"
            ensure_topics(broker.bootstrap, [topic], partitions=parts)
            _produce(broker.bootstrap, topic, n)
            topics[parts] = topic
        for i in range(args.runs):
            for label, parts, group_type in cases:
                r = run_case(bench, broker.bootstrap, topics[parts], n, group_type, iterations, tmp)
                r["rate"] = r["records"] / r["window_s"]
                results[label].append(r)
                bench.console.print(f"  {label} run {i + 1}: {r['rate']:,.0f} rec/s, records per daemon "
                                    f"{r['per_daemon']}")
    summary = [{"label": label, "median": statistics.median(r["rate"] for r in rs),
                "min": min(r["rate"] for r in rs), "max": max(r["rate"] for r in rs), "runs": rs}
               for label, rs in results.items()]
    for s in summary:
        bench.console.print(f"{s['label']}: median {s['median']:,.0f} rec/s (min {s['min']:,.0f}, "
                            f"max {s['max']:,.0f})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "share.json").write_text(json.dumps({"records": n, "work_us": work_us, "cpus": os.cpu_count(),
                                                "cases": summary}, indent=2))
    return 0
