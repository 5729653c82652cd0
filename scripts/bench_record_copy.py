"""Micro-benchmark: what handing the plugin copies of its records costs a worker per record
(runtime/execution/run.py ``copy_records``, issue 29), interleaved in one process so that
every contender sees the same machine load, timed in CPU time of the thread.

    .venv/bin/python scripts/bench_record_copy.py [--rounds 15] [--records 500]

Prints min / median / max ns per record for: decoding a frame into Records (the worker's
``records_of``, C and Python), copying them (``copy_records``), and one whole ``run_batch``
of a trivial plugin (one output per record, nothing delivered) with and without the copy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.execution import run as execution  # noqa: E402
from runtime.execution.run import RetryPolicy, copy_records, run_batch  # noqa: E402
from runtime.plugin import Plugin, Record  # noqa: E402
from runtime.transport.frames import Columns, decode_frame, encode_batch  # noqa: E402
from runtime.worker.decoding import _records_c, _records_py  # noqa: E402


def frame_columns(n: int) -> Columns:
    headers = [[("trace", b"t-%d" % i)] if i % 2 else None for i in range(n)]
    cols = Columns(1000, None, [b"key-%d" % i for i in range(n)], [b"v" * 256] * n, headers, 1,
                   [1_700_000_000_000 + i for i in range(n)])
    frame = decode_frame(memoryview(encode_batch(1, 0, 1, "t", 0, cols)))
    assert frame is not None
    return frame.columns


def trivial(batch: Sequence[Record]) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for r in batch]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--records", type=int, default=500)
    args = ap.parse_args()
    cols = frame_columns(args.records)
    records = _records_py("t", 0, cols)
    plugin = Plugin("trivial", trivial, None, None)
    policy = RetryPolicy()
    real_copy = execution.copy_records

    def run(copying: bool) -> Any:
        execution.copy_records = real_copy if copying else list  # type: ignore[assignment]
        try:
            return run_batch(plugin, records, policy)
        finally:
            execution.copy_records = real_copy

    contenders: dict[str, Callable[[], Any]] = {
        "records_of, C": lambda: _records_c("t", 0, cols),
        "records_of, Python": lambda: _records_py("t", 0, cols),
        "copy_records": lambda: copy_records(records),
        "run_batch, no copy": lambda: run(False),
        "run_batch, copies": lambda: run(True),
    }
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(args.rounds):
        for name, fn in contenders.items():
            reps = 50
            t0 = time.thread_time_ns()
            for _ in range(reps):
                fn()
            samples[name].append((time.thread_time_ns() - t0) / reps / args.records)
    print(f"ns per record (thread CPU time), {args.records} records of 256 B (half with a header), "
          f"{args.rounds} interleaved rounds")
    for name, xs in samples.items():
        print(f"  {name:20s} min {min(xs):7.1f}  median {statistics.median(xs):7.1f}  max {max(xs):7.1f}")


if __name__ == "__main__":
    main()
