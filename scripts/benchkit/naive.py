"""`./scripts/bench --naive`: on a small machine, against the naive peer, with outputs.

Run interleaved in one invocation, on a CPU-bound plugin, for each partition count (8 and 3 by
default: more lanes than workers, and one lane too many):

* a plain consumer loop that produces one output a record;
* N copies of it, one process each, the partitions dealt out between them: what running the
  loop N times on the host gives, and, with a multiple of N partitions, about what N cores can
  do for this work at all;
* `multiprocessing.Pool(N)` fed pickled chunks, its parent producing the outputs;
* ringmaster with N workers (`[output] topic`).

Besides records/s, where a record's CPU goes: every process of the run and the broker are
sampled per thread (psutil, /proc) every 50 ms, and their CPU split into the consumer side's
Python (the supervisor, the loop, Pool's parent), the workers' Python, librdkafka's threads on
each side (the consumer's fetching, the producers' sending) and the broker. A thread's CPU
counts from its start to its last sample, start-up included; µs per record over the records of
the run. And the work's own CPU, noted by every consumer's thread around each batch's work
(``benchkit.work.work_batch``): the window's CPU less it is what each consumer spends around
the work.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

CONSUMERS = ("plain loop", "pool", "ringmaster")


class ThreadCPU:
    """CPU seconds per thread of this process's descendants (the broker too), by role."""

    def __init__(self, broker_pid: int) -> None:
        self.broker_pid = broker_pid
        self.me = psutil.Process()
        self.seen: dict[tuple[int, int], tuple[str, float]] = {}  # (pid, tid) -> (role, cpu s)
        self.at_start: dict[tuple[int, int], float] = {}
        self.named_by: dict[tuple[int, int], float] = {}  # when a thread's name is taken as final
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _role(self, p: psutil.Process, tid: int, roots: set[int]) -> str:
        try:
            comm = Path(f"/proc/{p.pid}/task/{tid}/comm").read_text().strip()
        except OSError:
            comm = ""
        if p.pid == self.broker_pid:
            return "broker"
        side = "consumer side" if p.pid in roots else "workers"
        return f"{side} librdkafka" if comm.startswith("rdk:") else f"{side} Python"

    def sample(self) -> None:
        try:
            kids = self.me.children(recursive=True)
        except psutil.Error:
            return
        # The consumer side: the process the bench started (its parent is the bench itself).
        roots = {k.pid for k in kids if k.pid != self.broker_pid and _ppid(k) == self.me.pid}
        for p in kids:
            try:
                threads = p.threads()
            except psutil.Error:
                continue
            now = time.monotonic()
            for t in threads:
                key = (p.pid, t.id)
                old = self.seen.get(key)
                # Asked again while it looks like Python, for its first second: librdkafka names
                # its threads just after starting them. Asking every thread every time made a
                # sample cost ~3.9 ms of CPU (65 threads), ~8 % of a core at one every 50 ms.
                if old and (not old[0].endswith("Python") or now >= self.named_by[key]):
                    role = old[0]
                else:
                    role = self._role(p, t.id, roots)
                    self.named_by.setdefault(key, now + 1.0)
                self.seen[key] = (role, t.user_time + t.system_time)

    def __enter__(self) -> ThreadCPU:
        self.sample()
        self.at_start = {k: v for k, (_, v) in self.seen.items()}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.sample()

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.sample()

    def by_role(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, (role, cpu) in self.seen.items():
            out[role] = out.get(role, 0.0) + cpu - self.at_start.get(key, 0.0)
        return out


def _ppid(p: psutil.Process) -> int | None:
    try:
        return p.ppid()
    except psutil.Error:
        return None


def compare(args: argparse.Namespace, bench: Any) -> int:
    from benchkit.scale import _revision, machine
    from benchkit.work import calibrate, time_work
    from runtime.dev.tansu import DevBroker
    from runtime.kafka.admin import ensure_topics

    console = bench.console
    n = args.naive_workers
    roots: list[tuple[str, Path]] = [("ringmaster", bench.ROOT)]
    for other in [Path(d).resolve() for d in (args.scale_against or "").split(",") if d]:
        roots.append((f"ringmaster@{_revision(other)}", other))
    results: dict[str, Any] = {"machine": machine(), "workers": n, "runs": args.runs, "sets": [],
                               "revisions": {name: _revision(root) for name, root in roots}}
    iterations, work_us = calibrate(args.naive_work_us)
    records = max(1000, int(args.scale_seconds * 1e6 / work_us))
    console.print(f"~{args.naive_work_us:.0f} µs of work: {iterations} iterations = {work_us:.1f} µs; "
                  f"{records:,} records per run")
    with tempfile.TemporaryDirectory() as tmpdir, DevBroker() as broker:
        tmp = Path(tmpdir)
        for partitions in [int(x) for x in args.scale_partitions.split(",")]:
            topic, outputs = f"bench-naive-{uuid.uuid4().hex[:6]}", f"bench-naive-out-{uuid.uuid4().hex[:6]}"
            ensure_topics(broker.bootstrap, [topic], partitions=partitions)
            ensure_topics(broker.bootstrap, [outputs], partitions=partitions)
            bench.produce(broker.bootstrap, topic, records, [256])
            cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                ("plain loop", functools.partial(bench.run_peer, "baseline", broker.bootstrap, topic, records,
                                                 "cpu", iterations, 1, outputs)),
                (f"{n} plain loops", functools.partial(bench.run_peer, "copies", broker.bootstrap, topic,
                                                       records, "cpu", iterations, n, outputs)),
                (f"pool({n})", functools.partial(bench.run_peer, "pool", broker.bootstrap, topic, records,
                                                 "cpu", iterations, n, outputs))]
            env = {"RINGMASTER__OUTPUT__TOPIC": outputs, "RINGMASTER__WORKERS__SETTINGS__OUTPUTS": "true"}
            for name, root in roots:
                cases.append((f"{name}({n})", functools.partial(
                    bench.run_ringmaster, broker.bootstrap, topic, records, "cpu", iterations, n, tmp, env,
                    root=root)))
            if args.naive_variant:  # this checkout with other settings: RINGMASTER__X=V,...
                more = dict(kv.split("=", 1) for kv in args.naive_variant.split(","))
                cases.append((f"ringmaster({n}) {args.naive_variant}", functools.partial(
                    bench.run_ringmaster, broker.bootstrap, topic, records, "cpu", iterations, n, tmp,
                    env | more)))
            cases = [(label, functools.partial(_sampled, fn, broker.proc.pid, bench.ENV))
                     for label, fn in cases]
            console.print(f"  {partitions} partitions: {len(cases)} cases × {args.runs} runs")
            measured = bench.measure_all(cases, args.runs)
            results["sets"].append({"partitions": partitions, "records": records, "work_us": work_us,
                                    "work_us_after": time_work(iterations),
                                    "rows": [_summary(r, records) for r in measured]})
            _write(args, results)
    md = render(results)
    out = _write(args, results)
    (out / "naive.md").write_text("\n".join(md) + "\n")
    console.print("\n".join(md))
    return 0


