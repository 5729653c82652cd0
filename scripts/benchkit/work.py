"""The work each consumer does per record, and the ringmaster plugin that does it."""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Sequence
from typing import Any

WORKLOADS = ("trivial", "cpu", "mixed")


def spin(iterations: int) -> int:
    """Pure-Python CPU work (no C calls that release the GIL)."""
    h = 0
    for i in range(iterations):
        h = (h * 31 + i) & 0xFFFFFFFF
    return h


def calibrate(target_us: float = 100.0) -> tuple[int, float]:
    """Iterations of spin() taking ~target_us on this machine, and the measured µs. Each step
    times with time_work (medians of rounds): one pass of 20 calls, timed as a whole, once
    gave 1,358 iterations for "100 µs" that then took 874 µs on a busy host."""
    n = 100
    for _ in range(3):
        n = max(1, round(n * target_us / max(time_work(n), 1e-3)))
    return n, time_work(n)


def time_work(iterations: int) -> float:
    """µs one spin(iterations) takes now (median of 5 rounds of 200)."""
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(200):
            spin(iterations)
        samples.append((time.perf_counter() - t) / 200 * 1e6)
    return sorted(samples)[2]


def do_work(workload: str, iterations: int, value: bytes | None) -> int:
    if workload == "cpu":
        return spin(iterations)
    if workload == "mixed":
        return zlib.crc32(value or b"")
    return len(value or b"")


# -- ringmaster plugin (module path: benchkit.work) -------------------------------------
_workload = "trivial"
_iterations = 0
_latency_fd: int | None = None
_timeline_fd: int | None = None  # one line a batch: partition, first offset, records, start and end ns
_outputs = False
_echo = False  # one output per record, its value the record's (scripts/benchkit/exactly_once.py)


def setup(context: Any) -> None:
    global _workload, _iterations, _latency_fd, _timeline_fd, _outputs, _echo
    _workload = context.settings.get("workload", "trivial")
    _iterations = int(context.settings.get("iterations", 0))
    _outputs = str(context.settings.get("outputs", "")).lower() in ("1", "true")  # one output a record
    _echo = bool(context.settings.get("echo", False))
    ldir = context.settings.get("latency_dir")
    if ldir:
        _latency_fd = os.open(os.path.join(ldir, f"{os.getpid()}.lat"),
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    tdir = context.settings.get("timeline_dir")
    if tdir:  # scripts/bench_lane_moves.py
        _timeline_fd = os.open(os.path.join(tdir, f"{os.getpid()}.timeline"),
                               os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def process(batch: Sequence[Any]) -> list[Any] | None:
    if _timeline_fd is None:
        return _process(batch)
    start = time.monotonic_ns()
    out = _process(batch)
    os.write(_timeline_fd, b"%d %d %d %d %d\n" % (batch[0].partition, batch[0].offset, len(batch), start,
                                                  time.monotonic_ns()))
    return out


def _process(batch: Sequence[Any]) -> list[Any] | None:
    w, n = _workload, _iterations
    if _outputs:  # the same output as the naive peers' (benchkit.runners.Outputs)
        return [b"%08x" % (do_work(w, n, r.value) & 0xFFFFFFFF) for r in batch]
    for r in batch:
        do_work(w, n, r.value)
    if _latency_fd is not None:
        now = time.time_ns()
        os.write(_latency_fd, "".join(f"{(now - int(r.value[:19])) / 1e6:.3f}\n" for r in batch).encode())
    if _echo:
        from runtime.plugin import Output

        return [Output(r.value, r.key) for r in batch]
    return None
