"""What a lane move costs on this host: the real daemon, N workers, more partitions than workers
(3 over 2 by default: lanes move all the time), a CPU-bound plugin that notes when each of its
calls began and ended (benchkit.work, ``timeline_dir``), against the embedded broker.

    .venv/bin/python scripts/bench_lane_moves.py [--partitions 3] [--workers 2] [--work-us 100]
        [--seconds 4] [--runs 3] [--outputs]

From the calls' times, per run: each worker's busy share of the window; every gap between two
calls on a worker, split by whether the second call's partition came from another worker (a
move) or was already there; the same for a partition's own gaps (its batch ends on one worker,
its next starts on the same one or another); and the µs a record of a partition's first batch
on a worker it moved to against its other batches (a cold cache). Then the simulator on the
same case (scripts/benchkit/sim: 2 workers, the same partitions, records and work), which
charges a move nothing but the wait for the lane to drain: where the host's idle time around
moves exceeds the simulator's, that excess is what a move costs here.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]

import bench  # noqa: E402
from benchkit.work import calibrate  # noqa: E402

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402


@dataclass(frozen=True)
class Call:
    pid: int
    partition: int
    offset: int
    records: int
    start: int  # ns, CLOCK_MONOTONIC (one clock for every process)
    end: int


def read_timelines(d: Path) -> list[Call]:
    calls = []
    for f in d.glob("*.timeline"):
        pid = int(f.stem)
        for line in f.read_text().splitlines():
            p, o, n, s, e = (int(x) for x in line.split())
            calls.append(Call(pid, p, o, n, s, e))
    return sorted(calls, key=lambda c: c.start)


def analyse(calls: list[Call]) -> dict[str, Any]:
    """Gaps (µs) on workers and in partitions, split by moves; busy shares; µs a record cold/warm."""
    t0, t1 = calls[0].start, max(c.end for c in calls)
    by_pid: dict[int, list[Call]] = {}
    last_of: dict[int, Call] = {}
    moved_in: set[Call] = set()  # a call whose partition's previous call was on another worker
    lane_gap = {"stay": [], "move": []}
    for c in calls:
        prev = last_of.get(c.partition)
        if prev is not None:
            kind = "stay" if prev.pid == c.pid else "move"
            lane_gap[kind].append((c.start - prev.end) / 1e3)
            if kind == "move":
                moved_in.add(c)
        last_of[c.partition] = c
        by_pid.setdefault(c.pid, []).append(c)
    worker_gap = {"stay": [], "move": []}
    for seq in by_pid.values():
        for a, b in itertools.pairwise(seq):
            worker_gap["move" if b in moved_in else "stay"].append((b.start - a.end) / 1e3)
    span = (t1 - t0) / 1e9
    busy = [sum(c.end - c.start for c in seq) / 1e9 / span for seq in by_pid.values()]
    per_record = {"cold": [(c.end - c.start) / 1e3 / c.records for c in calls
                           if c in moved_in and c.records > 1],
                  "warm": [(c.end - c.start) / 1e3 / c.records for c in calls
                           if c not in moved_in and c.records > 1]}
    return {"span_s": span, "calls": len(calls), "moves": len(moved_in), "busy": busy,
            "lane_gap": lane_gap, "worker_gap": worker_gap, "per_record": per_record}


def _q(xs: list[float]) -> str:
    if not xs:
        return "-"
    xs = sorted(xs)
    return (f"n={len(xs)} p50 {statistics.median(xs):.0f} p90 {xs[int(0.9 * (len(xs) - 1))]:.0f} "
            f"mean {statistics.fmean(xs):.0f}")


def simulate(partitions: int, workers: int, records: int, work_us: float, ack_us: float) -> dict[str, Any]:
    from benchkit.sim.cases import Case, run_ringmaster

    out = run_ringmaster(Case("lane moves", workers=workers, partitions=partitions, records=records,
                              work_us=work_us, sup_us=2.0, ack_us=ack_us))
    return {"efficiency": out.efficiency, "busy": out.busy, "moves": out.lane_moves}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work-us", type=float, default=100.0)
    ap.add_argument("--seconds", type=float, default=4.0, help="work per run, all workers together")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--outputs", action="store_true", help="one output a record ([output] topic)")
    args = ap.parse_args()
    iterations, work_us = calibrate(args.work_us)
    records = int(args.seconds * 1e6 / work_us)
    print(f"~{args.work_us:.0f} µs of work: {iterations} iterations = {work_us:.1f} µs; {records:,} records, "
          f"{args.partitions} partitions, {args.workers} workers; load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        for run in range(args.runs):
            topic = f"lane-moves-{uuid.uuid4().hex[:6]}"
            ensure_topics(broker.bootstrap, [topic], partitions=args.partitions)
            bench.produce(broker.bootstrap, topic, records, [256])
            timeline = tmp / f"run{run}"
            timeline.mkdir()
            env = {"RINGMASTER__WORKERS__SETTINGS__TIMELINE_DIR": str(timeline)}
            if args.outputs:
                out_topic = f"{topic}-out"
                ensure_topics(broker.bootstrap, [out_topic], partitions=args.partitions)
                env |= {"RINGMASTER__OUTPUT__TOPIC": out_topic,
                        "RINGMASTER__WORKERS__SETTINGS__OUTPUTS": "true"}
            started = time.monotonic()
            r = bench.run_ringmaster(broker.bootstrap, topic, records, "cpu", iterations, args.workers, tmp,
                                     env)
            a = analyse(read_timelines(timeline))
            wall = time.monotonic() - started
            print(f"run {run + 1}: {r['records'] / r['window_s']:,.0f} records/s ({wall:.1f} s"
                  f" wall), load average {os.getloadavg()[0]:.1f}; {a['calls']} calls, {a['moves']} moves; "
                  f"busy {' '.join(f'{b:.3f}' for b in a['busy'])} of {a['span_s']:.2f} s")
            for kind in ("stay", "move"):
                came = "was there" if kind == "stay" else "moved in"
                print(f"  worker gap before a call whose partition {came} "
                      f"(µs): {_q(a['worker_gap'][kind])}")
                print(f"  partition gap, {'same worker' if kind == 'stay' else 'another worker'} (µs): "
                      f"{_q(a['lane_gap'][kind])}")
            for kind in ("warm", "cold"):
                which = "first batch after a move" if kind == "cold" else "the rest"
                print(f"  µs a record, {kind} ({which}): "
                      f"{_q(a['per_record'][kind])}")
    for ack_us in (0.0, 500.0):
        s = simulate(args.partitions, args.workers, records, work_us, ack_us)
        print(f"simulator, acks {ack_us:.0f} µs: efficiency {s['efficiency']:.3f}, busy "
              f"{' '.join(f'{b:.3f}' for b in s['busy'])}, {s['moves']} moves")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
