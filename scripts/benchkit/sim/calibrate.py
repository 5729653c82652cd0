"""`./scripts/bench --simulate-calibrate`: what the supervisor's own code costs on this host, for
the simulator's ``Costs`` (world.py).

The real ``Supervisor.run()`` runs in the simulator (cases.py) while the CPU time of its
thread is counted, less what the simulated world spends inside it (the consumer's Messages,
the rings, the pipes, the workers' bookkeeping): what is left is the loop's own code, the cut
(packing, registering) counted apart. Costs are scaled to a work unit timed in the same
process just before and after each run (``spin(1000)``, the benches' plugin's loop: ~70 µs of
CPU on the project's 2-core machine, whose ~100-µs unit is ~1,400 iterations), and the run on
the least loaded host is kept. The machine's other processes slow the supervisor's
memory-bound code more than the spin loop, so on a shared machine these are upper bounds.

Fits, over cases that differ in partitions, workers and batch size: per turn of the loop (a
base, per partition, per worker), per batch (its frame and its result), per record cut.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchkit.sim import world
from benchkit.sim.cases import Case, run_ringmaster
from benchkit.work import spin
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.datapath.intake import Intake

_UNIT_ITERATIONS = 1000  # spin(1000): the work unit timed beside each run

CASES = {
    "32 partitions, 15 workers": Case("calibrate"),
    "32 partitions, 15 workers, batches of 50": Case("calibrate", workers_settings={"batch_max_records": 50}),
    "16 partitions, 15 workers": Case("calibrate", partitions=16),
    "64 partitions, 15 workers": Case("calibrate", partitions=64),
    "32 partitions, 4 workers": Case("calibrate", workers=4, records=80_000),
    "8 partitions, 2 workers": Case("calibrate", workers=2, partitions=8, records=40_000),
    "3 partitions, 2 workers": Case("calibrate", workers=2, partitions=3, records=40_000),
}


class _Meter:
    """CPU time of this thread inside the wrapped methods, and counts."""

    def __init__(self) -> None:
        self.ns: collections.Counter[str] = collections.Counter()
        self.n: collections.Counter[str] = collections.Counter()
        self._undo: list[tuple[Any, str, Any]] = []

    def wrap(self, owner: Any, name: str, key: str, count: Callable[[Any], int] | None = None) -> None:
        original = getattr(owner, name)
        ns, n, clock = self.ns, self.n, time.thread_time_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            out = original(*args, **kwargs)
            ns[key] += clock() - t
            n[key] += count(out) if count is not None else 1
            return out

        setattr(owner, name, timed)
        self._undo.append((owner, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


def _unit_us() -> float:
    samples = []
    for _ in range(50):
        t = time.thread_time_ns()
        spin(_UNIT_ITERATIONS)
        samples.append((time.thread_time_ns() - t) / 1000)
    return min(samples)


def measure(case: Case) -> dict[str, Any]:
    """One run of the case: the supervisor's own CPU µs, by part, and the work unit's."""
    m = _Meter()
    m.wrap(Intake, "cut", "cut", lambda cut: sum(b.count for b in cut.batches))
    for owner, name in ((world.World, "write"), (world.World, "read_results"), (world.SimConsumer, "consume"),
                        (world.SimPool, "sleep")):
        m.wrap(owner, name, "world")
    m.wrap(world.World, "write", "frames")
    m.wrap(world.SimConsumer, "consume", "turns")
    m.wrap(Supervisor, "run", "run")
    try:
        unit = _unit_us()
        run_ringmaster(case)
        unit = (unit + _unit_us()) / 2
    finally:
        m.undo()
    # "frames" and "turns" wrap calls that "world" wraps too: the world's time is taken out once.
    own = (m.ns["run"] - m.ns["world"] - m.ns["cut"]) / 1000
    return {"partitions": case.partitions, "workers": case.workers, "turns": m.n["turns"],
            "batches": m.n["frames"], "records": m.n["cut"], "cut_us": m.ns["cut"] / 1000, "loop_us": own,
            "unit_us": unit}


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Least squares: loop_us = turns × (base + per_partition × P + per_worker × W) + batches ×
    per_batch; cut_us = records × per_record."""
    a = [[r["turns"], r["turns"] * r["partitions"], r["turns"] * r["workers"], r["batches"]] for r in rows]
    base, per_partition, per_worker, per_batch = _least_squares(a, [r["loop_us"] for r in rows])
    per_record = sum(r["cut_us"] for r in rows) / sum(r["records"] for r in rows)
    return {"turn_us": float(base), "turn_partition_us": float(per_partition),
            "turn_worker_us": float(per_worker),
            "batch_us": float(per_batch), "cut_record_us": float(per_record)}


def _least_squares(a: list[list[float]], y: list[float]) -> list[float]:
    """x minimising |a x - y|: the normal equations, solved by elimination (a few unknowns)."""
    n = len(a[0])
    m = [[sum(row[i] * row[j] for row in a) for j in range(n)]
         + [sum(row[i] * v for row, v in zip(a, y, strict=True))] for i in range(n)]
    for c in range(n):
        pivot = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[pivot] = m[pivot], m[c]
        for r in range(n):
            if r != c and m[c][c]:
                f = m[r][c] / m[c][c]
                m[r] = [x - f * z for x, z in zip(m[r], m[c], strict=True)]
    return [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


def calibrate(args: argparse.Namespace, console: Any) -> int:
    runs = max(1, args.runs)
    best: dict[str, dict[str, Any]] = {}
    for i in range(runs):
        for name, case in CASES.items():
            row = measure(replace(case, costs_=None))
            if name not in best or row["unit_us"] < best[name]["unit_us"]:
                best[name] = row  # the run on the least loaded host
            console.print(f"  run {i + 1}, {name}: {row['loop_us'] / row['turns']:.0f} µs a turn, "
                          f"{row['cut_us'] / max(1, row['records']):.2f} µs a record cut "
                          f"(work unit {row['unit_us']:.1f} µs of CPU)")
    rows = list(best.values())
    f = fit(rows)
    lines = ["| case | turns | batches | supervisor's loop, µs a turn (all but the cut) | µs a record cut |",
             "|---|---|---|---|---|"]
    for name, r in best.items():
        lines.append(f"| {name} | {r['turns']:,} | {r['batches']:,} | {r['loop_us'] / r['turns']:.0f} | "
                     f"{r['cut_us'] / max(1, r['records']):.2f} |")
    unit = min(r["unit_us"] for r in rows)
    lines += ["", f"Fit (CPU µs of this host, where spin({_UNIT_ITERATIONS}) took {unit:.1f} µs): "
                  f"a turn {f['turn_us']:.0f} + {f['turn_partition_us']:.1f} a partition + "
                  f"{f['turn_worker_us']:.1f} a worker; a batch (frame and result) {f['batch_us']:.1f}; "
                  f"a record cut {f['cut_record_us']:.2f}."]
    console.print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulation-costs.json").write_text(json.dumps({"cases": best, "fit": f}, indent=2))
    return 0
