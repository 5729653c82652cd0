"""``scripts/bench --exactly-once``: what ``output.guarantee = "exactly-once"`` costs, against
at-least-once, in one invocation on Apache Kafka (docs/exactly-once.md).

Both guarantees run the same daemon (the benchkit.work plugin writing one output per record,
its value the input's), interleaved run by run:

* **throughput**: records / (partitions assigned → the group's committed offsets at the end
  of every partition), over a topic filled beforehand;
* **latency**: a fixed offered load of records stamped with their send time; a
  ``read_committed`` consumer of the output topic takes, for each output, the time from the
  input's send to the output being readable. Under exactly-once an output is readable only
  once its batch's transaction commits: that wait is the guarantee's latency.

Printed, and written to --out/exactly_once.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from runtime.dev.kafkabroker import ApacheKafkaBroker
from runtime.kafka.admin import ensure_topics

GUARANTEES = ("at-least-once", "exactly-once")


def _config(bench: ModuleType, bootstrap: str, topic: str, out: str, guarantee: str, processes: int,
            tmp: Path) -> tuple[Path, str, Path]:
    """A daemon's config file, its group, and its status file."""
    status = tmp / f"status-{uuid.uuid4().hex[:6]}.json"
    text = bench.ringmaster_config(bootstrap, topic, "trivial", 0, processes, {"echo": True},
                                   supervisor={"status_file": str(status), "status_interval_s": 0.1})
    found = re.search(r'group_id = "([^"]+)"', text)
    assert found is not None
    text += f'[output]\ntopic = "{out}"\nguarantee = "{guarantee}"\n'
    cfg = tmp / f"eos-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(text)
    return cfg, found.group(1), status


def _ends(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-ends"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(partitions)}
    finally:
        c.close()


def _committed_at(bootstrap: str, group: str, topic: str, ends: dict[int, int], timeout_s: float) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            try:
                got = c.committed([TopicPartition(topic, p) for p in ends], timeout=5)
            except KafkaException:
                got = []
            if got and all(t.offset == ends[t.partition] for t in got):
                return time.monotonic()
            time.sleep(0.05)
    finally:
        c.close()
    raise RuntimeError(f"group {group} did not commit the end of {topic} in {timeout_s:.0f} s")


def _start(bench: ModuleType, cfg: Path, status: Path,
           partitions: int) -> tuple[subprocess.Popen[bytes], float]:
    proc = subprocess.Popen([bench.PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--no-progress"],
                            env=bench.ENV, cwd=bench.ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    bench._wait("the daemon to take every partition", lambda: proc.poll() is not None or (
        (s := bench._read_status(status)) and len(s["partitions"]) == partitions), 120)
    if proc.poll() is not None:
        raise RuntimeError(f"ringmaster exited early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
    return proc, time.monotonic()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    if proc.wait(60) != 0:
        raise RuntimeError(f"ringmaster exited {proc.returncode}: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]


def throughput(bench: ModuleType, bootstrap: str, topic: str, n: int, partitions: int, guarantee: str,
               processes: int, tmp: Path) -> float:
    out = f"bench-eos-out-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [out], partitions=partitions)
    cfg, group, status = _config(bench, bootstrap, topic, out, guarantee, processes, tmp)
    ends = _ends(bootstrap, topic, partitions)
    proc, t0 = _start(bench, cfg, status, partitions)
    try:
        t1 = _committed_at(bootstrap, group, topic, ends, 900)
    finally:
        _stop(proc)
    return n / (t1 - t0)


def _read_outputs(bootstrap: str, topic: str, partitions: int, expect: int, stop: threading.Event,
                  got: list[float]) -> None:
    """Assigned, not subscribed: no group join delays the first outputs."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    try:
        while not stop.is_set() and len(got) < expect:
            for m in c.consume(1000, 0.1):
                if m.error() is None:
                    got.append((time.time_ns() - int((m.value() or b"0")[:19])) / 1e6)
    finally:
        c.close()


def latency(bench: ModuleType, bootstrap: str, partitions: int, guarantee: str, processes: int,
            rate: float, seconds: float, tmp: Path) -> dict[str, float]:
    topic, out = f"bench-eos-lat-{uuid.uuid4().hex[:6]}", f"bench-eos-latout-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [topic, out], partitions=partitions)
    cfg, _, status = _config(bench, bootstrap, topic, out, guarantee, processes, tmp)
    proc, _ = _start(bench, cfg, status, partitions)
    got: list[float] = []
    stop = threading.Event()
    n = int(rate * seconds)
    reader = threading.Thread(target=_read_outputs, args=(bootstrap, out, partitions, n, stop, got))
    reader.start()
    try:
        bench.offered_load(bootstrap, topic, rate, seconds)
        bench._wait("every output to be readable", lambda: len(got) >= n, 120)
    finally:
        stop.set()
        reader.join(30)
        _stop(proc)
    q = statistics.quantiles(sorted(got), n=100)
    return {"p50_ms": q[49], "p99_ms": q[98], "max_ms": max(got), "outputs": len(got)}


def compare(args: argparse.Namespace, bench: ModuleType) -> int:
    out_dir = Path(args.out)
    partitions, processes, n = args.partitions, args.eos_processes, args.records
    results: dict[str, Any] = {"records": n, "partitions": partitions, "processes": processes,
                               "latency_rate": args.eos_rate, "latency_seconds": args.latency_seconds,
                               "throughput": {g: [] for g in GUARANTEES},
                               "latency": {g: [] for g in GUARANTEES}}
    with tempfile.TemporaryDirectory() as tmpdir, ApacheKafkaBroker() as broker:
        tmp = Path(tmpdir)
        topic = f"bench-eos-in-{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.bootstrap, [topic], partitions=partitions)
        bench.produce(broker.bootstrap, topic, n, [256])
        for i in range(args.runs):  # interleaved: the machine's drift hits both alike
            for g in GUARANTEES:
                rate = throughput(bench, broker.bootstrap, topic, n, partitions, g, processes, tmp)
                results["throughput"][g].append(rate)
                bench.console.print(f"  throughput {g} run {i + 1}: {rate:,.0f} records/s")
            for g in GUARANTEES:
                lat = latency(bench, broker.bootstrap, partitions, g, processes, args.eos_rate,
                              args.latency_seconds, tmp)
                results["latency"][g].append(lat)
                bench.console.print(f"  latency {g} run {i + 1} at {args.eos_rate:,.0f}/s: p50 "
                                    f"{lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms")
    for g in GUARANTEES:
        rates = results["throughput"][g]
        lats = results["latency"][g]
        bench.console.print(f"{g}: throughput median {statistics.median(rates):,.0f} records/s "
                            f"(min {min(rates):,.0f}, max {max(rates):,.0f}); p50 median "
                            f"{statistics.median(x['p50_ms'] for x in lats):.1f} ms, p99 median "
                            f"{statistics.median(x['p99_ms'] for x in lats):.1f} ms")
    (out_dir / "exactly_once.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0
