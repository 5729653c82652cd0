"""Commits: the one place offsets go to the group. Runs in: supervisor.

INVARIANT (1): only a tracker's committable offset is ever committed (offsets.py holds the
rule). Asynchronous and periodic while running; synchronous on revoke and shutdown. A
commit the broker refused (reported by the client's on_commit) is sent again even when
nothing new was done, or the group would lag behind what was done until the next record.

A synchronous commit sends every partition's committable offset, also one an asynchronous
commit already sent: that one may still be on its way, or refused without a word yet, and
the synchronous answer is the only one that says, per partition, that the broker has it
(``--until-caught-up`` judges the run by it: caught_up.py). ``commit`` returns those answers.

Under exactly-once (``transactional``) nothing is committed here: each batch's offset is
committed by its worker's transaction (runtime/worker/transactional.py). A commit from here
would race them: sent after one transaction's offset but landing after the next one's, it
would move the group's offset back, and the records between would be written again. A
synchronous commit answers "nothing sent" for each partition, and ``--until-caught-up``
judges the partitions by the group's committed offsets instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from runtime.supervisor.partition.acknowledgements import AckTracker
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.seams.consumer import Acknowledging, Consumer
from runtime.tp import TP


@dataclass(frozen=True, slots=True)
class SyncCommit:
    """The broker's answer for one partition of a synchronous commit (revocation, stop)."""

    offset: int | None  # the offset sent; None: nothing was done to commit
    refused: str | None  # why the broker (or the client) refused it
    epoch: int  # the partition's fence when it was sent: the answer is of that release only


@dataclass(frozen=True, slots=True)
class CommitsView:
    """What the commits report (runtime/supervisor/daemon/report.py)."""

    committed: dict[TP, int]  # what this supervisor committed, per partition
    share: dict[str, int] | None  # a share group's acknowledgement counts


class Committer:
    def __init__(self, consumer: Consumer, partitions: Mapping[TP, Partition], interval_s: float,
                 clock: Callable[[], float], sync_timeout_s: float = 30.0,
                 transactional: bool = False) -> None:
        self.consumer = consumer
        self.transactional = transactional
        self.sync_timeout_s = sync_timeout_s  # a synchronous commit waits this long, at most
        self.partitions = partitions
        self.interval_s = interval_s
        self.clock = clock
        self.committed: dict[TP, int] = {}  # what this supervisor committed, for status
        self._last = clock()

    def snapshot(self) -> CommitsView:
        return CommitsView(dict(self.committed), self.share_counts())

    def commit_if_due(self) -> None:
        now = self.clock()
        if now - self._last >= self.interval_s:
            self._last = now
            self.commit(list(self.partitions.values()), asynchronous=True)

    def owes(self) -> bool:
        """Some partition has an offset done and not yet committed (under exactly-once, never:
        the workers' transactions commit)."""
        return not self.transactional and any(p.tracker.needs_commit() for p in self.partitions.values())

    def commit(self, parts: list[Partition], asynchronous: bool) -> dict[TP, SyncCommit]:
        """Commit the partitions' committable offsets. Synchronous: the broker's answer for
        each partition (asynchronous: none, {})."""
        if self.transactional:
            if asynchronous:
                return {}
            # Answered "nothing sent": caught_up.py asks the group instead.
            return {p.tp: SyncCommit(None, None, p.epoch) for p in parts}
        for tp, refused_offset in self.consumer.take_refused_commits().items():
            held = self.partitions.get(tp)
            if held is not None and held.tracker.committed == refused_offset:
                held.committed(None)  # send it again
        # Asynchronous: what moved since the last commit. Synchronous: everything there is.
        offsets: dict[TP, int] = {}
        for p in parts:
            committable = p.tracker.committable
            if committable is not None and (not asynchronous or p.tracker.needs_commit()):
                offsets[p.tp] = committable
        result = self.consumer.commit(offsets, asynchronous, self.sync_timeout_s) if offsets else None
        answers: dict[TP, SyncCommit] = {}
        for p in parts:
            offset = offsets.get(p.tp)
            refused = None
            if offset is not None and result is not None:
                refused = result.refused.get(p.tp) or (None if result.sent else "not sent")
                if refused is None:
                    p.committed(offset)
                    self.committed[p.tp] = offset
            if not asynchronous:
                answers[p.tp] = SyncCommit(offset, refused, p.epoch)
        return answers

    def share_counts(self) -> dict[str, int] | None:
        """A share group's acknowledgement counts (ShareCommitter); None in a consumer group."""
        return None


class ShareCommitter(Committer):
    """A share group's commits: every tick, each partition's acknowledgement intents
    (acknowledgements.py) go to the share consumer, which sends them with its next consume(),
    batch by batch. Every tick, not every commit_interval_ms: a record acknowledged late may
    have been handed to another member meanwhile, and the share consumer polls again only
    when all of the last poll is acknowledged. No offset is ever committed.

    A synchronous commit comes at the end of a release (a stop): the partitions are fenced
    and the batches in progress are back, so what is not done will not run here: it is
    released now and the broker's answers waited for, before the final status, and the answer
    is "nothing to commit"."""

    def __init__(self, consumer: Consumer, acks: Acknowledging, partitions: Mapping[TP, Partition],
                 clock: Callable[[], float]) -> None:
        super().__init__(consumer, partitions, 0.0, clock)
        self.acks = acks

    def commit_if_due(self) -> None:
        self.commit(list(self.partitions.values()), asynchronous=True)

    def owes(self) -> bool:
        """Never: every tick hands each partition's acknowledgements to the share consumer."""
        return False

    def share_counts(self) -> dict[str, int] | None:
        return {**self.acks.counts.as_dict(), **self.acks.holding()}

    def commit(self, parts: list[Partition], asynchronous: bool) -> dict[TP, SyncCommit]:
        answers: dict[TP, SyncCommit] = {}
        for p in parts:
            if isinstance(p.tracker, AckTracker):
                if not asynchronous:
                    p.let_go_unfinished()
                for intent in p.take_acks():
                    if intent.outcome is None:  # to run again after a wait: kept, not released
                        self.acks.keep(p.tp, intent.first, intent.last)
                    else:
                        self.acks.acknowledge(p.tp, intent.first, intent.last, intent.outcome)
            if not asynchronous:
                answers[p.tp] = SyncCommit(None, None, p.epoch)
        if not asynchronous:
            self.acks.settle(self.sync_timeout_s)  # the broker's answers counted before the last status
        return answers


def committer_for(share: bool, consumer: Consumer, partitions: Mapping[TP, Partition], interval_s: float,
                  clock: Callable[[], float], sync_timeout_s: float,
                  transactional: bool = False) -> Committer:
    """The consumer group's committer, or a share group's (``share``: its consumer acknowledges).
    ``transactional``: the workers' transactions commit the offsets (output.guarantee)."""
    if not share:
        return Committer(consumer, partitions, interval_s, clock, sync_timeout_s, transactional)
    if not isinstance(consumer, Acknowledging):
        raise TypeError("a share group needs a consumer that acknowledges records")
    return ShareCommitter(consumer, consumer, partitions, clock)
