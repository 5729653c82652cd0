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
    """Iterations of spin() taking ~target_us on this machine, and the measured µs."""
    n = 1000
    while True:
        t = time.perf_counter()
        for _ in range(20):
            spin(n)
        per = (time.perf_counter() - t) / 20 * 1e6
        if per > 5:
            n = max(1, int(n * target_us / per))
            break
        n *= 4
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
_echo = False  # one output per record, its value the record's (scripts/benchkit/exactly_once.py)


def setup(context: Any) -> None:
    global _workload, _iterations, _latency_fd, _echo
    _workload = context.settings.get("workload", "trivial")
    _iterations = int(context.settings.get("iterations", 0))
    _echo = bool(context.settings.get("echo", False))
    ldir = context.settings.get("latency_dir")
    if ldir:
        _latency_fd = os.open(os.path.join(ldir, f"{os.getpid()}.lat"),
                              os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def process(batch: Sequence[Any]) -> list[Any] | None:
    w, n = _workload, _iterations
    for r in batch:
        do_work(w, n, r.value)
    if _latency_fd is not None:
        now = time.time_ns()
        os.write(_latency_fd, "".join(f"{(now - int(r.value[:19])) / 1e6:.3f}\n" for r in batch).encode())
    if _echo:
        from runtime.plugin import Output

        return [Output(r.value, r.key) for r in batch]
    return None
