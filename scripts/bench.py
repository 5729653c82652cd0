"""scripts/bench: ringmaster against the consumers a user would pick instead, on the same
machine, the same records and the same work, in one invocation.

Throughput is records / (first record consumed → all offsets committed), so group joins do
not count. Every configuration runs --runs times (≥ 3); the table gives min/median/max and
the ratio of medians against the single-process baseline of the same invocation, because
this machine is small and noisy: only ratios travel. Outputs: docs/bench.md, docs/bench.png,
docs/bench.json (for comparing runs).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from benchkit.work import calibrate, time_work  # noqa: E402

from runtime.dev.tansu import DevBroker, free_port  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402

console = Console(stderr=True)
PY = str(ROOT / ".venv" / "bin" / "python")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), str(ROOT)]))


def precompile(roots: list[Path]) -> None:
    """Byte-compile each checkout's code in place (``__pycache__``, which git ignores), as pip
    leaves an installed package, and let the runs write what else they import. Without it, a
    shell with PYTHONDONTWRITEBYTECODE=1 made ringmaster compile ~100 modules at every start,
    in the supervisor (~0.45 s of CPU) and in each worker, counted in every run's CPU a record,
    while the peers' libraries came compiled."""
    ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    for root in roots:
        dirs = [str(root / d) for d in ("runtime", "workers", "scripts") if (root / d).is_dir()]
        subprocess.run([str(root / ".venv" / "bin" / "python"), "-m", "compileall", "-q", *dirs],
                       env=ENV, check=True, capture_output=True, timeout=300)


