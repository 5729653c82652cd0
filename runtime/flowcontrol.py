"""The flow-control room: backpressure decisions, and every pause/resume sent to the client.
Runs in: supervisor.

Writes ``flow_paused``/``ahead`` (its own decisions) and ``paused`` (what the client was
last told) of each PartitionFlow; reads the holds other rooms set. A partition fetches when
nothing holds it and its worker(s) have room:

* ``partition`` ordering: the backlog of the partition's worker;
* ``key`` ordering: the fullest worker's backlog (any key may go to any worker), and the
  records run ahead of the committed offset (``max_uncommitted_records``);
* ``unordered``: the backlog of all rings together, and the same bound.

Pause state belongs to the runtime, not to librdkafka (invariant 4): desired state is
re-applied every second, and a partition that should fetch but has shown no activity for a
second is resumed again (librdkafka#5591, the pause-assign-resume race), while holds
(operator, back-off, delivery, blocked) are never resumed by this step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from runtime.config import Settings
from runtime.flow import TP, PartitionFlow, wants_flow_pause
from runtime.intake import Intake
from runtime.kafka import GroupConsumer

log = logging.getLogger("ringmaster.flowcontrol")

_RECONCILE_S = 1.0  # invariant 4: a runnable partition is fetching again within this


class FlowControl:
    def __init__(self, settings: Settings, consumer: GroupConsumer, flows: dict[TP, PartitionFlow],
                 intake: Intake, clock: Callable[[], float]) -> None:
        self.w = settings.workers
        self.consumer = consumer
        self.flows = flows
        self.intake = intake
        self.clock = clock
        self._last_reconcile = 0.0

    def decide(self, flows: list[PartitionFlow] | None = None) -> None:
        """Backpressure decisions for these flows (all by default)."""
        fills = self.intake.backlog_fills()
        shared = self.intake.shared_fill(fills) if self.w.ordering == "unordered" else 0.0
        for flow in self.flows.values() if flows is None else flows:
            if self.w.ordering == "partition":
                fill = fills[flow.owner]
            elif self.w.ordering == "key":
                fill = max(fills)
            else:
                fill = shared
            flow.flow_paused = wants_flow_pause(flow.flow_paused, fill, self.w.pause_above,
                                                self.w.resume_below)
            if self.w.ordering != "partition":
                # Bounded run-ahead: a slow lane lets the others go on only this far past the
                # committed offset, then the partition waits (memory, and duplicates after a
                # rebalance). Half the bound to resume: hysteresis.
                ahead = flow.tracker.uncommitted_records + len(flow.open_msgs)
                limit = self.w.max_uncommitted_records
                flow.ahead = ahead > limit // 2 if flow.ahead else ahead >= limit

    def reconcile(self) -> None:
        """Expire timed holds, decide, and apply pause/resume; repair what the client lost."""
        now = self.clock()
        for flow in self.flows.values():
            for hold in flow.expire_holds(now):
                log.info("hold ended; resuming", extra={"tp": flow.label, "reason": hold.reason})
        self.decide()
        pause: set[TP] = set()
        resume: set[TP] = set()
        for flow in self.flows.values():
            want = flow.wants_pause()
            if want != flow.paused:
                flow.paused = want
                (pause if want else resume).add(flow.tp)
                if not want:
                    flow.last_resume = flow.last_activity = now
        if now - self._last_reconcile >= _RECONCILE_S:
            self._last_reconcile = now
            for flow in self.flows.values():
                if flow.paused:
                    pause.add(flow.tp)
                elif (flow.eof_at is None and flow.tp not in resume
                      and now - flow.last_activity >= _RECONCILE_S
                      and now - flow.last_resume >= _RECONCILE_S):
                    flow.last_resume = now
                    resume.add(flow.tp)
        self.consumer.pause(sorted(pause))
        self.consumer.resume(sorted(resume))
