"""The status snapshot: a typed value that the status file, the progress display, the
benchmarks, ``ringmaster status``/``top`` and the metrics endpoint all read. Built by the
supervisor every ``status_interval_s``; never decides anything.

Runs in: supervisor (building, writing the file); any thread may read a published snapshot
(it is never mutated after it is built).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class PartitionStatus:
    tp: str
    topic: str
    partition: int
    worker: int  # owner: the worker of partition ordering (null keys in key ordering)
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


@dataclass(frozen=True)
class WorkerStatus:
    index: int
    pid: int | None
    alive: bool
    state: str
    cpu_s: float | None
    records: int
    in_flight: int
    ring_fill: float
    restarts: int
    rss: int | None
    heartbeat_age_s: float | None
    last_exit: str | None = None
    start_failure: str | None = None
    exits: dict[str, int] = field(default_factory=dict)  # exits that led to a restart, by cause


@dataclass(frozen=True)
class WindowCpu:
    supervisor: float
    workers: float


@dataclass(frozen=True)
class Stopped:
    code: int
    reason: str


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
    rebalances: int = 0
    librdkafka: dict[str, float] = field(default_factory=dict)  # admin.librdkafka_stats_s
    loop_age_s: float = 0.0
    ready: bool = False
    operator_pauses: list[dict[str, Any]] = field(default_factory=list)
    stopped: Stopped | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
