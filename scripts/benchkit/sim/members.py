"""`./scripts/bench --simulate-members`: members per host past the light-work ceiling, on a long
run (issue 41, point 5).

A host of ``--simulate-cores`` cores (16 by default) runs M members of one group (``ringmaster
run --members M``): each member's supervisor takes a core, and the rest are split between the
members' workers, as members.py splits the budget; the topic's partitions are dealt out
evenly. Members share nothing but the host (the simulator does not model the broker, the
client's threads or the memory bus), so each member is its own simulated run over its share of
the records, and the host's rate is the sum of the members' (each run's records ÷ its time;
all start together, the last to finish sets the span). The runs are long (a few simulated
seconds), so start-up and the last batches weigh little: what is measured is the steady rate
(a drain of 600,000 records in under a second on 15 members measured mostly the group's
joins, scaling-16-cores.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchkit.sim.cases import Case, run_pool, run_ringmaster
from runtime.supervisor.daemon.members import split


def host_rate(cores: int, members: int, partitions: int, records: int, work_us: float, sup_us: float,
              ordering: str) -> dict[str, Any]:
    """The host's rate with ``members`` members: the cores less one a supervisor split between
    them as ``run --members`` splits a budget (runtime/supervisor/daemon/members.py, ``split``), the
    partitions dealt out as evenly as an assignor does, each member's records its partitions'
    share; the last member to finish sets the span."""
    workers = split(cores - members, members)
    parts = split(partitions, members)
    runs: dict[tuple[int, int], Any] = {}
    spans, busy, sup = [], [], []
    for w, p in zip(workers, parts, strict=True):
        if (w, p) not in runs:
            runs[(w, p)] = run_ringmaster(Case(f"{members} members", workers=w, partitions=p,
                                               records=records * p // partitions, work_us=work_us,
                                               sup_us=sup_us, ordering=ordering))
        out = runs[(w, p)]
        spans.append(out.elapsed_s)
        busy += out.busy
        sup.append(out.supervisor_busy)
    return {"members": members, "workers": workers, "partitions": parts,
            "records_per_s": records / max(spans),
            "supervisor_busy": sum(sup) / len(sup), "worker_busy": sum(busy) / len(busy)}


def simulate_members(args: argparse.Namespace, console: Any) -> int:
    cores = args.simulate_cores
    rows = []
    for work_us in (2.0, 5.0, 10.0, 20.0):
        records = int(args.simulate_member_seconds * cores * 1e6 / (work_us + 2.0))
        pool = run_pool(Case("pool", workers=cores - 1, partitions=32, records=records, work_us=work_us,
                             sup_us=2.0))
        pool_rate = records / pool.elapsed_s
        for m in (1, 2, 3, 4, 6, 8):
            if cores - m < m:
                continue
            r = host_rate(cores, m, 32, records, work_us, 2.0, args.simulate_members_ordering)
            r |= {"work_us": work_us, "records": records, "pool_rate": pool_rate}
            rows.append(r)
            console.print(f"  {work_us:g} µs, {m} member(s), workers {'+'.join(map(str, r['workers']))}: "
                          f"{r['records_per_s']:,.0f} records/s ({r['records_per_s'] / pool_rate:.2f}× Pool("
                          f"{cores - 1})), supervisors {r['supervisor_busy']:.0%} busy, "
                          f"workers {r['worker_busy']:.0%}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "simulation-members.json").write_text(json.dumps(rows, indent=2))
    return 0
