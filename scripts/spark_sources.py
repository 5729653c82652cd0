"""Ringmaster's Python Kafka source vs Spark's own (spark.source = "kafka"), side by side: the
same backfill job (earliest → latest of a 4-partition topic, workers.fingerprint, outputs
produced by ringmaster's sink) run --runs times per source in one warm Spark session
(local[2]), alternating, each into a fresh output topic. Prints records/s min/median/max per
source (JVM and session start excluded: both pay them alike). Usage:
    .venv/bin/python scripts/spark_sources.py [--records 40000] [--runs 3] [--broker tansu|kafka]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from demo import items, produce  # noqa: E402

from runtime.config import load_settings  # noqa: E402
from runtime.dev.kafkabroker import ApacheKafkaBroker  # noqa: E402
from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402


def one_run(spark: Any, settings: Any, source: str, out: str) -> float:
    """Seconds for one backfill of every record, read by ``source``, written to ``out``."""
    from runtime.spark import builtin_source, job
    from runtime.spark import offsets as ko
    from runtime.spark.apply import applier
    from runtime.spark.source import NAME, OUTPUT_SCHEMA

    settings = settings.model_copy(update={"output": settings.output.model_copy(update={"topic": out})})
    c = job.driver_client(settings)
    try:
        first, last = ko.plan(c, ko.partitions_of(c, settings.kafka.topics), "checked", "earliest", "latest")
    finally:
        c.close()
    t0 = time.monotonic()
    if source == "kafka":
        df = builtin_source.batch(spark, settings, first, last)
    else:
        df = spark.read.format(NAME).options(**job.source_options(settings),
                                             ranges=json.dumps(ko.ranges(first, last))).load()
    rows = job.arrange(df, settings).mapInArrow(applier(job.plugin_job(settings)), OUTPUT_SCHEMA)
    rows.write.format(NAME).options(**job.sink_options(settings)).mode("append").save()
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--broker", choices=["tansu", "kafka"], default="tansu")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    with (DevBroker() if args.broker == "tansu" else ApacheKafkaBroker(log_path=tmp / "kafka.log")) as b:
        ensure_topics(b.bootstrap, ["news"], partitions=4)
        ensure_topics(b.bootstrap, ["dlq"], partitions=1)
        produce(b.bootstrap, "news", items(args.records))
        config = tmp / "c.toml"
        config.write_text(f"""[kafka]
bootstrap_servers = "{b.bootstrap}"
group_id = "sources"
topics = ["news"]
[workers]
plugin = "workers.fingerprint"
[output]
topic = "unused"
[dead_letter]
topic = "dlq"
[control]
enabled = false
[spark]
master = "local[2]"
source = "kafka"
""")
        settings = load_settings(config)
        from runtime.spark.job import session

        spark = session(settings)  # with Spark's Kafka source's jars; ours is registered always
        try:
            seconds: dict[str, list[float]] = {"python": [], "kafka": []}
            one_run(spark, settings, "python", "warmup")  # Python workers, plugin import, JIT
            for i in range(args.runs):
                for source in seconds:
                    out = f"out-{source}-{i}"
                    ensure_topics(b.bootstrap, [out], partitions=1)
                    seconds[source].append(one_run(spark, settings, source, out))
        finally:
            spark.stop()
    result: dict[str, Any] = {"records": args.records, "runs": args.runs, "broker": args.broker}
    for source, runs in seconds.items():
        rates = sorted(args.records / s for s in runs)
        result[source] = {"min": round(rates[0]), "median": round(statistics.median(rates)),
                          "max": round(rates[-1]), "seconds": [round(s, 2) for s in runs]}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