def _sampled(fn: Callable[[], dict[str, Any]], broker_pid: int, env: dict[str, str]) -> dict[str, Any]:
    """One run, its CPU by role (ThreadCPU) and the work's own CPU (benchkit.work.work_batch:
    ``env`` is what the bench starts every consumer with)."""
    from benchkit.work import WORK_CPU_ENV, work_cpu

    with tempfile.TemporaryDirectory() as work_dir:
        env[WORK_CPU_ENV] = work_dir
        try:
            with ThreadCPU(broker_pid) as cpu:
                r = fn()
        finally:
            del env[WORK_CPU_ENV]
        r["cpu_by_role"] = cpu.by_role()
        work = work_cpu(work_dir)
    r["work_us_per_record"] = None if work is None else work[1] / work[0] * 1e6
    return r


def _summary(r: dict[str, Any], records: int) -> dict[str, Any]:
    roles = sorted({role for run in r["runs"] for role in run["cpu_by_role"]})
    us = {role: statistics.median(run["cpu_by_role"].get(role, 0.0) / records * 1e6 for run in r["runs"])
          for role in roles}
    keys = ("label", "min", "median", "max", "others_share", "main_us_per_record", "worker_us_per_record")
    work = [run["work_us_per_record"] for run in r["runs"] if run.get("work_us_per_record") is not None]
    return {k: r[k] for k in keys} | {"cpu_us_per_record": us,
                                      "work_us_per_record": statistics.median(work) if work else None}


