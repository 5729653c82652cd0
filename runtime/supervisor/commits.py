"""Commits: the one place offsets go to the group. Runs in: supervisor.

INVARIANT (1): only a tracker's committable offset is ever committed (offsets.py holds the
rule). Asynchronous and periodic while running; synchronous on revoke and shutdown. A
commit the broker refused (reported by the client's on_commit) is sent again even when
nothing new was done, or the group would lag behind what was done until the next record.

A synchronous commit sends every partition's committable offset, also one an asynchronous
commit already sent: that one may still be on its way, or refused without a word yet, and
the synchronous answer is the only one that says, per partition, that the broker has it
(``--until-caught-up`` judges the run by it: caught_up.py).

Under exactly-once (``transactional``) nothing is committed here: each batch's offset is
committed by its worker's transaction (runtime/worker/transactional.py). A commit from here
would race them: sent after one transaction's offset but landing after the next one's, it
would move the group's offset back, and the records between would be written again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runtime.supervisor.partitions import Partition, Partitions
from runtime.supervisor.seams import Consumer
from runtime.tp import TP


@dataclass(frozen=True, slots=True)
class SyncCommit:
    """The broker's answer for one partition of a synchronous commit (revocation, stop)."""

    offset: int | None  # the offset sent; None: nothing was done to commit
    refused: str | None  # why the broker (or the client) refused it
    epoch: int  # the partition's fence when it was sent: the answer is of that release only


class Committer:
    def __init__(self, consumer: Consumer, partitions: Partitions, interval_s: float,
                 clock: Callable[[], float], sync_timeout_s: float = 30.0,
                 transactional: bool = False) -> None:
        self.consumer = consumer
        self.transactional = transactional
        self.sync_timeout_s = sync_timeout_s  # a synchronous commit waits this long, at most
        self.partitions = partitions
        self.interval_s = interval_s
        self.clock = clock
        self.committed: dict[TP, int] = {}  # what this supervisor committed, for status
        self._sync: dict[TP, SyncCommit] = {}  # answers of synchronous commits, until taken
        self._last = clock()

    def commit_if_due(self) -> None:
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.commit(list(self.partitions.values()), asynchronous=True)

    def commit(self, parts: list[Partition], asynchronous: bool) -> None:
        if self.transactional:
            return
        for tp, refused_offset in self.consumer.take_refused_commits().items():
            held = self.partitions.get(tp)
            if held is not None and held.tracker.committed == refused_offset:
                held.tracker.mark_committed(None)  # send it again
        # Asynchronous: what moved since the last commit. Synchronous: everything there is.
        offsets: dict[TP, int] = {}
        for p in parts:
            committable = p.tracker.committable
            if committable is not None and (not asynchronous or p.tracker.needs_commit()):
                offsets[p.tp] = committable
        result = self.consumer.commit(offsets, asynchronous, self.sync_timeout_s) if offsets else None
        for p in parts:
            offset = offsets.get(p.tp)
            refused = None
            if offset is not None and result is not None:
                refused = result.refused.get(p.tp) or (None if result.sent else "not sent")
                if refused is None:
                    p.tracker.mark_committed(offset)
                    self.committed[p.tp] = offset
            if not asynchronous:
                self._sync[p.tp] = SyncCommit(offset, refused, p.fence.epoch)

    def take_sync_answers(self) -> dict[TP, SyncCommit]:
        """The answers of the synchronous commits since the last call, per partition."""
        answers, self._sync = self._sync, {}
        return answers
