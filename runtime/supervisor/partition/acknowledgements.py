"""Per-partition completion tracking → acknowledgements, for a share group (KIP-932).

A share group commits no offset: each record is acknowledged on its own. The rooms keep
calling a partition's tracker as they do in a consumer group (intake registers batches,
results completes them, a dead worker's crashing batch is split, a rewind discards what is
not done); in share mode that tracker is an :class:`AckTracker`, which turns those calls into
acknowledgement intents that the share committer (commits.py ``ShareCommitter``) hands to the
share consumer every tick:

    complete(batch)          → ACCEPT its records: the worker reports DONE only once the
                               batch's outputs and dead letters are delivered (invariant 1),
                               and a set-aside record completes when its dead letter is
    discard_unfinished(keep) → every batch not done is kept by the share consumer, to run
                               again after the wait (a rewind for an outage, a plugin's
                               Backoff, a record with nowhere to go: ``keep``), or RELEASEd
                               (an operator pause, a stop): another member may run it now
    give_up(batch, outcome)  → RELEASE a batch this member will not finish (a crashing
                               record whose lock ends before its isolation does), or REJECT
                               one it cannot dead-letter (no dead-letter topic)

A batch is [first, last] of one partition: the share consumer acknowledges the records of
that range it holds (the offsets between may be other members').

A poison record is dead-lettered, then ACCEPTed, not REJECTed: the dead-letter topic keeps
it with its error and delivery count for ``ringmaster redrive``, where REJECT would only
archive it in the share group, with no trace of why.

Runs in: supervisor. Not thread-safe (the supervisor is single-threaded).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from runtime.kafka.share_consumer import Outcome
from runtime.supervisor.partition.offsets import OffsetTracker


@dataclass(frozen=True, slots=True)
class Intent:
    first: int
    last: int
    outcome: Outcome | None  # None: kept by the share consumer, to run again after a wait


@dataclass(slots=True)
class _Open:
    first: int
    last: int
    at: float


class AckTracker(OffsetTracker):
    """An OffsetTracker with no committable offset: batches register, complete and split as
    there, and what is done or given up becomes an :class:`Intent`."""

    def __init__(self) -> None:
        super().__init__(None)
        self._open: dict[int, _Open] = {}
        self._intents: list[Intent] = []

    def register(self, batch_id: int, first: int, last: int, at: float = 0.0) -> None:
        if last < first or batch_id in self._open:
            raise ValueError(f"batch {batch_id} [{first}..{last}] is not a new batch")
        self._open[batch_id] = _Open(first, last, at)

    def register_span(self, first: int, last: int, parts: Iterable[tuple[int, int, int]],
                      records: int, at: float = 0.0) -> None:
        for bid, f, lst in parts:
            self.register(bid, f, lst, at)

    def skip_to(self, after: int, end: int, at: float = 0.0) -> bool:
        return False  # no end of a partition to reach: nothing is committed

    def complete(self, batch_id: int) -> bool:
        done = self._open.pop(batch_id, None)
        if done is None:
            return False  # a duplicate result (a redelivered batch) acknowledges nothing twice
        self._intents.append(Intent(done.first, done.last, Outcome.ACCEPT))
        return True

    def split(self, batch_id: int, parts: list[tuple[int, int, int]]) -> None:
        old = self._open.get(batch_id)
        if old is None:
            raise ValueError(f"batch {batch_id} is not pending")
        if not parts or parts[0][1] < old.first or parts[-1][2] > old.last:
            raise ValueError("sub-batches must lie inside the batch")
        del self._open[batch_id]
        for bid, first, last in parts:
            self._open[bid] = _Open(first, last, old.at)

    def oldest_at(self) -> float | None:
        return min((o.at for o in self._open.values()), default=None)

    def is_pending(self, batch_id: int) -> bool:
        return batch_id in self._open

    @property
    def unfinished(self) -> int:
        return len(self._open)

    @property
    def uncommitted_records(self) -> int:
        """An upper bound (a batch's range may hold other members' offsets)."""
        return sum(o.last - o.first + 1 for o in self._open.values())

    def restart_offset(self) -> int | None:
        return min((o.first for o in self._open.values()), default=None)

    def discard_unfinished(self, keep: bool = False) -> None:
        """A rewind: what is not done is kept, to run again here after the wait (``keep``: every
        release spends one of a record's deliveries), or released, to be handed out again
        (here or elsewhere)."""
        outcome = None if keep else Outcome.RELEASE
        self._intents += [Intent(o.first, o.last, outcome) for o in self._open.values()]
        self._open.clear()

    def give_up(self, batch_id: int, outcome: Outcome = Outcome.RELEASE) -> bool:
        """A batch this member will not finish: acknowledged with ``outcome`` as it stands."""
        gone = self._open.pop(batch_id, None)
        if gone is None:
            return False
        self._intents.append(Intent(gone.first, gone.last, outcome))
        return True

    def take_intents(self) -> list[Intent]:
        taken, self._intents = self._intents, []
        return taken
