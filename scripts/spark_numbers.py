"""Spark vs ringmaster on the same records and the same CPU-bound plugin (workers.fingerprint):
`ringmaster spark run` (local[2], availableNow) cold (process start → exit) and warm (rows/s
of the micro-batches after the first), next to `ringmaster run`. Usage:
    .venv/bin/python scripts/spark_numbers.py [--records 40000]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from demo import items, produce  # noqa: E402

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    with DevBroker() as b:
        ensure_topics(b.bootstrap, ["news"], partitions=4)
        ensure_topics(b.bootstrap, ["out-local", "out-spark", "dlq"], partitions=1)
        produce(b.bootstrap, "news", items(args.records))
        base = f"""[kafka]
bootstrap_servers = "{b.bootstrap}"
topics = ["news"]
[kafka.consumer]
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 500
[workers]
plugin = "workers.fingerprint"
processes = 2
[dead_letter]
topic = "dlq"
"""
        local = tmp / "local.toml"
        local.write_text(base.replace("[kafka]\n", '[kafka]\ngroup_id = "local"\n') +
                         '[output]\ntopic = "out-local"\n')
        summary = tmp / "s.json"
        subprocess.run([str(ROOT / ".venv/bin/ringmaster"), "run", "-c", str(local), "--until-caught-up",
                        "--no-progress", "--summary-json", str(summary)], check=True, capture_output=True)
        s = json.loads(summary.read_text())
        spark = tmp / "spark.toml"
        spark.write_text(base.replace("[kafka]\n", '[kafka]\ngroup_id = "spark"\n') +
                         '[output]\ntopic = "out-spark"\n[spark]\nmaster = "local[2]"\n'
                         'trigger = "availableNow"\nend_offsets = "fetch"\n'
                         f'max_records_per_trigger = {args.records // 5}\n'
                         f'checkpoint_location = "{tmp / "ckpt"}"\n')
        t0 = time.monotonic()
        r = subprocess.run([str(ROOT / ".venv/bin/ringmaster"), "spark", "run", "-c", str(spark)],
                           capture_output=True, text=True)
        cold = time.monotonic() - t0
        assert r.returncode == 0, r.stderr[-2000:]
        rates = [int(x) for x in re.findall(r"rows_per_s=(\d+)", r.stderr)]
        warm = sorted(rates[1:])[len(rates[1:]) // 2] if len(rates) > 1 else None
    print(json.dumps({"records": args.records, "ringmaster_run_rate": round(s["records"] / s["window_s"]),
                      "ringmaster_run_window_s": s["window_s"], "ringmaster_run_join_s": s["join_s"],
                      "spark_cold_s": round(cold, 1), "spark_cold_rate": round(args.records / cold),
                      "spark_warm_rate_median": warm, "spark_batch_rates": rates}))


if __name__ == "__main__":
    main()
