"""The status snapshot: a typed value that the status file, the progress display, the
benchmarks, ``ringmaster status``/``top`` and the metrics endpoint all read. Built by the
supervisor every ``status_interval_s``; never decides anything.

Runs in: supervisor (building, writing the file); any thread may read a published snapshot
(it is never mutated after it is built).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import logging
import os
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from runtime.errors import ConfigError

log = logging.getLogger("ringmaster.status")


@dataclass
class Totals:
    """Counters of the run. Written by the supervisor's result handling only."""

    records: int = 0
    outputs: int = 0
    dead_letters: int = 0
    discarded: int = 0
    batches: int = 0
    consumed: int = 0
    deferred: int = 0
    # output.guarantee = "exactly-once": batches committed in their transaction, and batches
    # whose transaction was not committed (deferred, blocked, or their worker died in it).
    transactions_committed: int = 0
    transactions_aborted: int = 0


class PauseReason(enum.StrEnum):
    """Why a partition does not fetch (PartitionStatus.pause_reasons, and the ``reason`` label of
    the paused-partition metrics). Holds are set by one of the supervisor's rooms for a reason
    of its own and stay until released (or until their time is up); FLOW and AHEAD are flow
    control's own backpressure decisions. Here, not in the supervisor: ops reads them too."""

    FLOW = "flow"  # backpressure: the host's backlog for it is over its share
    AHEAD = "uncommitted"  # key/unordered: max_uncommitted_records past the committed offset
    OPERATOR = "operator"  # `ringmaster pause` (runtime/ops/control.py)
    BACKOFF = "backoff"  # the plugin raised Backoff
    DELIVERY = "delivery"  # outputs or dead letters could not be delivered
    BLOCKED = "blocked"  # a record failed and there is no dead-letter topic
    SEEKING = "seeking"  # its start offset could not be read yet after a rebalance


@dataclass(frozen=True)
class PartitionStatus:
    tp: str
    topic: str
    partition: int
    worker: int | None  # partition ordering: the worker its batches are on now (None: none is out)
    paused: bool
    pause_reasons: list[str]
    holds: dict[str, str]  # reason -> detail
    blocked: str | None
    committed: int | None
    done_through: int | None
    high: int | None
    lag: int | None
    pending_batches: int
    records: int
    consumed: int
    outputs: int
    dead_letters: int
    hot_key: str | None = None
    oldest_unprocessed_s: float | None = None  # age of its oldest record fetched and not yet handled
    rate: float | None = None  # records/s over the last RecentRates.window_s (None: not known yet)


class ExitCause(enum.StrEnum):
    """Why a worker exited and was replaced (WorkerStatus.exits, and the ``cause`` label of
    ringmaster_worker_restarts_total). Judged by runtime/supervisor/workers/workforce.py."""

    CRASHED = "crashed"  # it died on its own
    KILLED = "killed"  # the supervisor killed it: deadline, heartbeat, revocation
    RECYCLED = "recycled"  # memory, open files or batch budget: it read a STOP frame
    EXHAUSTED = "exhausted"  # it ran out of descriptors or memory, and said so
    START_FAILURE = "start_failure"  # it never became ready


EXIT_CAUSES: tuple[ExitCause, ...] = tuple(ExitCause)  # every cause, in the order metrics list them


@dataclass(frozen=True)
class WorkerStatus:
    index: int
    pid: int | None
    alive: bool
    state: str
    cpu_s: float | None
    records: int
    in_flight: int  # batches in its ring (running or queued)
    ring_fill: float
    restarts: int
    rss: int | None
    heartbeat_age_s: float | None
    last_exit: str | None = None
    start_failure: str | None = None
    exits: dict[str, int] = field(default_factory=dict)  # exits that led to a restart, by cause
    queued_records: int = 0  # records in its ring
    lanes: int = 0  # partitions (key lanes) with batches in its ring
    us_per_record: float = 0.0  # learnt plugin time per record (the scheduler's estimate)
    busy_s: float = 0.0  # time its batches took (plugin and delivery), all incarnations
    plugin_version: str | None = None  # what its incarnation reported it runs
    generation: int = 0  # which reading of the config its plugin code comes from (1 at start, +1 a reload)
    retiring: bool = False  # leaving for good (a reload or a resize): takes no more batches


@dataclass(frozen=True)
class WindowCpu:
    supervisor: float
    workers: float


@dataclass(frozen=True)
class OperationStatus:
    """A reload or a resize of a running daemon (runtime/supervisor/control/rollout.py)."""

    kind: str  # "reload" or "scale"
    state: str  # "running", "succeeded" or "failed"
    requested_by: str  # "SIGHUP", "ringmaster reload", "SIGTTIN", ...
    started_ms: int  # wall clock
    finished_ms: int | None
    message: str
    from_version: str | None = None
    to_version: str | None = None
    processes_from: int = 0
    processes_to: int = 0


@dataclass(frozen=True)
class Stopped:
    """Why the daemon stopped (or is stopping): its exit code, the same line as its log and
    stderr, and when (wall-clock seconds, for people and other hosts' tools)."""

    code: int
    reason: str
    at: float = field(default_factory=time.time)


