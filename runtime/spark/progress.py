"""`ringmaster spark run`'s progress as the same status snapshot and metric names as the
local daemon, where they apply: records processed, rows/s, committed offsets, lag per
partition (the source's latest offset minus what the last micro-batch ended at). Spark's own
UI stays the place for stages and tasks.

Runs in: the driver; ``update`` on Spark's listener thread, the rest on the admin server's.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from runtime.config import Settings
from runtime.ops.admin_server import Health
from runtime.ops.status import PartitionStatus, StatusSnapshot, WindowCpu


def _offsets(value: Any) -> dict[str, dict[str, int]]:
    """A source's offsets in a progress report: JSON text, a dict, or nothing yet ("", "null")."""
    if not value:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return dict(value) if isinstance(value, dict) else {}


class SparkStatus:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._records = 0
        self._rate = 0.0
        self._end: dict[str, dict[str, int]] = {}
        self._latest: dict[str, dict[str, int]] = {}
        self._seen: set[Any] = set()
        self.query_active = False
        self.failure: str | None = None
        self.snapshot: StatusSnapshot | None = None

    def update(self, progress: Any) -> None:
        """One micro-batch's progress (the listener's object, or query.lastProgress as a dict)."""
        get = progress.get if isinstance(progress, dict) else lambda k, d=None: getattr(progress, k, d)
        with self._lock:
            batch = get("batchId")
            if batch in self._seen:
                return  # the listener and the final lastProgress may both report the last batch
            self._seen.add(batch)
            self._records += int(get("numInputRows", 0) or 0)
            self._rate = float(get("processedRowsPerSecond", 0) or 0)
            for src in get("sources", []) or []:
                sget = src.get if isinstance(src, dict) else lambda k, d=None, s=src: getattr(s, k, d)
                self._end.update(_offsets(sget("endOffset")))
                self._latest.update(_offsets(sget("latestOffset")))
            self.snapshot = self._build()

    def _build(self) -> StatusSnapshot:
        parts = []
        for topic, ps in sorted(self._end.items()):
            for p, end in sorted(ps.items(), key=lambda x: int(x[0])):
                latest = self._latest.get(topic, {}).get(p)
                lag = None if latest is None else max(0, int(latest) - int(end))
                parts.append(PartitionStatus(
                    tp=f"{topic}[{p}]", topic=topic, partition=int(p), worker=-1, paused=False,
                    pause_reasons=[], holds={}, blocked=None, committed=int(end), done_through=int(end),
                    high=None if latest is None else int(latest), lag=lag, pending_batches=0, records=0,
                    consumed=0, outputs=0, dead_letters=0))
        elapsed = time.monotonic() - self._started
        return StatusSnapshot(
            pid=os.getpid(), group=self.settings.kafka.group_id, ordering=self.settings.workers.ordering,
            elapsed_s=round(elapsed, 3), window_s=round(elapsed, 3), join_s=0.0, supervisor_cpu_s=0.0,
            window_cpu_s=WindowCpu(0.0, 0.0), supervisor_rss=None, records=self._records,
            rate=round(self._rate, 1), outputs=0, dead_letters=0, discarded=0, batches=len(self._seen),
            consumed=self._records, deferred=0, restarts=0, paused=0,
            lag=sum(p.lag or 0 for p in parts), partitions=parts, workers=[], revocations=[],
            committed={p.tp: p.committed for p in parts if p.committed is not None},
            ready=self.query_active)

    def health(self) -> Health:
        if self.failure is not None:
            return Health(False, [f"the Spark query failed: {self.failure}"])
        return Health(True, [])

    def ready(self) -> bool:
        return self.query_active
