"""Operator pauses applied to this member's partitions. Runs in: supervisor.

The group's pause state is read from its control topic (runtime/ops/control.py). A partition
an operator pauses is rewound like any held partition (``Partition.rewind``): the batch in
progress finishes and commits, frames still in rings are skipped and read again after the
resume — a pause means "stop now", not "after the minutes of work in the rings" (flow
control pauses it in the client at once: the loop asks it to when ``apply`` changed
anything). A partition assigned while a pause covers it is held before it can fetch anything.
Lifting a pause only releases the hold: flow control resumes it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from runtime.ops.control import OperatorPauses
from runtime.supervisor.partition.partition import Partition, PauseReason
from runtime.tp import TP

log = logging.getLogger("ringmaster.operator")


class OperatorHolds:
    def __init__(self, pauses: OperatorPauses | None, partitions: Mapping[TP, Partition]) -> None:
        self.pauses = pauses
        self.partitions = partitions

    def load(self) -> None:
        """INVARIANT: a new member knows the group's operator pauses before it can be
        assigned anything, so it never processes a batch of a paused partition."""
        if self.pauses is not None:
            self.pauses.load()

    def apply(self) -> bool:
        """Follow the control topic; hold or release partitions when the state changed. True
        if it did (the partitions it holds must stop fetching now)."""
        if self.pauses is None or not self.pauses.poll():
            return False  # nothing new: holds already match the state
        for p in list(self.partitions.values()):
            pause = self.pauses.pause_for(p.tp)
            held = PauseReason.OPERATOR in p.pause.holds
            if pause is not None and not held:
                p.rewind(PauseReason.OPERATOR, pause.describe())
            elif pause is not None:
                p.hold(PauseReason.OPERATOR, pause.describe())  # a new reason or end time
            elif held and p.release(PauseReason.OPERATOR):
                log.info("operator pause lifted", extra={"tp": p.label})
        return True

    def hold_new(self, parts: list[Partition]) -> None:
        """At the loop's rebalance step: newly held partitions that a pause covers."""
        if self.pauses is None:
            return
        for p in parts:
            pause = self.pauses.pause_for(p.tp)
            if pause is not None:
                p.hold(PauseReason.OPERATOR, pause.describe())

    def snapshot(self) -> list[dict[str, object]]:
        """The operator pauses in force, as status lists them."""
        return self.pauses.describe_all() if self.pauses is not None else []

    def close(self) -> None:
        if self.pauses is not None:
            self.pauses.close()
