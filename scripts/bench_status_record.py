"""Micro-benchmark: what publishing its status record (runtime/ops/member_status.py, for
``ringmaster console``) costs the supervisor, per publication and as a share of one core at
the default interval, against the status snapshot the supervisor builds anyway (the baseline:
``Reporter.snapshot`` runs every ``supervisor.status_interval_s`` whether or not anything is
published). Timed in CPU time of the thread, interleaved rounds, with a real producer against
the embedded broker (the queueing and delivery callbacks included; librdkafka's own threads
are not the supervisor's loop).

    .venv/bin/python scripts/bench_status_record.py [--rounds 15] [--per-round 200]

Prints min / median / max µs per publication for snapshots of 16, 256 and 1,024 partitions
(16 workers), the record's size, and what that is of one core at control.status_interval_s = 5.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.producer import OutputProducer  # noqa: E402
from runtime.ops.member_status import Extra, StatusPublisher, render  # noqa: E402
from runtime.ops.status import PartitionStatus, StatusSnapshot, WindowCpu, WorkerStatus  # noqa: E402


def snapshot(partitions: int, workers: int) -> StatusSnapshot:
    parts = [PartitionStatus(tp=f"orders[{i}]", topic="orders", partition=i, worker=i % workers,
                             paused=False, pause_reasons=[], holds={}, blocked=None, committed=10_000 + i,
                             done_through=10_000 + i, high=10_500 + i, lag=500, pending_batches=2,
                             records=123_456, consumed=123_956, outputs=123_456, dead_letters=3,
                             oldest_unprocessed_s=0.25, rate=1234.5)
             for i in range(partitions)]
    ws = [WorkerStatus(index=i, pid=1000 + i, alive=True, state="ready", cpu_s=12.5, records=1_000_000,
                       in_flight=2, ring_fill=0.1, restarts=0, rss=80 * 2**20, heartbeat_age_s=0.1,
                       busy_s=11.0, plugin_version="v1", generation=1) for i in range(workers)]
    return StatusSnapshot(pid=1, group="bench", ordering="partition", elapsed_s=100.0, window_s=99.0,
                          join_s=1.0, supervisor_cpu_s=50.0, window_cpu_s=WindowCpu(40.0, 900.0),
                          supervisor_rss=100 * 2**20, records=10**7, rate=100_000.0, outputs=10**7,
                          dead_letters=3, discarded=0, batches=10**5, consumed=10**7, deferred=0, restarts=0,
                          paused=0, lag=500 * partitions, partitions=parts, workers=ws, revocations=[],
                          committed={p.tp: 10_000 for p in parts}, ready=True, recent_rate=100_000.0,
                          plugin="p", plugin_version="v1")


def cpu_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - t0) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--per-round", type=int, default=200)
    args = ap.parse_args()
    extra = Extra("at-least-once", "consumer", 42, [])
    with DevBroker() as broker:
        sender = OutputProducer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        print(f"{'partitions':>10} {'bytes':>7} {'publish µs (min/median/max)':>30} "
              f"{'snapshot as JSON µs':>22} {'of a core at 5 s':>17}")
        for partitions in (16, 256, 1024):
            snap = snapshot(partitions, 16)
            pub = StatusPublisher("bench.status", sender, 0.0, lambda: extra, "bench:1")
            size = len(render(snap, "bench:1", 5.0, extra, 0.0))
            publish, baseline = [], []
            for _ in range(args.rounds):  # interleaved: both see the same load
                publish.append(cpu_us(lambda: pub.offer(snap), args.per_round))  # noqa: B023
                baseline.append(cpu_us(lambda: json.dumps(asdict(snap)), args.per_round))  # noqa: B023
                sender.poll(0.05)
            p = sorted(publish)
            print(f"{partitions:>10} {size:>7} {p[0]:>9.0f} / {statistics.median(p):>6.0f} / {p[-1]:>6.0f}"
                  f" {statistics.median(baseline):>22.0f} {statistics.median(p) / 5e6:>16.4%}")
        sender.flush(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
