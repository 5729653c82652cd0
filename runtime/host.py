"""What this host (or container) lets the daemon use: the CPUs that decide the default worker
count. ``os.cpu_count()`` counts the machine's CPUs, not what a container or ``taskset``
gives us: one worker per counted CPU under a quota of 2 would be throttled, all of them, in
turn. The budget is the smallest of the affinity mask, the cgroup CPU quota (v2 ``cpu.max``,
v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``; every ancestor's limit applies), rounded
down (a fraction of a CPU would be throttled too), and at least 1.

Runs in: the supervisor and the CLI (the config's default), never in a hot path.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

PROC_SELF_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuBudget:
    count: int  # the default workers.processes
    why: str  # what bounds it, for the start-up line and `ringmaster check`


def cpu_budget(proc_self_cgroup: Path = PROC_SELF_CGROUP, cgroup_root: Path = CGROUP_ROOT,
               affinity: set[int] | None = None, cpu_count: int | None = None) -> CpuBudget:
    """The CPUs this process may use (arguments: what tests put in place of the host's)."""
    if affinity is None and hasattr(os, "sched_getaffinity"):
        affinity = os.sched_getaffinity(0)
    total = cpu_count if cpu_count is not None else (os.cpu_count() or 1)
    budget = CpuBudget(max(1, total), f"os.cpu_count() = {total}")
    if affinity is not None and 0 < len(affinity) < budget.count:
        budget = CpuBudget(len(affinity), f"the CPU affinity mask ({len(affinity)} of {total} CPUs)")
    quota = cgroup_cpu_quota(proc_self_cgroup, cgroup_root)
    if quota is not None and max(1, math.floor(quota)) < budget.count:
        budget = CpuBudget(max(1, math.floor(quota)), f"the cgroup CPU quota ({quota:g} CPUs)")
    return budget


def cgroup_cpu_quota(proc_self_cgroup: Path = PROC_SELF_CGROUP,
                     cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The tightest CPU quota on this process's cgroup and its ancestors, in CPUs; None when
    there is none or it cannot be read (then the other bounds decide)."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "" and path:  # v2: "0::/path"
            quotas += _v2_quotas(cgroup_root, path)
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            quotas += _v1_quotas(cgroup_root, controllers, path)
    return min(quotas) if quotas else None


def _ancestors(base: Path, path: str) -> list[Path]:
    """``base``/``path`` and each directory above it up to ``base``. A container with its own
    cgroup namespace sees its cgroup as "/", so this is then ``base`` alone."""
    parts = [p for p in path.split("/") if p and p != ".."]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _v2_quotas(root: Path, path: str) -> list[float]:
    out = []
    for directory in _ancestors(root, path):
        try:
            quota, period = (directory / "cpu.max").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        if quota != "max" and _positive(quota) and _positive(period):
            out.append(int(quota) / int(period))
    return out


def _v1_quotas(root: Path, controllers: str, path: str) -> list[float]:
    out = []
    # The cpu controller's mount is named for its controllers ("cpu,cpuacct"), often with
    # "cpu" as a link to it; inside a container the path in /proc/self/cgroup may be the
    # host's while the mount shows the container's own group, so the mount itself counts too.
    for mount in dict.fromkeys((root / controllers, root / "cpu")):
        for directory in _ancestors(mount, path):
            try:
                quota = (directory / "cpu.cfs_quota_us").read_text().strip()
                period = (directory / "cpu.cfs_period_us").read_text().strip()
            except OSError:
                continue
            if _positive(quota) and _positive(period):  # -1: no quota
                out.append(int(quota) / int(period))
    return out


def _positive(text: str) -> bool:
    return text.isdigit() and int(text) > 0
