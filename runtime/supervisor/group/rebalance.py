"""The rebalance story: what happens when the group gives this member partitions, takes them
back, or says they are lost. The loop calls ``consume()`` at a step of its own; librdkafka
calls this class's callbacks from inside it, on the supervisor's thread.

**Everything that runs inside a callback is here**, and only what librdkafka requires there:

    on_assign(tps)   recorded (``Assigned``): the loop applies it at its rebalance step, once
                     consume() has returned (new partitions, operator holds, flow control's
                     pauses, each partition's start: runtime/supervisor/daemon/loop.py)
    on_revoke(tps)   released at once (``release``), then recorded (``Released``): a revocation
                     is complete when its callback returns, so the fence, the wait for the
                     batches in progress and the commit happen inside it, or another member
                     would start on partitions whose batches are still running here
    on_lost(tps)     released at once as for a revocation, but nothing is committed (the
                     partitions are someone else's already: it would be refused)

A release is the data path's narrow contract (runtime/supervisor/datapath/release.py: fence,
join, terminate, forget, as arroyo's strategy's close and join) around the commit. What it
leaves (the broker's answers, the slots it freed) is recorded for the loop's step: the judge
of a batch run, the dead-letter desk and the partitions held over capacity hear of it there.

**Revocation is bounded and fenced** (invariant 5): fence (a new epoch in shared memory:
workers skip every frame of the old one), wait only for the batches in progress, commit what
is done, forget; a worker that will not let go within ``revoke_timeout_s`` is killed. Its
time does not grow with how full the rings are.

**A loss is fenced, not waited for.** Lost partitions are someone else's already (the
session timed out: a coordinator frozen or away, the member cut off from it), nothing of
them can be committed, and a batch still in progress is a zombie whatever this member does.
Waiting for it only held the loop, and on a frozen node the batches in progress are stuck on
that same node (outputs waiting for a frozen follower's acknowledgement, a transaction for its
coordinator): after ``revoke_timeout_s`` their workers were killed, and the new ones sat in
start-up behind the same node after it woke (issue 40). So a loss fences and forgets at once;
a batch in progress finishes on its own, its result counted for nothing. Under at-least-once
its outputs are duplicates, which may land after those of the partition's next owner (this
member again, if it gets the partition back); under exactly-once its transaction carries the
generation it started in and is refused (runtime/worker/transactional.py). A worker stuck
past its own bounds is still ended by the workforce (``batch_timeout_s``, the delivery wait).

Runs in: rebalance callbacks (and the stop, which is a release of everything).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.supervisor.group.commits import Committer, SyncCommit
from runtime.supervisor.partition.partition import Partition
from runtime.tp import TP

log = logging.getLogger("ringmaster.rebalance")


class Releasing(Protocol):
    """The data path, as a release drives it (runtime/supervisor/datapath/release.py)."""

    def fence(self, tps: list[TP], /) -> list[Partition]: ...
    def join(self, parts: list[Partition], deadline: float, /) -> list[int]: ...
    def terminate(self, workers: list[int], why: str, /) -> None: ...
    def forget(self, parts: list[Partition], /) -> None: ...


@dataclass(frozen=True)
class Assigned:
    """The group assigned these partitions (applied at the loop's rebalance step)."""

    tps: tuple[TP, ...]


@dataclass(frozen=True)
class Released:
    """A release done (in a callback or the stop): ``tps`` as the group named them, ``parts``
    those that were held (fenced, waited for, committed, forgotten), ``answers`` the broker's
    answer per partition (none: lost)."""

    tps: tuple[TP, ...]
    parts: tuple[Partition, ...] = ()
    answers: dict[TP, SyncCommit] = field(default_factory=dict)


Change = Assigned | Released


@dataclass(frozen=True)
class RebalanceView:
    """What the rebalances report (runtime/supervisor/daemon/report.py)."""

    revocations: list[dict[str, Any]]
    rebalances: int


class Rebalance:
    def __init__(self, revoke_timeout_s: float, datapath: Releasing, commits: Committer,
                 clock: Callable[[], float]) -> None:
        self.revoke_timeout_s = revoke_timeout_s
        self.datapath = datapath
        self.commits = commits
        self.clock = clock
        self.revocations: list[dict[str, Any]] = []  # the last 100, for status and tests
        self._timings: list[float] = []  # seconds each release took, not yet taken (take_timings)
        self._changes: list[Change] = []  # recorded in callbacks, until the loop takes them
        self.rebalances = 0  # callbacks: assignments, revocations, losses

    def snapshot(self) -> RebalanceView:
        return RebalanceView(list(self.revocations), self.rebalances)

    # ------------------------------------------------------------------ inside the callbacks
    def on_assign(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback, after the client assigned tps."""
        self.rebalances += 1
        self.on_announce(tps)

    def on_announce(self, tps: list[TP]) -> None:
        """Runs in: a share group consumer's consume(), when a partition's first record comes
        (runtime/kafka/share_consumer.py): assigned as by the group, but no rebalance (nothing
        is ever revoked in a share group), so not counted as one."""
        self._changes.append(Assigned(tuple(tps)))

    def on_revoke(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. Fence, wait only for batches in progress, commit."""
        self.rebalances += 1
        self.release(tps, commit=True)

    def on_lost(self, tps: list[TP]) -> None:
        """Runs in: rebalance callback. The partitions are already someone else's: fence and
        forget them, commit nothing (it would be refused), wait for no batch in progress (see
        the module's docstring)."""
        self.rebalances += 1
        self.release(tps, commit=False)

    def release(self, tps: list[TP], commit: bool, why: str = "") -> list[Partition]:
        """Runs in: rebalance callback, or the stop. The partitions released (those held).
        ``why``: what the log line says (by default, revoked or lost)."""
        started = self.clock()
        self._unassigned(tps)
        parts = self.datapath.fence(tps)
        if not parts:
            self._changes.append(Released(tuple(tps)))
            return []
        if commit:  # a loss waits for nothing: its batches in progress are zombies either way
            still_busy = self.datapath.join(parts, started + self.revoke_timeout_s)
            self.datapath.terminate(still_busy, f"still busy on a revoked partition after "
                                                f"supervisor.revoke_timeout_s ({self.revoke_timeout_s:g} s)")
        # What invariant 5 bounds: fencing and the batch in progress. The commit that
        # follows is a broker round trip (slower while the group is rebalancing).
        fenced_ms = round((self.clock() - started) * 1000, 1)
        answers = self.commits.commit(parts, asynchronous=False) if commit else {}
        self.datapath.forget(parts)
        took_ms = round((self.clock() - started) * 1000, 1)
        self._timings.append(took_ms / 1000)
        self.revocations = [*self.revocations[-99:], {
            "ms": took_ms, "fenced_ms": fenced_ms, "end_ns": time.monotonic_ns(), "committed": commit,
            "partitions": [p.label for p in parts]}]
        log.info(why or ("partitions revoked" if commit else "partitions lost"), extra={
            "partitions": ",".join(p.label for p in parts), "took_ms": took_ms})
        self._changes.append(Released(tuple(tps), tuple(parts), answers))
        return parts

    def _unassigned(self, tps: list[TP]) -> None:
        """Partitions assigned and let go of within one consume(): their assignment was never
        applied, so there is nothing of them to release."""
        gone = set(tps)
        for i, change in enumerate(self._changes):
            if isinstance(change, Assigned) and gone & set(change.tps):
                self._changes[i] = Assigned(tuple(tp for tp in change.tps if tp not in gone))

    # ------------------------------------------------------------------ the loop's step
    def take(self) -> list[Change]:
        """What the callbacks (or the stop) recorded since the last call, in order: the loop
        applies it at its rebalance step."""
        changes, self._changes = self._changes, []
        return changes

    def take_timings(self) -> list[float]:
        """Seconds each release since the last call took (the loop hands them to the metrics'
        histogram; this room knows no metrics)."""
        timings, self._timings = self._timings, []
        return timings
