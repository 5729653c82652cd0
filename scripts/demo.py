"""The demo behind ./scripts/demo: news-wire items with near-duplicates, fingerprinted by
the built-in `workers.fingerprint` plugin on every core, with a live progress display."""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402

console = Console(stderr=True)
RINGMASTER = ROOT / ".venv" / "bin" / "ringmaster"


def shown(cmd: list[str]) -> str:
    """``cmd`` as a line that can be pasted into a shell at the clone's root (where
    ./scripts/demo runs it): the ringmaster of the clone's .venv, paths under the clone relative,
    every argument quoted as the shell needs."""
    def rel(arg: str) -> str:
        path = Path(arg)
        return str(path.relative_to(ROOT)) if path.is_absolute() and path.is_relative_to(ROOT) else arg

    return "$ " + shlex.join(rel(a) for a in cmd)
CITIES = ["Lyon", "Osaka", "Denver", "Porto", "Leeds", "Quito", "Tartu", "Perth", "Bergen", "Accra",
          "Hanoi", "Tucson", "Graz", "Cork", "Malmo", "Recife"]
ACTORS = ["city council", "regional court", "transit authority", "university board", "health agency",
          "port operator", "energy regulator", "school district", "police department", "water utility"]
VERBS = ["approves", "delays", "rejects", "reviews", "expands", "cuts", "announces", "suspends"]
OBJECTS = ["a new budget for public libraries", "plans for a light rail extension",
           "a ban on single-use plastics", "funding for flood defences", "a pilot for free buses",
           "a tax on vacant homes", "repairs to the main bridge", "a new wind farm offshore",
           "changes to school meal contracts", "a review of emergency response times"]
