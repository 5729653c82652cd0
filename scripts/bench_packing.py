"""Micro-benchmark: the supervisor's per-record packing cost (pack_run's C and Python paths)
on well-formed messages, against a baseline, interleaved in one process so that both see the
same machine load, timed in CPU time of the thread (a shared machine's other processes do not
count, their cache traffic still does).

    .venv/bin/python scripts/bench_packing.py --baseline REV [--rounds 15] [--records 500]

REV is a git revision (e.g. the commit before a change): its _speedups.c is compiled to a
temporary file with the flags of setup.py and its packing.py's Python packer is loaded
beside the current one. Prints min / median / max ns per record for each of the four.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Message  # noqa: E402

from runtime.errors import UnreadableRecord  # noqa: E402
from runtime.kafka.messages import bind_packer  # noqa: E402
from runtime.transport import packing, speedups  # noqa: E402
from runtime.transport.frames import BATCH  # noqa: E402

bind_packer()  # the current packer, as the daemon's consumer binds it


def baseline(rev: str, tmp: Path) -> tuple[Any, Callable[..., bytes]]:
    src = subprocess.run(["git", "show", f"{rev}:runtime/transport/_speedups.c"], cwd=ROOT, check=True,
                         capture_output=True).stdout
    (tmp / "_speedups.c").write_bytes(src)
    so = tmp / "_speedups.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", f"-I{sysconfig.get_paths()['include']}",
                    str(tmp / "_speedups.c"), "-o", str(so)], check=True)
    spec = importlib.util.spec_from_file_location("baseline._speedups", so)
    assert spec is not None and spec.loader is not None
    native = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(native)
    native.bind(Message, UnreadableRecord)
    py_src = subprocess.run(["git", "show", f"{rev}:runtime/transport/packing.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    old = types.ModuleType("baseline_packing")
    exec(compile(py_src, "baseline_packing.py", "exec"), old.__dict__)
    old.bind(Message)  # its PACK switch is not used: _pack_run_py is called directly
    return native, old._pack_run_py


def messages(n: int) -> list[Message]:
    return [Message(topic="t", partition=0, offset=1000 + i, key=b"key-%d" % i, value=b"v" * 256,
                    headers=[("trace", b"t-%d" % i)] if i % 2 else None, timestamp=(1, 1_700_000_000_000 + i))
            for i in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", required=True)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--records", type=int, default=500)
    args = ap.parse_args()
    assert speedups.native is not None, "build the extension first"
    speedups.native.bind(Message, UnreadableRecord)
    msgs = messages(args.records)
    head = (BATCH, 1, 0, 1, "t", 0)
    with tempfile.TemporaryDirectory() as tmp:
        old_c, old_py = baseline(args.baseline, Path(tmp))
        contenders: dict[str, Callable[[], bytes]] = {
            "C before": lambda: old_c.pack_frame(head, msgs, 0, len(msgs)),
            "C after": lambda: speedups.native.pack_frame(head, msgs, 0, len(msgs)),  # type: ignore[union-attr]
            "Python before": lambda: old_py(head, msgs, 0, len(msgs)),
            "Python after": lambda: packing._pack_run_py(head, msgs, 0, len(msgs)),
        }
        frames = {name: fn() for name, fn in contenders.items()}
        assert len(set(frames.values())) == 1, "the four packers must write the same bytes"
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, fn in contenders.items():  # interleaved: every round runs all four
                reps = 200 if name.startswith("C") else 50
                t0 = time.thread_time_ns()
                for _ in range(reps):
                    fn()
                samples[name].append((time.thread_time_ns() - t0) / reps / len(msgs))
    print(f"ns per record (thread CPU time), {args.records} records of 256 B (half with a header), "
          f"{args.rounds} interleaved rounds")
    for name, xs in samples.items():
        print(f"  {name:14s} min {min(xs):7.1f}  median {statistics.median(xs):7.1f}  max {max(xs):7.1f}")


if __name__ == "__main__":
    main()
