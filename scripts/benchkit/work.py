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


# With this set (scripts/benchkit/naive.py), every consumer's process appends, for each batch,
# its records and the CPU its thread spent in the work alone to <dir>/<pid>.work: in the same
# run, the work's own CPU apart from what each consumer spends around it (Pool, a worker).
WORK_CPU_ENV = "BENCHKIT_WORK_CPU_DIR"
_work_cpu_dir = os.environ.get(WORK_CPU_ENV)
_work_cpu_fd: int | None = None


def work_batch(workload: str, iterations: int, values: Sequence[bytes | None]) -> list[int]:
    """do_work over a batch's values; timed as a whole (a CPU clock read costs ~0.65 µs, too
    much for each record) when WORK_CPU_ENV is set."""
    global _work_cpu_fd
    if _work_cpu_dir is None or not values:  # an empty poll is no batch: nothing to note
        return [do_work(workload, iterations, v) for v in values]
    start = time.thread_time_ns()
    out = [do_work(workload, iterations, v) for v in values]
    spent = time.thread_time_ns() - start
    if _work_cpu_fd is None:
        _work_cpu_fd = os.open(os.path.join(_work_cpu_dir, f"{os.getpid()}.work"),
                               os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(_work_cpu_fd, b"%d %d\n" % (len(out), spent))
    return out


def work_cpu(directory: str) -> tuple[int, float] | None:
    """The records and CPU seconds the work took in every process that wrote to
    ``directory`` (None: none did, e.g. an older checkout's plugin)."""
    records, ns = 0, 0
    for name in os.listdir(directory):
        if name.endswith(".work"):
            with open(os.path.join(directory, name)) as f:
                for line in f:
                    n, spent = line.split()
                    records, ns = records + int(n), ns + int(spent)
    return (records, ns / 1e9) if records else None


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
    results = work_batch(w, n, [r.value for r in batch])
    if _outputs:  # the same output as the naive peers' (benchkit.runners.Outputs)
        return [b"%08x" % (h & 0xFFFFFFFF) for h in results]
    if _latency_fd is not None:
        now = time.time_ns()
        os.write(_latency_fd, "".join(f"{(now - int(r.value[:19])) / 1e6:.3f}\n" for r in batch).encode())
    if _echo:
        from runtime.plugin import Output

        return [Output(r.value, r.key) for r in batch]
    return None
