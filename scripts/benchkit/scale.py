"""`./scripts/bench --scale`: how throughput grows with the number of processes, for every
consumer a user would pick, in one invocation.

For N in 1, 2, 4, 8, cores−1 and cores (those the machine has), on topics whose partition
count does and does not divide N (32 and 13 by default), at ~100 µs and ~10 µs of pure-Python
work per record: the plain single-process loop, `multiprocessing.Pool(N)`, arroyo(N) and
ringmaster(N) in each ordering. Runs are interleaved (run 1 of every case, then run 2, ...)
because this kind of machine drifts; the work unit is calibrated once, at the start, and
every consumer does the same work in the same invocation, so only ratios within the
invocation are reported: × the plain loop, × Pool(N). Also per-worker busy share (the time a
worker spent on batches / the run's window) and the supervisor's CPU µs per record. Writes
docs/scaling.md and docs/scaling.json, naming the machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import subprocess
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ORDERINGS = ("partition", "key", "unordered")


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model or platform.processor() or "unknown", "cores": psutil.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30), "python": platform.python_version(),
            "platform": platform.platform()}


def worker_counts(cores: int, wanted: str | None) -> list[int]:
    if wanted:
        return sorted({int(x) for x in wanted.split(",")})
    return sorted(n for n in {1, 2, 4, 8, cores - 1, cores} if 1 <= n <= cores)


def sweep(args: argparse.Namespace, bench: Any) -> int:
    """bench: the scripts/bench.py module (its runners and the broker)."""
    from benchkit.work import calibrate, time_work
    from runtime.dev.tansu import DevBroker
    from runtime.kafka.admin import ensure_topics

    console = bench.console
    info = machine()
    counts = worker_counts(info["cores"], args.scale_workers)
    partition_counts = [int(x) for x in args.scale_partitions.split(",")]
    works = [float(x) for x in args.scale_work_us.split(",")]
    peers = [p for p in args.peers.split(",") if p in ("baseline", "pool", "arroyo")]
    orderings = [o for o in args.scale_orderings.split(",") if o in ORDERINGS]
    roots: list[tuple[str, Path]] = [("ringmaster", bench.ROOT)]
    for other in [Path(d).resolve() for d in (args.scale_against or "").split(",") if d]:
        roots.append((f"ringmaster@{_revision(other)}", other))
    results: dict[str, Any] = {"machine": info, "workers": counts, "runs": args.runs, "sets": [],
                               "revisions": {name: _revision(root) for name, root in roots}}
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        for work_us in works:
            iterations, measured_us = calibrate(work_us)
            records = max(1000, int(args.scale_seconds * 1e6 / measured_us))
            console.print(f"[bold]~{work_us:.0f} µs of work[/]: {iterations} iterations = "
                          f"{measured_us:.1f} µs on one core; {records:,} records per run")
            for partitions in partition_counts:
                topic = f"bench-scale-{uuid.uuid4().hex[:6]}"
                ensure_topics(broker.bootstrap, [topic], partitions=partitions)
                bench.produce(broker.bootstrap, topic, records, [256])
                cases: list[tuple[str, Callable[[], dict[str, Any]]]] = []
                if "baseline" in peers:
                    cases.append(("plain loop", functools.partial(
                        bench.run_peer, "baseline", broker.bootstrap, topic, records, "cpu", iterations, 1)))
                for n in counts:
                    for peer in peers:
                        if peer != "baseline":
                            cases.append((f"{peer}({n})", functools.partial(
                                bench.run_peer, peer, broker.bootstrap, topic, records, "cpu", iterations,
                                n)))
                    for ordering in orderings:
                        for name, root in roots:
                            cases.append((f"{name} {ordering}({n})", functools.partial(
                                bench.run_ringmaster, broker.bootstrap, topic, records, "cpu", iterations, n,
                                tmp, {"RINGMASTER__WORKERS__ORDERING": ordering}, root=root)))
                console.print(f"  {partitions} partitions: {len(cases)} cases × {args.runs} runs")
                measured = bench.measure_all(cases, args.runs)
                results["sets"].append({"work_us": measured_us, "work_us_after": time_work(iterations),
                                        "partitions": partitions, "records": records,
                                        "rows": [summarize(r) for r in measured]})
                _write_json(args, results)  # after every set: a run cut short keeps what it measured
    out = _write_json(args, results)
    md = render(results)
    (out / "scaling.md").write_text("\n".join(md) + "\n")
    console.print("\n".join(md))
    return 0


def _write_json(args: argparse.Namespace, results: dict[str, Any]) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.json").write_text(json.dumps(results, indent=2))
    return out


def _revision(root: Path) -> str:
    """The checkout's commit, short (and "+" when its tracked files differ from it). A tree
    that is not a checkout of its own (a ``git archive`` unpacked under run/) is named by its
    REVISION file if it has one, else by its folder: git would answer for the enclosing
    checkout, and two different trees would carry one label."""
    def git(*a: str) -> str:
        try:
            r = subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True)
        except OSError:  # no git (a bare lent machine)
            return ""
        return r.stdout.strip() if r.returncode == 0 else ""
    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root.resolve():
        stamp = root / "REVISION"
        return stamp.read_text().strip() if stamp.is_file() else f"{root.name} (not a checkout)"
    head = git("rev-parse", "--short=7", "HEAD") or "unknown"
    return head + ("+" if git("status", "--porcelain", "--untracked-files=no") else "")


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    shares = [run.get("busy_shares") for run in r["runs"] if run.get("busy_shares")]
    busy = [statistics.median(s[i] for s in shares) for i in range(len(shares[0]))] if shares else None
    keys = ("label", "min", "median", "max", "main_us_per_record", "worker_us_per_record")
    return {k: r[k] for k in keys} | {"busy_shares": busy}


def _n(label: str) -> int | None:
    return int(label.rsplit("(", 1)[1].rstrip(")")) if "(" in label else None


def render(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    md = [f"# Scaling\n\nMachine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
          f"Python {m['python']} "
          f"({m['platform']}). Produced by `./scripts/bench --scale`; {results['runs']} interleaved runs per "
          "case; records/s min / median / max; ratios of medians within this invocation only (× plain: the "
          "single-process loop; × Pool: `multiprocessing.Pool` with the same N). Busy: each worker's time on "
          "batches / the run's window (min–max over workers). Supervisor: its CPU µs per record.\n"]
    revisions = results.get("revisions", {})
    if len(revisions) > 1:
        md.append("Checkouts, interleaved: " + ", ".join(f"{name} = {rev}" for name, rev in revisions.items())
                  + ".\n")
    for s in results["sets"]:
        rows = s["rows"]
        plain = next((r["median"] for r in rows if r["label"] == "plain loop"), None)
        pools = {_n(r["label"]): r["median"] for r in rows if r["label"].startswith("pool(")}
        md += [f"## ~{s['work_us']:.0f} µs of work per record, {s['partitions']} partitions\n",
               f"{s['records']:,} × 256 B records; the work unit took {s['work_us']:.1f} µs at the start and "
               f"{s['work_us_after']:.1f} µs after the runs.\n",
               "| consumer | records/s min / median / max | × plain | × Pool(N) | busy | supervisor µs/rec |",
               "|---|---|---|---|---|---|"]
        for r in rows:
            n = _n(r["label"])
            x_plain = f"{r['median'] / plain:.2f}" if plain else "-"
            x_pool = "-"
            if n in pools and not r["label"].startswith("pool"):
                x_pool = f"{r['median'] / pools[n]:.2f}"
            busy = r.get("busy_shares")
            busy_s = f"{min(busy):.0%}–{max(busy):.0%}" if busy else "-"
            sup = f"{r['main_us_per_record']:.2f}" if r["label"].startswith("ringmaster") else "-"
            md.append(f"| {r['label']} | {r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f} | "
                      f"{x_plain} | {x_pool} | {busy_s} | {sup} |")
        md.append("")
    from benchkit.sim import SECTION  # written, not measured: kept with every run's figures

    md.append(SECTION)
    return md
