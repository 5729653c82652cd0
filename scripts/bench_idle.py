"""What a daemon with nothing to do costs its host: `ringmaster run` on an empty topic against
the embedded broker, and, per kind of thread, how often each wakes and how much CPU it takes
over a quiet span once the group has settled (``/proc/<pid>/task/*``), for the supervisor, its
workers and the broker.

    .venv/bin/python scripts/bench_idle.py [--seconds 20] [--runs 3] [--against <checkout>]

``--against``: another checkout with its own ``.venv`` (an older version), run in turn with
this one in the same invocation, so that the figures compare.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

import psutil  # noqa: E402

from runtime.dev.tansu import DevBroker  # noqa: E402
from runtime.kafka.admin import ensure_topics  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
SWITCHES = r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)"  # a wait given up, or the CPU taken
Counts = dict[tuple[str, str], tuple[int, float]]  # (process, thread kind) -> (wakeups, CPU s)


def threads(pids: dict[int, str]) -> dict[tuple[int, str], tuple[str, str, int, float]]:
    """(pid, tid) -> (process, thread kind, context switches, CPU seconds)."""
    out = {}
    for pid, who in pids.items():
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                comm = (task / "comm").read_text().strip()
                status = (task / "status").read_text()
                stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            switches = sum(int(n) for n in re.findall(SWITCHES, status, re.M))
            kind = re.sub(r"\d+", "#", comm)  # rdk:broker1 and rdk:broker2 are one kind
            out[(pid, task.name)] = (who, kind, switches, (int(stat[11]) + int(stat[12])) / TICK)
    return out


def one_run(root: Path, broker: DevBroker, seconds: float, settle_s: float) -> tuple[Counts, float]:
    topic = f"idle-{uuid.uuid4().hex[:6]}"
    ensure_topics(broker.bootstrap, [topic], partitions=8)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "idle.toml"
        cfg.write_text(f"""[kafka]
bootstrap_servers = "{broker.bootstrap}"
group_id = "idle-{uuid.uuid4().hex[:6]}"
topics = ["{topic}"]
[workers]
plugin = "workers.fingerprint"
processes = 2
[supervisor]
log_level = "WARNING"
control_socket = "{tmp}/idle.sock"
""")
        env = {**os.environ, "PYTHONPATH": str(root)}
        with open(Path(tmp) / "log", "wb") as log:
            proc = subprocess.Popen([str(root / ".venv" / "bin" / "python"), "-m", "runtime.cli", "run", "-c",
                                     str(cfg), "--no-progress"], env=env, cwd=root, stdout=log, stderr=log)
            try:
                time.sleep(settle_s)  # the group joins and the workers start: not measured
                if proc.poll() is not None:
                    raise RuntimeError(f"ringmaster exited: {(Path(tmp) / 'log').read_text()[-2000:]}")
                pids = {proc.pid: "supervisor", broker.proc.pid: "broker"}
                pids |= {c.pid: "worker" for c in psutil.Process(proc.pid).children(recursive=True)}
                before, t0 = threads(pids), time.monotonic()
                time.sleep(seconds)
                after, span = threads(pids), time.monotonic() - t0
            finally:
                proc.terminate()
                proc.wait(60)
    counts: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for key, (who, kind, switches, cpu) in after.items():
        _, _, switches0, cpu0 = before.get(key, (who, kind, 0, 0.0))
        c = counts[(who, kind)]
        c[0] += switches - switches0
        c[1] += cpu - cpu0
    return {k: (int(v[0]), v[1]) for k, v in counts.items()}, span


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured quiet span of each run")
    ap.add_argument("--settle", type=float, default=12.0, help="seconds left to the start before measuring")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--against", help="another checkout with its own .venv, run in turn with this one")
    args = ap.parse_args()
    roots = [("this checkout", ROOT)]
    if args.against:
        roots.append((args.against, Path(args.against).resolve()))
    runs: dict[str, list[tuple[Counts, float]]] = {name: [] for name, _ in roots}
    with DevBroker() as broker:
        for _ in range(args.runs):
            for name, root in roots:
                runs[name].append(one_run(root, broker, args.seconds, args.settle))
    for name, results in runs.items():
        print(f"\n{name}: {args.runs} runs of {args.seconds:g} s; wakeups a second and % of a core, "
              "min / median / max")
        kinds = sorted({k for counts, _ in results for k in counts})
        for who in ("supervisor", "worker", "broker"):
            rows = [k for k in kinds if k[0] == who]
            for k in [*rows, (who, "all threads")]:
                wake = [sum(c[x][0] for x in (rows if k[1] == "all threads" else [k]) if x in c) / s
                        for c, s in results]
                cpu = [100 * sum(c[x][1] for x in (rows if k[1] == "all threads" else [k]) if x in c) / s
                       for c, s in results]
                print(f"  {who:10s} {k[1]:16s} wakeups/s {_mmm(wake, '.1f'):>22s}   CPU % {_mmm(cpu, '.2f')}")
    return 0


def _mmm(xs: list[float], fmt: str) -> str:
    return " / ".join(format(x, fmt) for x in (min(xs), statistics.median(xs), max(xs)))


if __name__ == "__main__":
    raise SystemExit(main())