AFTER = ["after a long debate on {day}", "following months of protests", "citing rising costs",
         "despite warnings from experts", "in a narrow vote on {day}", "amid a record heat wave",
         "after an audit found errors", "as inflation eases"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
SOURCES = ["wire-a", "wire-b", "local-desk", "aggregator"]
BODY = """residents officials budget contract vote meeting report council members project plan costs
delay construction station route tickets fares drivers union strike agreement talks weekend
summer winter rainfall drought reservoir levels pumps pipes leak repair crews overnight traffic
detour bridge lanes cyclists pedestrians safety audit inspectors findings errors payments
suppliers tender bids prices inflation wages rent housing tenants landlords permits zoning
density towers parks trees heat shade cooling centres hospital beds nurses doctors waiting
lists clinics pharmacy vaccines schools teachers pupils meals lunches menus farmers markets
fishing quotas harbour cranes containers ships freight rail depot electric buses chargers grid
solar panels turbines cables substation outage storm warning flood barriers sandbags volunteers
donations charity festival concert stadium tickets tourism hotels visitors museum exhibition
library archive records court judge ruling appeal lawyers fines police patrols cameras privacy
data breach hackers software upgrade servers emergency calls response times ambulance fire
brigade wildfire evacuation""".split()


def headline(rng: random.Random) -> str:
    after = rng.choice(AFTER).format(day=rng.choice(DAYS))
    body = " ".join(rng.choice(BODY) for _ in range(24))
    return (f"{rng.choice(CITIES)} {rng.choice(ACTORS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} "
            f"{after}. {body}. Figures of {rng.randrange(2, 900)} million were quoted.")


def items(n: int, seed: int = 42) -> tuple[list[bytes], int]:
    """~8 % of items are republications of an earlier one with one word changed; the items, and
    how many are republications."""
    rng = random.Random(seed)
    out: list[bytes] = []
    texts: list[str] = []
    republished = 0
    for i in range(n):
        if texts and rng.random() < 0.08:
            republished += 1
            words = rng.choice(texts[-5000:]).split()
            words[rng.randrange(len(words))] = rng.choice(DAYS)
            text = " ".join(words)
        else:
            text = headline(rng)
            texts.append(text)
        out.append(json.dumps({"id": f"n-{i:07d}", "source": rng.choice(SOURCES),
                               "ts": 1_790_000_000_000 + i, "text": text}).encode())
    return out, republished


def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": "lz4"})
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("producing", total=len(values))
        for i, v in enumerate(values):
            while True:
                try:
                    p.produce(topic, v, key=v[7:17])
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 5000 == 0:
                p.poll(0)
                bar.update(task, completed=i)
        p.flush(60)


def count_duplicates(bootstrap: str, topic: str, expect: int) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-reader-{os.getpid()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    seen = dups = 0
    deadline = time.monotonic() + 120
    while seen < expect and time.monotonic() < deadline:
        for m in c.consume(5000, 0.5):
            if m.error() is None:
                seen += 1
                dups += b'"near_duplicate_of":null' not in m.value()
    c.close()
    return dups


def run_spark(bootstrap: str, config: Path, workdir: Path, args: argparse.Namespace) -> int:
    """The same plugin and topic on Spark (local mode), into its own output topic and group."""
    ensure_topics(bootstrap, ["news.fingerprints.spark"], partitions=1)
    spark_cfg = workdir / "demo-spark.toml"
    spark_cfg.write_text(config.read_text()
                         .replace('group_id = "demo-fingerprint"', 'group_id = "demo-fingerprint-spark"')
                         .replace('topic = "news.fingerprints"', 'topic = "news.fingerprints.spark"')
                         + f"""
[spark]
master = "local[{args.processes}]"
trigger = "availableNow"
max_records_per_trigger = 50000
checkpoint_location = "{workdir / 'spark-checkpoint'}"
""")
    import shutil
    shutil.rmtree(workdir / "spark-checkpoint", ignore_errors=True)
    cmd = [str(RINGMASTER), "spark", "run", "-c", str(spark_cfg)]
    console.print(shown(cmd), markup=False, highlight=False)
    t0 = time.monotonic()
    code = subprocess.call(cmd, cwd=ROOT)
    if code == 0:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-fingerprint-spark"})
        parts = c.committed([TopicPartition("news", p) for p in range(args.partitions)], timeout=10)
        c.close()
        done = sum(p.offset for p in parts if p.offset >= 0)
        console.print(f"spark: {done:,} of {args.records:,} records committed for group "
                      f"'demo-fingerprint-spark' in {time.monotonic() - t0:.1f} s (JVM start included)")
        code = 0 if done == args.records else 1
    return code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--records", type=int, default=250_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--processes", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--spark", action="store_true",
                    help="then run the same plugin over the same topic with `ringmaster spark run`")
    args = ap.parse_args()

    workdir = ROOT / "run" / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    with DevBroker(log_path=workdir / "broker.log") as broker:
        console.print(f"[bold]embedded broker[/] (Tansu, memory-only) on {broker.bootstrap}")
        ensure_topics(broker.bootstrap, ["news"], partitions=args.partitions)
        ensure_topics(broker.bootstrap, ["news.fingerprints", "news.dead-letter"], partitions=1)
        console.print(f"generating {args.records:,} news items (~8 % near-duplicates)")
        values, republished = items(args.records)
        t0 = time.monotonic()
        produce(broker.bootstrap, "news", values)
        console.print(f"produced {len(values):,} records to 'news' in {time.monotonic() - t0:.1f} s")
        config = workdir / "demo.toml"
        config.write_text(f"""# written by scripts/demo
[kafka]
bootstrap_servers = "{broker.bootstrap}"
group_id = "demo-fingerprint"
topics = ["news"]

[workers]
plugin = "workers.fingerprint"
processes = {args.processes}

[workers.settings]
threshold = 0.7

[output]
topic = "news.fingerprints"

[dead_letter]
topic = "news.dead-letter"

[kafka.consumer]
# The embedded broker takes about session.timeout.ms / 2 to form a group.
"session.timeout.ms" = 6000
"heartbeat.interval.ms" = 1000

[supervisor]
status_interval_s = 0.5
""")
        summary = workdir / "summary.json"
        cmd = [str(RINGMASTER), "run", "-c", str(config),
               "--until-caught-up", "--progress", "--summary", "--summary-json", str(summary),
               "--expect-records", str(args.records)]
        console.print(shown(cmd), markup=False, highlight=False)
        code = subprocess.call(cmd, cwd=ROOT)
        if code != 0:
            console.print(f"[red]ringmaster exited with {code}[/]")
            return code
        final = json.loads(summary.read_text())
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "demo-fingerprint"})
        parts = c.committed([TopicPartition("news", p) for p in range(args.partitions)], timeout=10)
        c.close()
        committed = sum(p.offset for p in parts if p.offset >= 0)
        dups = count_duplicates(broker.bootstrap, "news.fingerprints", final["outputs"])
        console.print(f"committed offsets cover {committed:,} of {args.records:,} records; "
                      f"{dups:,} near-duplicates flagged in 'news.fingerprints', of the {republished:,} "
                      "republications generated")
        n = args.processes
        console.print(f"(a republication is flagged when its original went through the same worker process: "
                      f"the plugin's index lives in each worker, and a partition's batches go to whichever "
                      f"of the {n} workers is free, so about 1 in {n} is flagged here. The band keys in each "
                      "output let a downstream job find the rest: workers/fingerprint.py)",
                      markup=False, highlight=False)
        if committed != args.records or final["records"] < args.records:
            console.print("[red]not every record was processed and committed[/]")
            return 1
        if args.spark:
            code = run_spark(broker.bootstrap, config, workdir, args)
            if code != 0:
                return code
    console.print("[green]demo finished: broker stopped[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