def produce(bootstrap: str, topic: str, n: int, sizes: list[int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    blobs = [os.urandom(s) for s in sizes]
    for i in range(n):
        while True:
            try:
                p.produce(topic, blobs[i % len(blobs)], key=str(i).encode())
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def busy_cpu_s() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + t.nice + getattr(t, "irq", 0) + getattr(t, "softirq", 0)


# What each workload reads: topic, a share of --records (1/n), value sizes (cycled).
DATA_SETS = {"trivial": ("bench-256", 1, [256]), "cpu": ("bench-256", 1, [256]),
             "mixed": ("bench-mixed", 4, [100, 10240])}


def make_data_sets(bootstrap: str, workloads: list[str], records: int,
                   partitions: int) -> dict[str, tuple[str, int]]:
    """Create and fill each topic the workloads need, once; workload -> (topic, records)."""
    out: dict[str, tuple[str, int]] = {}
    filled: set[str] = set()
    for workload in workloads:
        topic, share, sizes = DATA_SETS[workload]
        n = records // share
        if topic not in filled:
            ensure_topics(bootstrap, [topic], partitions=partitions)
            produce(bootstrap, topic, n, sizes)
            filled.add(topic)
        out[workload] = (topic, n)
    return out


def run_peer(kind: str, bootstrap: str, topic: str, records: int, workload: str, iterations: int,
             processes: int, output_topic: str | None = None) -> dict[str, Any]:
    more = ["--output-topic", output_topic] if output_topic else []
    out = subprocess.run([PY, "-m", "benchkit.runners", kind, "--bootstrap", bootstrap, "--topic", topic,
                          "--group", f"bench-{uuid.uuid4().hex[:8]}", "--records", str(records),
                          "--workload", workload, "--iterations", str(iterations),
                          "--processes", str(processes), *more],
                         capture_output=True, text=True, env=ENV, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _toml(table: dict[str, Any]) -> str:
    return "\n".join(f"{json.dumps(k) if '.' in k else k} = {json.dumps(v)}" for k, v in table.items())


def ringmaster_config(bootstrap: str, topic: str, workload: str, iterations: int, processes: int,
                      extra: dict[str, Any] | None = None, *, consumer: dict[str, Any] | None = None,
                      workers: dict[str, Any] | None = None,
                      supervisor: dict[str, Any] | None = None) -> str:
    settings = {"workload": workload, "iterations": iterations, **(extra or {})}
    return f"""[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{uuid.uuid4().hex[:8]}"
topics = ["{topic}"]
[kafka.consumer]
{_toml({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **(consumer or {})})}
[workers]
plugin = "benchkit.work"
{_toml({"processes": processes, **(workers or {})})}
[workers.settings]
{_toml(settings)}
[supervisor]
{_toml({"log_level": "WARNING", **(supervisor or {})})}
"""


def run_ringmaster(bootstrap: str, topic: str, records: int, workload: str, iterations: int,
                   processes: int, tmp: Path, overrides: dict[str, str] | None = None,
                   root: Path = ROOT) -> dict[str, Any]:
    """One `ringmaster run --until-caught-up`; overrides are RINGMASTER__… variables. ``root``:
    another checkout with its own .venv (an older version, compared in the same invocation)."""
    cfg = tmp / f"rm-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(ringmaster_config(bootstrap, topic, workload, iterations, processes))
    summary = tmp / "summary.json"
    env = dict(ENV, PYTHONPATH=os.pathsep.join([str(root / "scripts"), str(root)])) if root != ROOT else ENV
    out = subprocess.run([str(root / ".venv" / "bin" / "python"), "-m", "runtime.cli", "run", "-c", str(cfg),
                          "--until-caught-up", "--no-progress", "--summary-json", str(summary)],
                         capture_output=True, text=True, env={**env, **(overrides or {})}, timeout=900,
                         cwd=root)
    if out.returncode != 0:
        raise RuntimeError(f"ringmaster failed: {out.stderr[-2000:]}")
    s = json.loads(summary.read_text())
    return {"records": s["records"], "window_s": s["window_s"],
            "main_cpu_s": s["window_cpu_s"]["supervisor"], "worker_cpu_s": s["window_cpu_s"]["workers"],
            "total_cpu_s": s["supervisor_cpu_s"] + sum(w["cpu_s"] or 0 for w in s["workers"]),
            # time each worker spent on batches, as a share of the window (1.0: never idle)
            "busy_shares": [round(w.get("busy_s", 0.0) / s["window_s"], 3) for w in s["workers"]]}


def measure_all(cases: list[tuple[str, Any]], runs: int) -> list[dict[str, Any]]:
    """Run every (label, fn) case `runs` times, interleaved (run 1 of each, then run 2 of
    each, ...): this machine's speed drifts by 10-40 % over minutes (host steal), and
    consecutive runs of one consumer would pin the drift on whoever ran at a bad time."""
    results: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in cases}
    for i in range(runs):
        for label, fn in cases:
            busy0, t0 = busy_cpu_s(), time.monotonic()
            r = fn()
            busy1, wall = busy_cpu_s(), time.monotonic() - t0
            ours = r["total_cpu_s"]
            # CPU the rest of the machine used during this run, as a share of all cores.
            r["others_share"] = max(0.0, (busy1 - busy0 - ours) / (wall * psutil.cpu_count()))
            r["rate"] = r["records"] / r["window_s"]
            results[label].append(r)
            console.print(f"  {label} run {i + 1}: {r['rate']:,.0f} rec/s "
                          f"(main {r['main_cpu_s']:.2f} s, workers {r['worker_cpu_s']:.2f} s CPU, "
                          f"others {r['others_share']:.0%})")
    return [summarize(label, results[label]) for label, _ in cases]


def summarize(label: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    rates = sorted(r["rate"] for r in results)
    return {"label": label, "runs": results, "min": rates[0], "median": statistics.median(rates),
            "max": rates[-1],
            "main_us_per_record": statistics.median(r["main_cpu_s"] / r["records"] * 1e6 for r in results),
            "worker_us_per_record": statistics.median(r["worker_cpu_s"] / r["records"] * 1e6
                                                      for r in results),
            "others_share": statistics.median(r["others_share"] for r in results)}


# The embedded broker answers a fetch only when fetch.wait.max.ms runs out, not when data
# arrives (measured: a plain consumer's p50 is 150 ms at librdkafka's default 500 ms, 35 ms
# at 25 ms), while Apache Kafka answers as soon as fetch.min.bytes are there. Latency runs
# use 10 ms for every consumer so that this artifact stays small against what is measured
# (the last stop used 25 ms); against Apache Kafka leave it alone.
LATENCY_CONSUMER = {"fetch.wait.max.ms": 10}


def offered_load(bootstrap: str, topic: str, rate: float, seconds: float) -> int:
    """Produce records stamped with their send time at a fixed rate; returns the count."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
    n = int(rate * seconds)
    pad = b" " * 237
    start = time.monotonic()
    for i in range(n):
        ahead = start + i / rate - time.monotonic()
        if ahead > 0.002:  # bursts of ≤ 2 ms: the load generator's own CPU stays small
            time.sleep(ahead)
        p.produce(topic, f"{time.time_ns():019d}".encode() + pad)
        p.poll(0)
    p.flush(30)
    return n


def _read_status(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait(what: str, check: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def latency(kind: str, bootstrap: str, rate: float, seconds: float, iterations: int, partitions: int,
            tmp: Path) -> dict[str, Any]:
    """p50/p99 produce → processed at a fixed offered load with cpu work, for ringmaster or
    the single-process baseline, on a fresh topic."""
    topic = f"bench-lat-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [topic], partitions=partitions)
    ldir = tmp / f"lat-{uuid.uuid4().hex[:6]}"
    ldir.mkdir()
    status = ldir / "status.json"
    if kind == "ringmaster":
        cfg = tmp / f"lat-{uuid.uuid4().hex[:6]}.toml"
        cfg.write_text(ringmaster_config(bootstrap, topic, "cpu", iterations, psutil.cpu_count(),
                                         {"latency_dir": str(ldir)}, consumer=LATENCY_CONSUMER,
                                         supervisor={"status_file": str(status), "status_interval_s": 0.2}))
        cmd = [PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--no-progress"]
        ready = lambda: (s := _read_status(status)) and len(s["partitions"]) == partitions  # noqa: E731
    else:
        cmd = [PY, "-m", "benchkit.runners", "latency", "--bootstrap", bootstrap, "--topic", topic,
               "--group", f"bench-{uuid.uuid4().hex[:8]}", "--records", "0", "--workload", "cpu",
               "--iterations", str(iterations), "--latency-dir", str(ldir),
               "--fetch-wait-ms", str(LATENCY_CONSUMER["fetch.wait.max.ms"])]
        ready = (ldir / "ready").exists
    proc = subprocess.Popen(cmd, env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(f"{kind} to join the group", lambda: proc.poll() is not None or ready(), 60)
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited early: {proc.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
        busy0, t0 = busy_cpu_s(), time.monotonic()
        n = offered_load(bootstrap, topic, rate, seconds)

        def samples() -> list[float]:
            return [float(x) for f in ldir.glob("*.lat") for x in f.read_text().split()]
        _wait("every record to be processed", lambda: len(samples()) >= n, 60)
        machine_busy = (busy_cpu_s() - busy0) / ((time.monotonic() - t0) * psutil.cpu_count())
    finally:
        proc.terminate()
        proc.wait(60)
    got = sorted(samples())
    q = statistics.quantiles(got, n=100)
    result = {"consumer": kind, "offered_rate": rate, "records": len(got), "p50_ms": q[49],
              "p90_ms": q[89], "p99_ms": q[98], "max_ms": got[-1], "machine_busy": machine_busy}
    console.print(f"  latency {kind} at {rate:,.0f}/s: p50 {q[49]:.1f} ms, p99 {q[98]:.1f} ms "
                  f"(machine {machine_busy:.0%} busy)")
    return result


def latency_runs(lat: Any, kind: str, rate: float, runs: int) -> dict[str, Any]:
    """The same latency case `runs` times: this machine's speed drifts by ±15 % from minute
    to minute (steal time), so one run says little. Medians of each figure, and the range
    of p99."""
    each = [lat(kind, rate=rate) for _ in range(runs)]
    out = {k: statistics.median(r[k] for r in each)
           for k in ("p50_ms", "p90_ms", "p99_ms", "max_ms", "machine_busy")}
    p99 = sorted(r["p99_ms"] for r in each)
    return {"consumer": kind, "offered_rate": rate, "runs": each, "p99_min_ms": p99[0], "p99_max_ms": p99[-1],
            "records": each[0]["records"], **out}


def rebalance_and_memory(bootstrap: str, partitions: int, iterations: int, work_us: float,
                         tmp: Path, rss_seconds: float = 10.0) -> dict[str, Any]:
    """A member with full rings: its supervisor's RSS over time, then how long it takes to
    give partitions away when a second member joins (fenced: one batch, not a ring). On a
    topic of its own, with enough records that the member is still busy when the second
    one joins (its 2 workers do 4 × the cpu work per record)."""
    batch_records, heavy = 250, iterations * 4
    topic = f"bench-rebalance-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [topic], partitions=partitions)
    produce(bootstrap, topic, int((rss_seconds + 40) * 2 / (4 * work_us * 1e-6)), [256])
    st_a, st_b = tmp / "rebal-a.json", tmp / "rebal-b.json"
    group_cfg = ringmaster_config(bootstrap, topic, "cpu", heavy, 2,
                                  workers={"batch_max_records": batch_records, "ring_bytes": 4 * 2**20},
                                  supervisor={"status_file": str(st_a), "status_interval_s": 0.25,
                                              "control_socket": str(tmp / "rebal-a.sock")})
    cfg_a, cfg_b = tmp / "rebal-a.toml", tmp / "rebal-b.toml"
    cfg_a.write_text(group_cfg)
    # Two members of one group on one host: each needs a status file and a control socket.
    cfg_b.write_text(group_cfg.replace("rebal-a", "rebal-b"))
    run = [PY, "-m", "runtime.cli", "run", "--no-progress", "-c"]
    a = subprocess.Popen([*run, str(cfg_a)], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    b = None
    try:
        full = _wait("member A's rings to fill (needs --records ≥ 40,000)",
                     lambda: (s := _read_status(st_a)) and s["paused"] > 0 and s, 90)
        rss, fills = [], []
        t_end = time.monotonic() + rss_seconds
        while time.monotonic() < t_end:
            s = _read_status(st_a)
            if s:
                rss.append(s["supervisor_rss"])
                fills.append(max(w["ring_fill"] for w in s["workers"]))
            time.sleep(0.25)
        in_ring = max(w["in_flight"] for w in (_read_status(st_a) or full)["workers"])
        b = subprocess.Popen([*run, str(cfg_b)], env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        revoked = _wait("member A to give partitions to B", lambda: (s := _read_status(st_a))
                        and s["revocations"], 90)
        _wait("member B to start on them", lambda: (s := _read_status(st_b)) and s["partitions"], 90)
        # Shutdown is a revocation of everything A still owns, rings still full.
        stop_started = time.monotonic()
        a.terminate()
        a.wait(60)
        stop_s = time.monotonic() - stop_started
        final = (_read_status(st_a) or {}).get("revocations", [])[-1:]
    finally:
        for proc in (a, b):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    work_us *= 4
    result = {"revoke_ms": revoked[0]["ms"], "revoke_fenced_ms": revoked[0]["fenced_ms"],
              "partitions_revoked": len(revoked[0]["partitions"]),
              "shutdown_release_ms": final[0]["ms"] if final else None,
              "shutdown_fenced_ms": final[0]["fenced_ms"] if final else None, "sigterm_to_exit_s": stop_s,
              "batch_ms": batch_records * work_us / 1000, "batches_in_ring": in_ring,
              "ring_work_ms": in_ring * batch_records * work_us / 1000,
              "rss_mb_first": rss[0] / 2**20, "rss_mb_last": rss[-1] / 2**20,
              "rss_mb_max": max(rss) / 2**20, "rss_samples": len(rss), "ring_fill_min": min(fills),
              "rss_seconds": rss_seconds, "rss_mb_series": [round(x / 2**20, 1) for x in rss],
              "rss_mb_median_first_half": statistics.median(rss[:len(rss) // 2]) / 2**20,
              "rss_mb_median_second_half": statistics.median(rss[len(rss) // 2:]) / 2**20,
              "rss_mb_min": min(rss) / 2**20}
    console.print(f"  revocation with full rings: {result['revoke_ms']:.0f} ms, fenced in "
                  f"{result['revoke_fenced_ms']:.0f} ms (one batch "
                  f"{result['batch_ms']:.0f} ms; {in_ring} batches = {result['ring_work_ms']:,.0f} ms "
                  f"of work in the ring); supervisor RSS {result['rss_mb_first']:.1f} → "
                  f"{result['rss_mb_last']:.1f} MiB over {len(rss)} samples; SIGTERM → exit "
                  f"{stop_s:.2f} s (release {result['shutdown_release_ms']} ms, fenced in "
                  f"{result['shutdown_fenced_ms']} ms)")
    return result


# The Tuning table of docs/performance.md: (knob, RINGMASTER__ overrides, workload); ringmaster with
# 2 processes, each against the baseline loop of the same invocation.
_W = "RINGMASTER__WORKERS__"
_C = "RINGMASTER__KAFKA__CONSUMER__"
TUNING = [
    ("defaults (ring 8 MiB, batch 500, fetch.wait.max.ms 100)", {}, "trivial"),
    ("workers.ring_bytes = 1 MiB", {_W + "RING_BYTES": "1048576"}, "trivial"),
    ("workers.ring_bytes = 32 MiB", {_W + "RING_BYTES": "33554432"}, "trivial"),
    ("workers.batch_max_records = 100", {_W + "BATCH_MAX_RECORDS": "100"}, "trivial"),
    ("workers.batch_max_records = 2000", {_W + "BATCH_MAX_RECORDS": "2000"}, "trivial"),
    ("workers.processes = 1", {_W + "PROCESSES": "1"}, "trivial"),
    ("ring 1 MiB and fetch.wait.max.ms = 500 (librdkafka's default)",
     {_W + "RING_BYTES": "1048576", _C + "FETCH_WAIT_MAX_MS": "500"}, "trivial"),
    ("fetch.queue.backoff.ms = 1000 (librdkafka's default)",
     {_C + "FETCH_QUEUE_BACKOFF_MS": "1000"}, "trivial"),
    ("defaults", {}, "mixed"),
    ("workers.ring_bytes = 32 MiB", {_W + "RING_BYTES": "33554432"}, "mixed"),
]


def tuning_sweep(args: argparse.Namespace) -> int:
    """--tuning: re-measure every line of docs/performance.md's Tuning table in one invocation."""
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        data = make_data_sets(broker.bootstrap, ["trivial", "mixed"], args.records, args.partitions)
        base: dict[str, float] = {}
        for workload, (topic, n) in data.items():
            cases = [(f"baseline ({workload})", functools.partial(
                run_peer, "baseline", broker.bootstrap, topic, n, workload, 0, 1))]
            settings = [(label, overrides) for label, overrides, w in TUNING if w == workload]
            cases += [(f"{label} ({workload})", functools.partial(
                run_ringmaster, broker.bootstrap, topic, n, workload, 0, 2, tmp, overrides))
                for label, overrides in settings]
            measured = measure_all(cases, args.runs)
            base[workload] = measured[0]["median"]
            rows += [{"setting": label, "workload": workload, "overrides": overrides,
                      "x_baseline": r["median"] / base[workload], **r}
                     for (label, overrides), r in zip(settings, measured[1:], strict=True)]
    md = [f"# Tuning measurements\n\nringmaster with 2 processes, {args.records:,} × 256 B records (mixed: "
          f"{args.records // 4:,}, 100 B and 10 KiB), {args.partitions} partitions, embedded broker, "
          f"{psutil.cpu_count()} cores; {args.runs} runs each; × baseline is against the single-process "
          "loop of the same invocation. Produced by `./scripts/bench --tuning`.\n",
          "| workload | setting | records/s min / median / max | × baseline | supervisor µs/record |",
          "|---|---|---|---|---|"]
    md += [f"| {r['workload']} | {r['setting']} | {r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f} | "
           f"{r['x_baseline']:.2f} | {r['main_us_per_record']:.2f} |" for r in rows]
    out.mkdir(parents=True, exist_ok=True)
    (out / "tuning.md").write_text("\n".join(md) + "\n")
    (out / "tuning.json").write_text(json.dumps({"baseline": base, "rows": rows}, indent=2))
    console.print("\n".join(md))
    return 0


def produce_keyed(bootstrap: str, topic: str, n: int, keys: int, partition_of: Any) -> None:
    """256-byte records whose key is one of `keys` and whose partition is partition_of(i)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    blob = os.urandom(256)
    for i in range(n):
        while True:
            try:
                p.produce(topic, blob, key=f"key-{i % keys}".encode(), partition=partition_of(i))
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


# The ordering sweep's data sets: (name, partitions, keys, partition of record i).
ORDERING_SETS = [
    ("one partition, 200 keys", 1, 200, lambda i: 0),
    ("skewed: 4 partitions, 80 % in one, 1,000 keys", 4, 1000, lambda i: 0 if i % 10 < 8 else 1 + i % 3),
]


def render_ordering(data: dict[str, Any]) -> list[str]:
    """docs/ordering.md: ratios against partition ordering of the same invocation only (a
    share of a limit timed in another step would carry the machine's drift)."""
    md = [f"# Ordering modes\n\n{data['records']:,} × 256 B records, cpu work ~{data['work_us']:.0f} "
          f"µs/record ({data['work_us_after']:.0f} µs when timed again after the runs), ringmaster with 2 "
          f"processes, embedded broker, {psutil.cpu_count()} cores, {data['runs']} interleaved runs each. "
          "× partition is the median against `ordering = \"partition\"` on the same data in the same "
          "invocation. Produced by `./scripts/bench --ordering --records 40000`.\n"]
    for s in data["sets"]:
        md += [f"## {s['data']}\n", "| ordering | records/s min / median / max | × partition | "
               "supervisor µs/record | workers µs/record |", "|---|---|---|---|---|"]
        md += [f"| {r['ordering']} | {r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f} | "
               f"{r['x_partition']:.2f} | {r['main_us_per_record']:.2f} | {r['worker_us_per_record']:.1f} |"
               for r in s["rows"]]
        md.append("")
    return md


def ordering_sweep(args: argparse.Namespace) -> int:
    """--ordering: workers.ordering = partition / key / unordered on one hot partition and on a
    skewed topic, cpu work, 2 processes, interleaved runs; ratios against partition ordering
    of the same invocation (and against the 2-core limit of the work unit)."""
    out = Path(args.out)
    n = args.records
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        iterations, work_us = calibrate()
        console.print(f"work unit: {work_us:.1f} µs ({iterations} iterations)")
        sets = []
        for name, partitions, keys, partition_of in ORDERING_SETS:
            topic = f"bench-order-{uuid.uuid4().hex[:6]}"
            ensure_topics(broker.bootstrap, [topic], partitions=partitions)
            produce_keyed(broker.bootstrap, topic, n, keys, partition_of)
            cases = [(f"{mode} ({name})", functools.partial(
                run_ringmaster, broker.bootstrap, topic, n, "cpu", iterations, 2, tmp,
                {"RINGMASTER__WORKERS__ORDERING": mode})) for mode in ("partition", "key", "unordered")]
            measured = measure_all(cases, args.runs)
            base = measured[0]["median"]
            sets.append({"data": name, "rows": [{"ordering": mode, "x_partition": r["median"] / base, **r}
                                                for mode, r in zip(("partition", "key", "unordered"),
                                                                   measured, strict=True)]})
        work_after = time_work(iterations)
    data = {"work_us": work_us, "work_us_after": work_after, "records": n, "runs": args.runs, "sets": sets}
    md = render_ordering(data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ordering.md").write_text("\n".join(md) + "\n")
    (out / "ordering.json").write_text(json.dumps(data, indent=2))
    console.print("\n".join(md))
    return 0


class Pollers:
    """Clients polling the admin endpoint as monitoring does: each asks for /status and
    /metrics every `interval_s` on a keep-alive connection (reconnecting when refused, e.g.
    before the daemon listens). Threads of this process: they sleep between polls."""

    def __init__(self, port: int, clients: int, interval_s: float) -> None:
        import threading

        self.port, self.interval_s = port, interval_s
        self.answers = self.failures = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Pollers:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(5)

    def _poll(self) -> None:
        import http.client

        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                for path in ("/status", "/metrics"):
                    conn.request("GET", path)
                    resp = conn.getresponse()
                    resp.read()
                    self.answers += resp.status == 200
            except (OSError, http.client.HTTPException):
                self.failures += 1
                if conn is not None:
                    conn.close()
                conn = None
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))
        if conn is not None:
            conn.close()


def run_polled(bootstrap: str, topic: str, records: int, processes: int, tmp: Path, clients: int,
               interval_s: float = 0.1) -> dict[str, Any]:
    """One trivial-work `ringmaster run --until-caught-up` with [admin] listen set, polled by
    `clients` clients (0: nobody asks)."""
    port = free_port()
    overrides = {"RINGMASTER__ADMIN__LISTEN": f"127.0.0.1:{port}"}
    started = time.monotonic()
    with Pollers(port, clients, interval_s) as pollers:
        r = run_ringmaster(bootstrap, topic, records, "trivial", 0, processes, tmp, overrides)
    r["admin_answers"], r["admin_failures"] = pollers.answers, pollers.failures
    r["admin_answers_per_s"] = pollers.answers / (time.monotonic() - started)
    return r


def admin_thread_cost(seconds: float = 5.0) -> dict[str, float]:
    """The admin server alone, in this process, polled as in --admin-load (80 requests/s
    from another process) with the snapshot replaced every second as the supervisor does:
    its CPU per second, i.e. what it takes from the supervisor's GIL. A figure this noisy
    machine cannot blur, unlike a throughput ratio."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    from dataclasses import replace

    from test_admin_metrics import snapshot

    from runtime.ops.admin_server import AdminServer, Health
    from runtime.ops.metrics import RuntimeMetrics

    current = [snapshot()]
    metrics = RuntimeMetrics(lambda: current[0], loop_age=lambda: 0.1, group="bench")
    server = AdminServer("127.0.0.1:0", False, metrics, lambda: current[0], lambda: Health(True, []),
                         lambda: True).start()
    port = server.address.rsplit(":", 1)[1]
    client = ("import http.client, time\n"
              f"c = http.client.HTTPConnection('127.0.0.1', {port})\n"
              f"n = 0; end = time.monotonic() + {seconds}\n"
              "while time.monotonic() < end:\n"
              "    for p in ('/status', '/metrics'):\n"
              "        c.request('GET', p); c.getresponse().read(); n += 1\n"
              "    time.sleep(0.025)\n"
              "print(n)")
    try:
        cpu0, t0 = time.process_time(), time.monotonic()
        proc = subprocess.Popen([PY, "-c", client], stdout=subprocess.PIPE, text=True)
        while proc.poll() is None:
            time.sleep(1.0)
            current[0] = replace(current[0], records=current[0].records + 1)  # a new snapshot
        cpu, wall = time.process_time() - cpu0, time.monotonic() - t0
        requests = int(proc.stdout.read())  # type: ignore[union-attr]
    finally:
        server.close()
    return {"requests_per_s": requests / wall, "cpu_share": cpu / wall,
            "us_per_request": cpu / requests * 1e6}


def admin_load(args: argparse.Namespace) -> int:
    """--admin-load: what monitoring costs the loop. Trivial work (the supervisor is the
    bottleneck, so its GIL is what the admin thread competes for), ringmaster with
    --max-processes workers, with nobody polling and with 4 clients polling /status and
    /metrics every 100 ms; interleaved runs, min/median/max, and the ratio of medians
    (issue 17.4: within 5 %)."""
    out = Path(args.out)
    procs = args.max_processes
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        (topic, n), = make_data_sets(broker.bootstrap, ["trivial"], args.records, args.partitions).values()
        cases = [(label, functools.partial(run_polled, broker.bootstrap, topic, n, procs, tmp, clients))
                 for label, clients in (("nobody polling", 0), ("4 clients polling every 100 ms", 4))]
        quiet, polled = measure_all(cases, args.runs)
    cost = admin_thread_cost()
    ratio = polled["median"] / quiet["median"]
    answers = [r["admin_answers_per_s"] for r in polled["runs"]]
    md = [f"# What polling the admin endpoint costs\n\n{n:,} × 256 B records, trivial work, ringmaster "
          f"with {procs} processes, {args.partitions} partitions, embedded broker, "
          f"{psutil.cpu_count()} cores, "
          f"{args.runs} interleaved runs each. Polled: 4 clients each asking for /status and /metrics every "
          f"100 ms on keep-alive connections (about {statistics.median(answers):.0f} answers/s). Produced by "
          f"`./scripts/bench --admin-load --records {args.records} --runs {args.runs}`.\n",
          "| case | records/s min / median / max | supervisor µs/record |", "|---|---|---|"]
    md += [f"| {r['label']} | {r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f} | "
           f"{r['main_us_per_record']:.2f} |" for r in (quiet, polled)]
    md.append(f"\nPolled / not polled, medians: **{ratio:.3f}** ({(ratio - 1) * 100:+.1f} %).")
    md.append(f"\nThe admin server alone, polled the same way ({cost['requests_per_s']:.0f} requests/s, "
              f"a new snapshot every second): **{cost['cpu_share']:.2%} of a core** "
              f"({cost['us_per_request']:.0f} µs of CPU per request, rendering included): the share of "
              "the supervisor's GIL it can take.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "admin_load.md").write_text("\n".join(md) + "\n")
    (out / "admin_load.json").write_text(json.dumps({"quiet": quiet, "polled": polled, "ratio": ratio,
                                                     "admin_thread": cost}, indent=2))
    console.print("\n".join(md))
    return 0


def main() -> int:
    # SIGTERM unwinds like Ctrl-C: the broker and runs in progress are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workloads", default="trivial,cpu,mixed")
    ap.add_argument("--peers", default="baseline,pool,arroyo")
    ap.add_argument("--max-processes", type=int, default=psutil.cpu_count())
    ap.add_argument("--out", default=str(ROOT / "docs"))
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--skip-latency", action="store_true",
                    help="no latency, revocation or memory figures")
    ap.add_argument("--rss-seconds", type=float, default=10.0,
                    help="how long to watch the supervisor's RSS with full rings")
    ap.add_argument("--ordering", action="store_true",
                    help="workers.ordering partition/key/unordered on a hot partition and a skewed topic "
                         "(docs/ordering.md); use --records 40000")
    ap.add_argument("--tuning", action="store_true",
                    help="re-measure docs/performance.md's Tuning table into docs/tuning.md and "
                         "docs/tuning.json")
    ap.add_argument("--scale", action="store_true",
                    help="the scaling sweep: plain loop, Pool(N), arroyo(N) and ringmaster(N) in every "
                         "ordering for N in 1, 2, 4, 8, cores-1, cores (docs/scaling.md)")
    ap.add_argument("--scale-workers", default=None,
                    help="--scale: the N to run, e.g. 1,2 (default: see --scale)")
    ap.add_argument("--scale-partitions", default="32,13", help="--scale: partition counts of the topics")
    ap.add_argument("--scale-work-us", default="100,10", help="--scale: µs of work per record")
    ap.add_argument("--scale-seconds", type=float, default=4.0,
                    help="--scale: records per run = this many seconds of work on one core")
    ap.add_argument("--scale-orderings", default="partition,key,unordered",
                    help="--scale: the ringmaster orderings to run")
    ap.add_argument("--scale-against", default=None, metavar="DIR[,DIR]",
                    help="--scale, --naive: also run ringmaster from these checkouts (each with its own "
                         ".venv and C build), interleaved with this one: old against new in one invocation")
    ap.add_argument("--simulate", action="store_true",
                    help="the real supervisor loop on a simulated clock with simulated workers, against "
                         "a simulated Pool(N): no broker, seconds (docs/simulation.md; docs/scaling.md "
                         "says what it models)")
    ap.add_argument("--simulate-calibrate", action="store_true",
                    help="what the supervisor's own code costs on this host, for the simulator's costs "
                         "(scripts/benchkit/sim/calibrate.py): writes simulation-costs.json")
    ap.add_argument("--simulate-members", action="store_true",
                    help="members per host past the light-work ceiling, simulated on a long run "
                         "(scripts/benchkit/sim/members.py): writes simulation-members.json")
    ap.add_argument("--simulate-cores", type=int, default=16, help="--simulate-members: the host's cores")
    ap.add_argument("--simulate-member-seconds", type=float, default=2.0,
                    help="--simulate-members: about how long each run lasts, simulated")
    ap.add_argument("--simulate-members-ordering", default="unordered",
                    help="--simulate-members: the ordering of every member")
    ap.add_argument("--simulate-cases", default=None,
                    help="--simulate: only the cases whose name contains one of these (comma-separated)")
    ap.add_argument("--simulate-scale", type=float, default=1.0,
                    help="--simulate: records per case × this (smaller: faster, more tail)")
    ap.add_argument("--admin-load", action="store_true",
                    help="trivial work with and without 4 clients polling /status and /metrics every 100 ms "
                         "(docs/admin_load.md)")
    ap.add_argument("--naive", action="store_true",
                    help="a plain loop, Pool(N) and ringmaster(N), each producing one output a record, on "
                         "--scale-partitions (default here 8,3), interleaved; CPU per record by process and "
                         "thread role (docs/scaling.md); --scale-against adds another checkout's ringmaster")
    ap.add_argument("--naive-workers", type=int, default=2, help="--naive: N")
    ap.add_argument("--naive-work-us", type=float, default=100.0, help="--naive: µs of work per record")
    ap.add_argument("--naive-variant", default=None, metavar="RINGMASTER__X=V,...",
                    help="--naive: also ringmaster(N) with these settings (environment overrides)")
    ap.add_argument("--members", action="store_true",
                    help="light work: 1 supervisor x N workers against N supervisors x 1 worker "
                         "(run --members N), interleaved; use --records 300000 (docs/scaling.md)")
    ap.add_argument("--members-n", type=int, default=2, help="--members: N")
    ap.add_argument("--share", action="store_true",
                    help="share groups (KIP-932) against consumer groups on Apache Kafka, two daemons of "
                         "one worker: 1 partition, and 8 partitions against unordered (benchkit/share.py)")
    ap.add_argument("--share-work-us", type=float, default=100.0, help="--share: µs of work per record")
    ap.add_argument("--members-work-us", type=float, default=10.0, help="--members: µs of work per record")
    ap.add_argument("--exactly-once", action="store_true",
                    help="output.guarantee exactly-once against at-least-once on Apache Kafka: throughput "
                         "and produce → readable (read_committed) latency, interleaved "
                         "(docs/exactly-once.md); use --records 100000")
    ap.add_argument("--eos-processes", type=int, default=2, help="--exactly-once: workers")
    ap.add_argument("--eos-rate", type=float, default=2000.0, help="--exactly-once: offered records/s")
    ap.add_argument("--rebalance-only", action="store_true",
                    help="re-measure only the revocation and memory figures into an existing bench.json")
    args = ap.parse_args()
    others = [Path(d).resolve() for d in (args.scale_against or "").split(",") if d]
    precompile([ROOT, *others])
    if args.simulate_members:
        from benchkit.sim.members import simulate_members

        return simulate_members(args, console)
    if args.simulate_calibrate:
        from benchkit.sim.calibrate import calibrate

        return calibrate(args, console)
    if args.simulate:
        from benchkit.sim.report import simulate

        return simulate(args, console)
    if args.naive:
        from benchkit import naive

        if args.scale_partitions == ap.get_default("scale_partitions"):
            args.scale_partitions = "8,3"
        return naive.compare(args, sys.modules[__name__])
    if args.share:
        from benchkit import share

        return share.compare(args, sys.modules[__name__])
    if args.exactly_once:
        from benchkit import exactly_once

        return exactly_once.compare(args, sys.modules[__name__])
    if args.members:
        from benchkit import members

        return members.compare(args, sys.modules[__name__])
    if args.scale:
        from benchkit import scale

        return scale.sweep(args, sys.modules[__name__])
    if args.ordering:
        return ordering_sweep(args)
    if args.tuning:
        return tuning_sweep(args)
    if args.admin_load:
        return admin_load(args)
    if args.rebalance_only:
        out = Path(args.out)
        results = json.loads((out / "bench.json").read_text())
        with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
            results["rebalance"] = rebalance_and_memory(
                broker.bootstrap, args.partitions, results["iterations"], results["cpu_work_us"],
                Path(tmpdir), args.rss_seconds)
        write_reports(results, out)
        return 0
    if args.runs < 3:
        console.print("[yellow]fewer than 3 runs: min/median/max mean little[/]")
    iterations, work_us = calibrate(100.0)
    ncpu = psutil.cpu_count()
    console.print(f"cpu work: {iterations} iterations = {work_us:.1f} µs/record on one core; "
                  f"{ncpu}-core limit {ncpu / work_us * 1e6:,.0f} records/s")
    results: dict[str, Any] = {"machine": {"cpus": ncpu, "python": platform.python_version(),
                                           "platform": platform.platform()},
                               "records": args.records, "partitions": args.partitions,
                               "cpu_work_us": work_us, "iterations": iterations, "matrix": {}}
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        data = make_data_sets(broker.bootstrap, args.workloads.split(","), args.records, args.partitions)
        for workload, (topic, n) in data.items():
            console.print(f"[bold]{workload}[/] ({n:,} records)")
            cases = []
            for peer in args.peers.split(","):
                procs = 1 if peer == "baseline" else 2
                cases.append((peer if peer == "baseline" else f"{peer} ({procs} proc)", functools.partial(
                    run_peer, peer, broker.bootstrap, topic, n, workload, iterations, procs)))
            for procs in range(1, args.max_processes + 1):
                cases.append((f"ringmaster ({procs} proc)", functools.partial(
                    run_ringmaster, broker.bootstrap, topic, n, workload, iterations, procs, tmp)))
            results["matrix"][workload] = measure_all(cases, args.runs)
        results["cpu_work_us_end"] = time_work(iterations)  # the same work unit, timed again: drift
        if "cpu" in args.workloads and not args.skip_latency:
            peak = max(r["median"] for r in results["matrix"]["cpu"] if r["label"].startswith("ringmaster"))
            lat = functools.partial(latency, bootstrap=broker.bootstrap, seconds=args.latency_seconds,
                                    iterations=iterations, partitions=args.partitions, tmp=tmp)
            results["latency"] = [latency_runs(lat, kind, peak * share, args.runs)
                                  for kind, share in (("baseline", 0.25), ("ringmaster", 0.25),
                                                      ("ringmaster", 0.5))]
            results["latency_peak"] = peak
            results["latency_fetch_wait_ms"] = LATENCY_CONSUMER["fetch.wait.max.ms"]
            results["latency_seconds"] = args.latency_seconds
            results["rebalance"] = rebalance_and_memory(broker.bootstrap, args.partitions, iterations,
                                                        work_us, tmp, args.rss_seconds)
    write_reports(results, Path(args.out))
    return 0


def write_reports(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    limit = results["machine"]["cpus"] / results["cpu_work_us"] * 1e6
    md = [f"# Benchmarks\n\n{results['records']:,} records × 256 B (mixed: ¼ as many, 100 B and 10 KiB), "
          f"{results['partitions']} partitions, embedded broker, {results['machine']['cpus']} cores, "
          f"Python {results['machine']['python']}. cpu work = {results['cpu_work_us']:.1f} µs/record of "
          f"pure Python ({limit:,.0f} records/s is the {results['machine']['cpus']}-core limit"
          + (f"; the same work took {results['cpu_work_us_end']:.1f} µs when timed again after the "
             "throughput runs: this machine's speed drifts" if "cpu_work_us_end" in results else "")
          + "). Runs of all consumers are interleaved so that drift hits them alike. "
          "Throughput = first record consumed → all offsets committed; CPU per record is counted over the "
          "same window (start-up and group joins excluded). Produced by `./scripts/bench`.\n"]
    console_table = Table(title="records/s (median of runs)")
    for col in ("workload", "consumer", "min", "median", "max", "× baseline", "main µs/rec",
                "workers µs/rec", "others"):
        console_table.add_column(col, justify="right")
    for workload, rows in results["matrix"].items():
        base = next((r["median"] for r in rows if r["label"] == "baseline"), None)
        md.append(f"\n## {workload}\n\n| consumer | min | median | max | × baseline | "
                  + ("share of limit | " if workload == "cpu" else "")
                  + "main CPU µs/record | workers CPU µs/record | others' CPU |\n"
                  + "|---|---|---|---|---|" + ("---|" if workload == "cpu" else "") + "---|---|---|")
        for r in rows:
            ratio = f"{r['median'] / base:.2f}" if base else "-"
            share = f"{r['median'] / limit:.0%} | " if workload == "cpu" else ""
            md.append(f"| {r['label']} | {r['min']:,.0f} | {r['median']:,.0f} | {r['max']:,.0f} | {ratio} | "
                      f"{share}{r['main_us_per_record']:.2f} | {r['worker_us_per_record']:.2f} | "
                      f"{r['others_share']:.0%} |")
            console_table.add_row(workload, r["label"], f"{r['min']:,.0f}", f"{r['median']:,.0f}",
                                  f"{r['max']:,.0f}", ratio, f"{r['main_us_per_record']:.2f}",
                                  f"{r['worker_us_per_record']:.2f}", f"{r['others_share']:.0%}")
    if "latency" in results:
        runs = len(results["latency"][0].get("runs", [None]))
        md.append(f"\n## Latency\n\nproduce → processed, cpu work, fixed offered load (fractions of "
                  f"ringmaster's peak of {results['latency_peak']:,.0f} records/s above), "
                  f"`fetch.wait.max.ms = {results.get('latency_fetch_wait_ms', 25)}` for every consumer "
                  "(the embedded broker answers fetches only at that limit). Medians of "
                  f"{runs} run(s) of {results.get('latency_seconds', 10):.0f} s each; p99's range in "
                  "brackets. The load generator and the broker share the machine: see how busy it was.\n\n"
                  "| consumer | offered records/s | p50 ms | p90 ms | p99 ms (min–max) | max ms "
                  "| machine busy |\n"
                  "|---|---|---|---|---|---|---|")
        for lat in results["latency"]:
            spread = f" ({lat['p99_min_ms']:.1f}–{lat['p99_max_ms']:.1f})" if "p99_min_ms" in lat else ""
            md.append(f"| {lat['consumer']} | {lat['offered_rate']:,.0f} | {lat['p50_ms']:.1f} | "
                      f"{lat['p90_ms']:.1f} | {lat['p99_ms']:.1f}{spread} | {lat['max_ms']:.1f} | "
                      f"{lat['machine_busy']:.0%} |")
    if "rebalance" in results:
        r = results["rebalance"]
        md.append(f"\n## Revocation and memory with full rings\n\nA member whose rings are full "
                  f"({r['batches_in_ring']} batches, {r['ring_work_ms']:,.0f} ms of work per ring; batch "
                  f"{r['batch_ms']:.0f} ms) gave {r['partitions_revoked']} partitions to a new member in "
                  f"**{r['revoke_ms']:.0f} ms**, of which fencing (waiting only for a batch in progress on "
                  f"a revoked partition, if any) took **{r['revoke_fenced_ms']:.0f} ms** and the rest was "
                  f"the synchronous commit. Stopped by SIGTERM with its rings still full, it fenced all its "
                  f"partitions in **{r['shutdown_fenced_ms']} ms**, released them (commit included) in "
                  f"{r['shutdown_release_ms']} ms and exited "
                  f"{r['sigterm_to_exit_s']:.2f} s after the signal (group leave and worker exit included). "
                  f"Its supervisor's RSS over {r['rss_samples']} samples "
                  f"in {r.get('rss_seconds', 10):.0f} s "
                  f"with full rings: {r['rss_mb_first']:.1f} MiB first, {r['rss_mb_last']:.1f} MiB last, "
                  f"{r['rss_mb_max']:.1f} MiB max"
                  + (f", {r['rss_mb_min']:.1f} MiB min; median {r['rss_mb_median_first_half']:.1f} MiB "
                     f"over the first half and {r['rss_mb_median_second_half']:.1f} MiB over the second. The "
                     "swings are librdkafka's prefetch queue (at most `queued.max.messages.kbytes`, 16 MiB) "
                     "refilling after resumes" if "rss_mb_median_first_half" in r else "")
                  + ".")
    (out / "bench.md").write_text("\n".join(md) + "\n")
    Console().print(console_table)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print("[yellow]matplotlib missing: no chart[/]")
        return
    workloads = list(results["matrix"])
    fig, axes = plt.subplots(1, len(workloads), figsize=(5 * len(workloads), 4))
    axes = [axes] if len(workloads) == 1 else axes
    for ax, workload in zip(axes, workloads, strict=True):
        rows = results["matrix"][workload]
        labels = [r["label"].replace(" (", "\n(") for r in rows]
        med = [r["median"] for r in rows]
        err = [[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]]
        ax.bar(labels, med, yerr=err, color=["#999" if "ringmaster" not in lb else "#2a7" for lb in labels])
        ax.set_title(workload)
        ax.set_ylabel("records/s")
        ax.tick_params(axis="x", labelsize=7)
        if workload == "cpu":
            ax.axhline(limit, color="#c33", linestyle="--", label=f"{results['machine']['cpus']}-core limit")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "bench.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
