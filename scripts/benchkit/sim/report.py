"""`./scripts/bench --simulate`: the standard cases (cases.STANDARD), every ordering and the
simulated Pool(N) on each; writes docs/simulation.md and docs/simulation.json."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchkit.sim.cases import STANDARD, Case, Outcome, run_case
from benchkit.sim.world import Costs

HEADER = """# Simulation

The real supervisor loop (`Supervisor.run()`: intake, flow control, scheduler, results, offset
trackers and the C packer) on a simulated clock, with simulated Kafka, rings, result pipes and
workers, beside a simulated `multiprocessing.Pool(N)` (`imap_unordered`, chunks of 100, one
parent paying the same costs). Deterministic: the same figures on every machine. What it models
and what it does not: [scaling.md](scaling.md#simulation). Produced by `./scripts/bench
--simulate`{args}.

Costs (its own code measured on the 2-core machine, `./scripts/bench --simulate-calibrate`):
the supervisor {record} µs per record fetched (the case's *sup*; {cut} of it when the record is
cut), {frame} µs per frame written, {result} µs per result read, {tick} µs per turn of its loop
+ {tick_p} a partition + {tick_w} a worker. The Kafka client as librdkafka fetches: one fetch
in flight, each response's run of `max.partition.fetch.bytes` per partition landing whole in one
queue that `consume()` hands out from its head. A worker {batch} µs per batch, then {ack} µs until
the broker acknowledges its outputs (ringmaster's workers only, `Pool`'s parent produces for its
workers; 500 µs in the "acks" cases, during which a worker runs its next batch if its ring holds
one: pipelined delivery), plus each record's
own cost (the case's work × (1 ± 0.3), uniform). Efficiency: the
ideal time (all the work spread evenly over the workers) ÷ the time taken; for a hot
partition also against what `partition` ordering allows at best (no partition faster than
one worker). Busy: each worker's share of the run (min–max); supervisor: its share. Moves:
how often a lane's next batch went to another worker. Latency: arrival → processed.
"""


def _cell(o: Outcome, case: Case) -> str:
    if case.load:
        return f"p50 {o.p50_ms:.1f} / p99 {o.p99_ms:.1f} ms"
    bound = f" ({o.of_bound:.2f} of bound)" if case.hot > 1 else ""
    return f"**{o.efficiency:.2f}**{bound}"


def render(results: list[tuple[Case, list[Outcome]]], args: str) -> list[str]:
    c = Costs()
    md = [HEADER.format(args=args, record="*sup*", cut=c.cut_us, frame=c.frame_us, result=c.result_us,
                        tick=c.tick_us, tick_p=c.tick_partition_us, tick_w=c.tick_worker_us,
                        batch=Case("").batch_us, ack=Case("").ack_us)]
    md += ["| case | partition | key | unordered | Pool(N) |", "|---|---|---|---|---|"]
    for case, outs in results:
        cells = " | ".join(_cell(o, case) for o in outs)
        md.append(f"| {case.name} ({case.workers} workers) | {cells} |")
    md += ["", "Detail (busy min–max, supervisor busy, lane moves):", "",
           "| case | consumer | efficiency | busy | supervisor | moves | p50 / p99 / max ms |",
           "|---|---|---|---|---|---|---|"]
    for case, outs in results:
        for o in outs:
            moves = "-" if o.lane_moves is None else f"{o.lane_moves:,}"
            busy = f"{min(o.busy):.2f}–{max(o.busy):.2f}"
            lat = f"{o.p50_ms:.1f} / {o.p99_ms:.1f} / {o.max_ms:.1f}"
            md.append(f"| {case.name} | {o.consumer} | {o.efficiency:.3f} | {busy} | "
                      f"{o.supervisor_busy:.2f} | {moves} | {lat} |")
    return md


def simulate(args: argparse.Namespace, console: Any) -> int:
    wanted = [w.strip() for w in (args.simulate_cases or "").split(",") if w.strip()]
    cases = [c for c in STANDARD if not wanted or any(w in c.name for w in wanted)]
    if args.simulate_scale != 1.0:
        k = args.simulate_scale
        cases = [replace(c, records=int(c.records * k), seconds=c.seconds * k) for c in cases]
    results = []
    for case in cases:
        t = time.monotonic()
        outs = run_case(case)
        results.append((case, outs))
        console.print(f"  {case.name}: " + ", ".join(f"{o.consumer} {_cell(o, case)}" for o in outs)
                      + f" ({time.monotonic() - t:.0f} s)")
    shown = ""
    if args.simulate_cases:
        shown += f" --simulate-cases '{args.simulate_cases}'"
    if args.simulate_scale != 1.0:
        shown += f" --simulate-scale {args.simulate_scale:g}"
    md = render(results, shown)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulation.md").write_text("\n".join(md) + "\n")
    (out / "simulation.json").write_text(json.dumps(
        [{"case": case.name, "workers": case.workers, "rows": [o.row() for o in outs]}
         for case, outs in results], indent=2))
    console.print("\n".join(md))
    return 0
