"""What a chaos run must show, as pure functions of what it recorded (test_chaos.py records,
tests/unit/test_chaos_judge.py checks the judge itself): the faults it was to inject were
injected, duplicates stay within what the faults can explain, and nothing of a supervisor
that stopped by itself, or that a later start should have reclaimed, is left in shared
memory.

Duplicates: a record is done twice only if it was handled (its output or dead letter
written) and not committed when a fault struck, or was in a batch whose outputs were being
delivered. So each fault's share is measured, not assumed: the records handled above the
offsets committed right after it (up to when it was over, plus, for a killed supervisor, the
second its orphaned workers take to notice), and a batch per worker for deliveries under way.
In ``key`` and ``unordered`` ordering the run-ahead bound caps the same thing per partition
(max_uncommitted_records, plus a cut and a fetch); a run with more duplicates than that
redelivered what it had no reason to."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

REQUIRED = ("worker_sigkill", "supervisor_sigkill", "supervisor_join", "supervisor_leave")
NOTICE_S = 1.0  # a killed supervisor's workers exit within the guard's half second; slack for load


@dataclass(frozen=True)
class Fault:
    kind: str  # one of REQUIRED
    committed: Mapping[int, int]  # the group's offsets read right after it (before any restart)
    over_at: float  # wall-clock time it was over (the kill sent, the member joined or left)
    grace_s: float = 0.0  # how long after over_at its processes may still write (orphaned workers)


@dataclass
class Run:
    mode: str
    partitions: int
    workers: int
    batch_max_records: int
    max_uncommitted_records: int
    faults: list[Fault]
    duplicates: int
    handled: Mapping[tuple[int, int], float]  # (partition, offset) -> when first handled
    leaked_segments: list[str] = field(default_factory=list)  # of supervisors that exited by themselves
    unreclaimed_segments: list[str] = field(default_factory=list)  # of killed ones, after the next start
    killed_segments: int = 0  # segments the killed supervisors left for the next start


def counts(run: Run) -> Counter[str]:
    return Counter(f.kind for f in run.faults)


def in_flight(fault: Fault, handled: Mapping[tuple[int, int], float]) -> int:
    """Records handled, and not committed, by the time the fault was over (a worker's kill
    concerns its batch only: the allowance covers it). Every partition is counted, also those
    the fault did not touch: a bound that errs, errs large."""
    if fault.kind == "worker_sigkill":
        return 0
    until = fault.over_at + fault.grace_s
    return sum(1 for (p, o), t in handled.items() if o >= max(fault.committed.get(p, 0), 0) and t <= until)


def allowance(fault: Fault, workers: int, batch_max_records: int) -> int:
    """Batches whose outputs may have been under way: the killed worker's, the killed
    supervisor's workers', one for a hand-over."""
    return batch_max_records * (workers if fault.kind == "supervisor_sigkill" else 1)


def allowed_duplicates(run: Run) -> int:
    bound = sum(in_flight(f, run.handled) + allowance(f, run.workers, run.batch_max_records)
                for f in run.faults)
    if run.mode != "partition":
        handovers = 1 + sum(1 for f in run.faults if f.kind != "worker_sigkill")
        per_partition = run.max_uncommitted_records + 2 * run.batch_max_records
        bound = min(bound, handovers * run.partitions * per_partition)
    return bound


def problems(run: Run) -> list[str]:
    """Why the run fails its guarantees (empty: it passes)."""
    out = []
    seen = counts(run)
    missing = [k for k in REQUIRED if not seen[k]]
    if missing:
        out.append(f"faults not injected: {missing} (injected {dict(seen)}): "
                   "the run tested less than it says")
    allowed = allowed_duplicates(run)
    if run.duplicates > allowed:
        out.append(f"{run.duplicates} duplicates, more than the {allowed} its faults explain")
    if run.leaked_segments:
        out.append(f"shared memory left by supervisors that stopped: {run.leaked_segments}")
    if seen["supervisor_sigkill"] and not run.killed_segments:
        out.append("the killed supervisors left no segment behind: reclaiming was not tested")
    if run.unreclaimed_segments:
        out.append("segments of killed supervisors not reclaimed by the next start: "
                   f"{run.unreclaimed_segments}")
    return out
