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

from benchkit.work import calibrate  # noqa: E402

from runtime.devbroker import DevBroker  # noqa: E402
from runtime.kafka import ensure_topics  # noqa: E402

console = Console(stderr=True)
PY = str(ROOT / ".venv" / "bin" / "python")
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "scripts"), str(ROOT)]))


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


def run_peer(kind: str, bootstrap: str, topic: str, records: int, workload: str, iterations: int,
             processes: int) -> dict[str, Any]:
    out = subprocess.run([PY, "-m", "benchkit.runners", kind, "--bootstrap", bootstrap, "--topic", topic,
                          "--group", f"bench-{uuid.uuid4().hex[:8]}", "--records", str(records),
                          "--workload", workload, "--iterations", str(iterations),
                          "--processes", str(processes)],
                         capture_output=True, text=True, env=ENV, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ringmaster_config(bootstrap: str, topic: str, workload: str, iterations: int, processes: int,
                      extra: dict[str, Any] | None = None) -> str:
    settings = {"workload": workload, "iterations": iterations, **(extra or {})}
    lines = [f'{k} = {json.dumps(v)}' for k, v in settings.items()]
    return f"""[kafka]
bootstrap_servers = "{bootstrap}"
group_id = "bench-{uuid.uuid4().hex[:8]}"
topics = ["{topic}"]
[kafka.consumer]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 500
[workers]
plugin = "benchkit.work"
processes = {processes}
[workers.settings]
{chr(10).join(lines)}
[supervisor]
log_level = "WARNING"
"""


def run_ringmaster(bootstrap: str, topic: str, records: int, workload: str, iterations: int,
                   processes: int, tmp: Path) -> dict[str, Any]:
    cfg = tmp / f"rm-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(ringmaster_config(bootstrap, topic, workload, iterations, processes))
    summary = tmp / "summary.json"
    out = subprocess.run([PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--until-caught-up",
                          "--no-progress", "--summary-json", str(summary)],
                         capture_output=True, text=True, env=ENV, timeout=900, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"ringmaster failed: {out.stderr[-2000:]}")
    s = json.loads(summary.read_text())
    return {"records": s["records"], "window_s": s["window_s"], "main_cpu_s": s["supervisor_cpu_s"],
            "worker_cpu_s": sum(w["cpu_s"] or 0 for w in s["workers"])}


def measure(label: str, fn: Any, runs: int) -> dict[str, Any]:
    results = []
    for i in range(runs):
        busy0, t0 = busy_cpu_s(), time.monotonic()
        r = fn()
        busy1, wall = busy_cpu_s(), time.monotonic() - t0
        ours = r["main_cpu_s"] + r["worker_cpu_s"]
        # CPU the rest of the machine used during this run, as a share of all cores.
        r["others_share"] = max(0.0, (busy1 - busy0 - ours) / (wall * psutil.cpu_count()))
        r["rate"] = r["records"] / r["window_s"]
        results.append(r)
        console.print(f"  {label} run {i + 1}: {r['rate']:,.0f} rec/s "
                      f"(main {r['main_cpu_s']:.2f} s, workers {r['worker_cpu_s']:.2f} s CPU, "
                      f"others {r['others_share']:.0%})")
    rates = sorted(r["rate"] for r in results)
    return {"label": label, "runs": results, "min": rates[0], "median": statistics.median(rates),
            "max": rates[-1],
            "main_us_per_record": statistics.median(r["main_cpu_s"] / r["records"] * 1e6 for r in results),
            "worker_us_per_record": statistics.median(r["worker_cpu_s"] / r["records"] * 1e6
                                                      for r in results),
            "others_share": statistics.median(r["others_share"] for r in results)}


def latency(bootstrap: str, topic: str, rate: float, seconds: float, iterations: int,
            tmp: Path) -> dict[str, Any]:
    """p50/p99 produce → processed at a fixed offered load (cpu work), ringmaster only."""
    ldir = tmp / f"lat-{uuid.uuid4().hex[:6]}"
    ldir.mkdir()
    cfg = tmp / "lat.toml"
    cfg.write_text(ringmaster_config(bootstrap, topic, "cpu", iterations, psutil.cpu_count(),
                                     {"latency_dir": str(ldir)}))
    proc = subprocess.Popen([PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--no-progress"],
                            env=ENV, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8)  # group join on the embedded broker (no records sent yet, none measured)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        n = int(rate * seconds)
        start = time.monotonic()
        for i in range(n):
            target = start + i / rate
            delay = target - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            p.produce(topic, f"{time.time_ns():019d}".encode() + b" " * 237)
            p.poll(0)
        p.flush(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            samples = [float(x) for f in ldir.glob("*.lat") for x in f.read_text().split()]
            if len(samples) >= n:
                break
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(60)
    samples.sort()
    q = statistics.quantiles(samples, n=100)
    return {"offered_rate": rate, "records": len(samples), "p50_ms": q[49], "p99_ms": q[98],
            "max_ms": samples[-1]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workloads", default="trivial,cpu,mixed")
    ap.add_argument("--peers", default="baseline,pool,arroyo")
    ap.add_argument("--max-processes", type=int, default=psutil.cpu_count())
    ap.add_argument("--out", default=str(ROOT / "docs"))
    args = ap.parse_args()
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
        topics = {"trivial": "bench-256", "cpu": "bench-256", "mixed": "bench-mixed"}
        ensure_topics(broker.bootstrap, set(topics.values()), partitions=args.partitions)
        produce(broker.bootstrap, "bench-256", args.records, [256])
        if "mixed" in args.workloads:
            produce(broker.bootstrap, "bench-mixed", args.records // 4, [100, 10240])
        for workload in args.workloads.split(","):
            n = args.records // 4 if workload == "mixed" else args.records
            topic = topics[workload]
            console.print(f"[bold]{workload}[/] ({n:,} records)")
            rows = []
            for peer in args.peers.split(","):
                procs = 1 if peer == "baseline" else 2
                rows.append(measure(peer if peer == "baseline" else f"{peer} ({procs} proc)",
                                    functools.partial(run_peer, peer, broker.bootstrap, topic, n,
                                                      workload, iterations, procs), args.runs))
            for procs in range(1, args.max_processes + 1):
                rows.append(measure(f"ringmaster ({procs} proc)", functools.partial(
                    run_ringmaster, broker.bootstrap, topic, n, workload, iterations, procs, tmp),
                    args.runs))
            results["matrix"][workload] = rows
        if "cpu" in args.workloads:
            peak = max(r["median"] for r in results["matrix"]["cpu"] if r["label"].startswith("ringmaster"))
            ensure_topics(broker.bootstrap, ["bench-latency"], partitions=args.partitions)
            results["latency"] = latency(broker.bootstrap, "bench-latency", peak / 2, 10, iterations, tmp)
    write_reports(results, Path(args.out))
    return 0


def write_reports(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(results, indent=2))
    limit = results["machine"]["cpus"] / results["cpu_work_us"] * 1e6
    md = [f"# Benchmarks\n\n{results['records']:,} records × 256 B (mixed: ¼ as many, 100 B and 10 KiB), "
          f"{results['partitions']} partitions, embedded broker, {results['machine']['cpus']} cores, "
          f"Python {results['machine']['python']}. cpu work = {results['cpu_work_us']:.1f} µs/record of "
          f"pure Python ({limit:,.0f} records/s is the {results['machine']['cpus']}-core limit). "
          "Throughput = first record consumed → all offsets committed. Produced by `./scripts/bench`.\n"]
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
        lat = results["latency"]
        md.append(f"\n## Latency\n\nringmaster, cpu work, offered {lat['offered_rate']:,.0f} records/s "
                  f"(half of its peak): p50 {lat['p50_ms']:.1f} ms, p99 {lat['p99_ms']:.1f} ms, "
                  f"max {lat['max_ms']:.1f} ms over {lat['records']:,} records.")
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