def _write(args: argparse.Namespace, results: dict[str, Any]) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "naive.json").write_text(json.dumps(results, indent=2))
    return out


ROLES = ("consumer side Python", "consumer side librdkafka", "workers Python", "workers librdkafka", "broker")


def render(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    md = [f"# Against the naive peer, with outputs\n\nMachine: {m['cpu']}, {m['cores']} cores. Produced by "
          f"`./scripts/bench --naive`; {results['runs']} interleaved runs per case, records/s min / median / "
          "max, ratios of medians within this invocation only. Window: CPU µs per record of the consumer "
          "side's process and of the workers' from the first record to the last commit (start-up "
          "excluded). By role: CPU µs per record of each kind of thread (medians), start-up included: the "
          "consumer side is the plain loop, Pool's parent or the supervisor (the copies of the plain loop "
          "count as workers: each partition is dealt to one copy); its librdkafka threads fetch "
          "(and, but for ringmaster, produce); the workers' librdkafka threads are ringmaster's producers. "
          "Work: the CPU µs a record the work itself took, timed by each consumer's thread around each "
          "batch's work (medians): the window's CPU less this is what the consumer spends around the work. "
          "Others: the CPU the rest of the machine used during the runs, a share of all cores. Every "
          "checkout is byte-compiled before the runs (scripts/bench.py, precompile).\n"]
    revisions = results.get("revisions", {})
    if len(revisions) > 1:
        md.append("Checkouts, interleaved: " + ", ".join(f"{k} = {v}" for k, v in revisions.items()) + ".\n")
    for s in results["sets"]:
        rows = s["rows"]
        plain = next((r["median"] for r in rows if r["label"] == "plain loop"), None)
        pool = next((r["median"] for r in rows if r["label"].startswith("pool(")), None)
        md += [f"## {s['partitions']} partitions, ~{s['work_us']:.0f} µs of work a record\n",
               f"{s['records']:,} records; the work unit took {s['work_us']:.1f} µs at the start and "
               f"{s['work_us_after']:.1f} µs after.\n",
               "| consumer | records/s min / median / max | × plain | × Pool | others | window: consumer "
               "side | window: workers | work | " + " | ".join(ROLES) + " |",
               "|---|---|---|---|---|---|---|---|" + "---|" * len(ROLES)]
        for r in rows:
            x_plain = f"{r['median'] / plain:.2f}" if plain else "-"
            x_pool = f"{r['median'] / pool:.2f}" if pool and not r["label"].startswith("pool") else "-"
            cpu = " | ".join(f"{r['cpu_us_per_record'].get(role, 0.0):.1f}" for role in ROLES)
            rates = f"{r['min']:,.0f} / {r['median']:,.0f} / {r['max']:,.0f}"
            work = r.get("work_us_per_record")
            window = (f"{r['main_us_per_record']:.1f} | {r['worker_us_per_record']:.1f} | "
                      + ("-" if work is None else f"{work:.1f}"))
            md.append(f"| {r['label']} | {rates} | {x_plain} | {x_pool} | {r['others_share']:.0%} | "
                      f"{window} | {cpu} |")
        md.append("")
    return md
