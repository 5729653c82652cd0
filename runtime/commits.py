"""Commits: the one place offsets go to the group. Runs in: supervisor.

INVARIANT (1): only a tracker's committable offset is ever committed (offsets.py holds the
rule). Asynchronous and periodic while running; synchronous on revoke and shutdown. A
commit the broker refused (reported by the client's on_commit) is sent again even when
nothing new was done, or the group would lag behind what was done until the next record.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.flow import TP, PartitionFlow
from runtime.kafka import GroupConsumer


class Committer:
    def __init__(self, consumer: GroupConsumer, flows: dict[TP, PartitionFlow], interval_s: float,
                 clock: Callable[[], float]) -> None:
        self.consumer = consumer
        self.flows = flows
        self.interval_s = interval_s
        self.clock = clock
        self.committed: dict[TP, int] = {}  # what this supervisor committed, for status
        self._last = clock()

    def commit_if_due(self) -> None:
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.commit(list(self.flows.values()), asynchronous=True)

    def commit(self, flows: list[PartitionFlow], asynchronous: bool) -> None:
        for tp, offset in self.consumer.take_refused_commits().items():
            flow = self.flows.get(tp)
            if flow is not None and flow.tracker.committed == offset:
                flow.tracker.mark_committed(None)  # send it again
        offsets = {f.tp: f.tracker.committable for f in flows if f.tracker.needs_commit()}
        if not offsets:
            return
        if self.consumer.commit(offsets, asynchronous):  # type: ignore[arg-type]
            for f in flows:
                if f.tp in offsets:
                    f.tracker.mark_committed(offsets[f.tp])
                    self.committed[f.tp] = offsets[f.tp]  # type: ignore[assignment]