@functools.lru_cache(maxsize=4)
def _started_at(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


def process_started_at() -> float:
    """This process's start time (wall clock, as the kernel has it): with the pid it tells
    a reader of an old status file whether that daemon is still the one running. 0 when it
    cannot be read; a failure is not cached, so the next snapshot asks again."""
    try:
        return _started_at(os.getpid())
    except (psutil.Error, OSError):  # OSError: out of file descriptors (EMFILE), issue 17.4
        return 0.0


@dataclass(frozen=True)
class StatusSnapshot:
    pid: int
    group: str
    ordering: str
    elapsed_s: float
    window_s: float
    join_s: float
    supervisor_cpu_s: float
    window_cpu_s: WindowCpu
    supervisor_rss: int | None
    records: int
    rate: float
    outputs: int
    dead_letters: int
    discarded: int
    batches: int
    consumed: int
    deferred: int
    restarts: int
    paused: int
    lag: int
    partitions: list[PartitionStatus]
    workers: list[WorkerStatus]
    revocations: list[dict[str, Any]]
    committed: dict[str, int]
    dead_letters_waiting: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    rebalances: int = 0
    librdkafka: dict[str, float] = field(default_factory=dict)  # admin.librdkafka_stats_s
    loop_age_s: float = 0.0
    ready: bool = False
    operator_pauses: list[dict[str, Any]] = field(default_factory=list)
    stopped: Stopped | None = None
    started_at: float = field(default_factory=process_started_at)  # of the supervisor process (pid)
    recent_rate: float | None = None  # records/s over the last RecentRates.window_s
    plugin: str = ""
    plugin_version: str | None = None  # what the daemon runs (and restarts, and starts new workers with)
    workers_target: int = 0  # workers the pool aims at (workers.processes, or the last resize)
    workers_max: int = 0  # workers.max_processes
    reload: OperationStatus | None = None  # the last reload, or the one in progress
    scale: OperationStatus | None = None  # the last resize, or the one in progress
    operations: dict[str, int] = field(default_factory=dict)  # "reload succeeded": 2, "scale failed": 1, ...
    # Assigned by the group beyond supervisor.max_partitions: paused, never read, lag growing
    # (runtime/supervisor/partition/table.py). Each {"tp", "high" (watermark or None), "since_s"}.
    over_capacity: list[dict[str, Any]] = field(default_factory=list)
    # kafka.group_type = "share": what the broker did with the records acquired since the start
    # (acquired, accepted, released, rejected, lock_expiries: acknowledged after the lock ended
    # or refused), and what is held now (held, kept, waiting, unanswered); else None.
    share: dict[str, int] | None = None
    # Wall clock when the snapshot was taken: the end of window_s, so that the windows of
    # several daemons (run --members) can be laid on one time line.
    taken_at: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def one_line(self) -> str:
        """The snapshot in one log line (SIGUSR1)."""
        alive = sum(w.alive for w in self.workers)
        stopping = f"; stopping: {self.stopped.reason}" if self.stopped else ""
        over = f", {len(self.over_capacity)} over capacity (not read)" if self.over_capacity else ""
        return (f"{self.records:,} records ({self.rate:,.0f}/s), {self.outputs:,} outputs, "
                f"{self.dead_letters:,} dead letters, lag {self.lag:,}; {len(self.partitions)} partitions "
                f"({self.paused} paused{over}); {alive}/{len(self.workers)} workers alive, {self.restarts} "
                f"restarts; {'ready' if self.ready else 'starting'}{stopping}")


def final_snapshot(snap: StatusSnapshot, stopped: Stopped) -> StatusSnapshot:
    """The last snapshot of a run: not ready, stopped and why. Partitions paused only because
    the stop paused them (no reason of their own) are not reported as paused: a stop is not
    a pause, and a finished run must not read "paused 8/8"."""
    parts = [p if p.pause_reasons or not p.paused else replace(p, paused=False) for p in snap.partitions]
    return replace(snap, ready=False, stopped=stopped, partitions=parts, paused=sum(p.paused for p in parts))


class RecentRates:
    """Records per second over about the last ``window_s``, per partition and in total,
    from the counters of successive snapshots, so that a single snapshot (``ringmaster
    status``, the status file) carries current rates, not only the run's average.

    Runs in: supervisor, when it builds a snapshot (every ``status_interval_s``)."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._seen: deque[tuple[float, int, dict[str, int]]] = deque()  # (when, records, per partition)

    def apply(self, now: float, snap: StatusSnapshot) -> StatusSnapshot:
        per_tp = {p.tp: p.records for p in snap.partitions}
        self._seen.append((now, snap.records, per_tp))
        # Keep the newest observation at least window_s old as the base, and nothing older.
        while len(self._seen) > 2 and self._seen[1][0] <= now - self.window_s:
            self._seen.popleft()
        total = None
        base_t, base_records, _ = self._seen[0]
        if now > base_t:
            total = round(max(0, snap.records - base_records) / (now - base_t), 1)
        parts = []
        for p in snap.partitions:
            # The oldest observation of this partition (it may have been assigned since).
            base = next(((t, seen[p.tp]) for t, _, seen in self._seen if p.tp in seen and t < now), None)
            rate = None
            if base is not None:
                rate = round(max(0, p.records - base[1]) / (now - base[0]), 1)
            parts.append(replace(p, rate=rate))
        return replace(snap, partitions=parts, recent_rate=total)


class StatusFile:
    """Writes snapshots atomically (a private temporary file in the same directory, renamed
    over the file) so a reader never sees half a snapshot. The directory is created at
    start; a failure there is a config error, a failure later only a warning: the status
    file must never stop the daemon."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._warned_at = float("-inf")  # monotonic time starts near 0 on a freshly booted host
        if self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"supervisor.status_file: cannot create {str(self.path.parent)!r}: "
                                  f"{exc.strerror}") from None
            if not os.access(self.path.parent, os.W_OK):
                raise ConfigError(f"supervisor.status_file: {str(self.path.parent)!r} is not writable")

    def write(self, snapshot: StatusSnapshot) -> None:
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(snapshot.to_dict(), f)
                os.chmod(tmp, 0o644)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as exc:
            now = time.monotonic()
            if now - self._warned_at > 60:
                self._warned_at = now
                log.warning("cannot write the status file; carrying on",
                            extra={"path": str(self.path), "error": str(exc)})
