"""Micro-benchmark: what a worker spends per record around the plugin when every record
gives one output (runtime/worker/batch_runner.py ``BatchRunner``: copies for the plugin, the
outputs checked, produced with the version header, and waited for), against a Tansu broker
of its own. The plugin does no work (scripts/benchkit/work.py, ``outputs = true``, 0
iterations), so what is left is the runtime's cost.

    .venv/bin/python scripts/bench_output_path.py [--batches 100] [--records 500]

Prints CPU µs per record (the whole process: librdkafka's producer threads too) and wall µs
per record (the difference is mostly the wait for the broker's acknowledgements). To compare
two checkouts, run each one's copy of this script alternately, several times: one process
cannot hold two versions of the runtime.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]

import benchkit.work as work  # noqa: E402

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402
from runtime.kafka.producer import OutputProducer  # noqa: E402
from runtime.plugin import Context, Record, load_plugin  # noqa: E402
from runtime.worker.batch_runner import BatchRunner  # noqa: E402
from runtime.worker.spec import WorkerSpec  # noqa: E402


class _Board:
    """What BatchRunner asks of the shared board: nothing measured here."""

    batches, phase = 1, 0

    def set_phase(self, phase: int) -> None:
        pass

    def beat(self) -> None:
        pass


class _Frame:
    topic, partition, slot, letters = "in", 0, 0, False


def _prop(value: str) -> str | bool:
    """A property's value as the client takes it: its booleans as bool."""
    return {"true": True, "false": False}.get(value, value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100)
    ap.add_argument("--records", type=int, default=500, help="records a batch")
    ap.add_argument("--props", default="", metavar="K=V,...",
                    help="producer properties beside bootstrap.servers (e.g. linger.ms=5)")
    args = ap.parse_args()
    n = args.records
    settings: dict[str, Any] = {"workload": "cpu", "iterations": 0, "outputs": "true"}
    with DevBroker() as broker:
        out = f"bench-out-{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.bootstrap, [out], partitions=8)
        props = {"bootstrap.servers": broker.bootstrap,
                 **{k: _prop(v) for k, v in (kv.split("=", 1) for kv in args.props.split(",") if kv)}}
        spec = WorkerSpec(0, 0, "", "", "benchkit.work", settings, out, None, props, 3, 0.1, 1.0,
                          os.getppid())
        plugin = load_plugin("benchkit.work", "")
        work.setup(Context(spec.name, settings, out))
        runner = BatchRunner(plugin, spec, _Board(), OutputProducer(props), "v1")  # type: ignore[arg-type]
        batches = [[Record("in", 0, b * n + i, None, b"x" * 256, None, (1, 0)) for i in range(n)]
                   for b in range(args.batches + 1)]
        runner._run(_Frame(), (1, 0, 0), batches[0])  # type: ignore[arg-type]  # warm: metadata, first flush
        cpu0, wall0 = time.process_time(), time.monotonic()
        for records in batches[1:]:
            runner._run(_Frame(), (1, 0, 0), records)  # type: ignore[arg-type]
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        runner.close()
    total = args.batches * n
    print(f"per record: {cpu / total * 1e6:.2f} µs CPU, {wall / total * 1e6:.2f} µs wall "
          f"({args.batches} batches of {n})")


if __name__ == "__main__":
    main()
