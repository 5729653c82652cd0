"""``scripts/bench --members``: the light-work ceiling of one supervisor, and the way past it.

One worker budget on one host, spent two ways, in one invocation, interleaved (run 1 of
each, then run 2 of each, ...): one supervisor with N workers (``ringmaster run``) against N
supervisors with one worker each (``ringmaster run --members N``), on light work (~10 µs a
record by default), each ``--until-caught-up`` over the same topic with a group of its own.

Throughput is records / the span from the first record any member consumed to the last
commit of any member: each member's final snapshot gives its window (window_s) and the wall
clock at its end (taken_at), so the windows lie on one time line. Group joins do not count,
as in the rest of scripts/bench. Printed and written to --out/members.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import tempfile
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

from benchkit.work import calibrate, time_work


def run_members(bench: ModuleType, bootstrap: str, topic: str, iterations: int, processes: int,
                members: int, tmp: Path) -> dict[str, Any]:
    """One ``ringmaster run --until-caught-up`` with ``members`` supervisors (1: a lone one)
    sharing ``processes`` workers; the figures measure_all wants."""
    cfg = tmp / f"rm-{uuid.uuid4().hex[:6]}.toml"
    cfg.write_text(bench.ringmaster_config(bootstrap, topic, "cpu", iterations, processes))
    summary = tmp / f"summary-{uuid.uuid4().hex[:6]}.json"
    out = subprocess.run([bench.PY, "-m", "runtime.cli", "run", "-c", str(cfg), "--until-caught-up",
                          "--no-progress", "--members", str(members), "--summary-json", str(summary)],
                         capture_output=True, text=True, env=bench.ENV, timeout=900, cwd=bench.ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"ringmaster --members {members} failed ({out.returncode}): {out.stderr[-2000:]}")
    doc = json.loads(summary.read_text())
    snaps = doc["members"] if members > 1 else [doc]
    start = min(s["taken_at"] - s["window_s"] for s in snaps)
    end = max(s["taken_at"] for s in snaps)
    return {"records": sum(s["records"] for s in snaps), "window_s": end - start,
            "main_cpu_s": sum(s["window_cpu_s"]["supervisor"] for s in snaps),
            "worker_cpu_s": sum(s["window_cpu_s"]["workers"] for s in snaps),
            "total_cpu_s": sum(s["supervisor_cpu_s"] + sum(w["cpu_s"] or 0 for w in s["workers"])
                               for s in snaps),
            "per_member": [s["records"] for s in snaps]}


def compare(args: argparse.Namespace, bench: ModuleType) -> int:
    target = args.members_work_us
    iterations, work_us = calibrate(target)
    for _ in range(3):  # a light target is a few iterations: one rough guess is off by 2-3x under load
        iterations = max(1, round(iterations * target / work_us))
        work_us = time_work(iterations)
    n = args.members_n
    bench.console.print(f"light work: {iterations} iterations = {work_us:.1f} µs/record; "
                        f"{args.records:,} records over {args.partitions} partitions, {args.runs} runs each")
    with tempfile.TemporaryDirectory() as tmpdir, bench.DevBroker() as broker:
        tmp = Path(tmpdir)
        topic = f"members-{uuid.uuid4().hex[:6]}"
        bench.ensure_topics(broker.bootstrap, [topic], partitions=args.partitions)
        bench.produce(broker.bootstrap, topic, args.records, [100])
        cases = [(f"1 member x {n} workers", functools.partial(
                     run_members, bench, broker.bootstrap, topic, iterations, n, 1, tmp)),
                 (f"{n} members x 1 worker", functools.partial(
                     run_members, bench, broker.bootstrap, topic, iterations, n, n, tmp))]
        rows = bench.measure_all(cases, args.runs)
    one, many = rows
    ratio = many["median"] / one["median"]
    for r in rows:
        bench.console.print(f"{r['label']:<24} min {r['min']:>9,.0f}  median {r['median']:>9,.0f}  "
                            f"max {r['max']:>9,.0f} rec/s  supervisor {r['main_us_per_record']:.2f} µs/rec  "
                            f"workers {r['worker_us_per_record']:.2f} µs/rec")
    bench.console.print(f"{n} members / 1 member (medians): {ratio:.2f}x")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"members-{work_us:.0f}us.json").write_text(json.dumps({
        "work_us": work_us, "iterations": iterations, "records": args.records,
        "partitions": args.partitions, "runs": args.runs, "members": n, "ratio_of_medians": ratio,
        "rows": rows}, indent=2))
    _write_table(out / "scaling.md", rows, args, work_us, ratio)
    return 0


def _write_table(path: Path, rows: list[dict[str, Any]], args: argparse.Namespace, work_us: float,
                 ratio: float) -> None:
    """This invocation's table into path, between markers of its own work size (replaced on
    the next run of the same size; the rest of the file is left alone)."""
    begin, end = f"<!-- bench --members {args.members_work_us:g} us -->", "<!-- /bench --members -->"
    table = [begin,
             f"`./scripts/bench --members --members-work-us {args.members_work_us:g} --records "
             f"{args.records} --partitions {args.partitions} --runs {args.runs}`: the work unit took "
             f"{work_us:.1f} µs; {args.records:,} records, {args.partitions} partitions; records/s "
             "min / median / max; CPU µs per record.", "",
             "| configuration | records/s min / median / max | supervisors µs/rec | workers µs/rec |",
             "|---|---|---|---|"]
    for r in rows:
        table.append(f"| {r['label']} | {r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f} | "
                     f"{r['main_us_per_record']:.2f} | {r['worker_us_per_record']:.2f} |")
    table += ["", f"{rows[1]['label']} / {rows[0]['label']} (medians): **{ratio:.2f}×**", end]
    text = path.read_text() if path.exists() else ""
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + "\n".join(table) + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + "\n".join(table) + "\n"
    path.write_text(text)
