"""Per-partition completion tracking → committable offset.

The one rule, applied here and nowhere else: a committed offset is the next offset to
read, and it may only move past a record when that record and every record before it in
the partition are done (invariant 1).

Records are registered in **spans**: one span per cut of the partition's fetched records,
in offset order. A span is handed out as one or more **batches** (one per lane in ``key``
ordering, where a cut is split by key hash over the workers; exactly one otherwise). A span
is done when every batch of it is done; batches finish in any order (lanes, retries,
restarts). The committable offset is the end of the prefix of done spans: the lowest
offset not yet handled across all lanes. A span whose batch was bisected (``split``) also
commits the done pieces at its start (``_within_bisected_head``).

Offsets that hold no record the consumer can see – a transaction's commit or abort marker,
records of an aborted transaction under ``read_committed`` – are never handed out, so no batch
can complete them. Between records they cost nothing (a span ends at its last record and the
next starts at the next record read); at the **end** of what was read they would keep the
committable offset one marker short for ever, and a batch run from finishing (issue 29).
``skip_to`` closes that tail: once the consumer reports the partition's end at an offset past
the last record it handed over, the offsets between are done (an empty span, done at once,
after every span before it). ``start_at_end`` closes a partition that holds nothing visible at
all (only an aborted transaction): no lag left on it for ever either.

Runs in: supervisor. Not thread-safe (the supervisor is single-threaded).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class _Span:
    first: int
    last: int
    records: int
    open: int  # batches of this span not done yet
    at: float  # clock time it was cut (the age of the oldest unhandled record)
    split: bool = False  # a batch of it was bisected (split into pieces; other lanes' parts stay)


@dataclass(slots=True)
class _Part:
    span: _Span
    first: int
    last: int


class OffsetTracker:
    def __init__(self, start: int | None = None) -> None:
        self._spans: deque[_Span] = deque()
        self._parts: dict[int, _Part] = {}
        self._committable: int | None = start
        self._committed: int | None = start
        self._base: int | None = start  # the first offset ever registered (or the start)
        self._span_records = 0  # records of the spans not done yet, kept as they change

    # -- registering (Intake: as batches are cut) -----------------------------------
    def register(self, batch_id: int, first: int, last: int, at: float = 0.0) -> None:
        """A span of one batch."""
        self.register_span(first, last, [(batch_id, first, last)], last - first + 1, at)

    def register_span(self, first: int, last: int, parts: Iterable[tuple[int, int, int]],
                      records: int, at: float = 0.0) -> None:
        """A span [first..last] of ``records`` records handed out as ``parts``
        (batch_id, first offset, last offset); parts of different lanes may interleave."""
        parts = list(parts)
        if last < first or not parts:
            raise ValueError("empty span")
        if self._spans and first <= self._spans[-1].last:
            raise ValueError(f"span [{first}..{last}] overlaps or goes backwards")
        if self._committable is not None and first < self._committable:
            raise ValueError(f"span [{first}..{last}] starts below the committable offset "
                             f"{self._committable}")
        ids = [bid for bid, _, _ in parts]
        for bid, f, lst in parts:  # every check before any change: a refused call changes nothing
            if bid in self._parts or ids.count(bid) > 1 or not first <= f <= lst <= last:
                raise ValueError(f"batch {bid} [{f}..{lst}] is not a new part of [{first}..{last}]")
        span = _Span(first, last, records, len(parts), at)
        self._spans.append(span)
        self._span_records += records
        for bid, f, lst in parts:
            self._parts[bid] = _Part(span, f, lst)
        if self._base is None:
            self._base = first

    def skip_to(self, after: int, end: int, at: float = 0.0) -> bool:
        """Offsets [after, end) hold no record the consumer can see: the consumer reported the
        partition's end at ``end`` and its last record was at ``after - 1``. They count as done
        once every span before them is. Only when everything read was registered (the last
        span ends at ``after - 1``, or the committable offset is ``after``): otherwise a record
        fetched and not yet cut could lie in the gap. True if the gap was recorded."""
        top = self._spans[-1].last + 1 if self._spans else self._committable
        if top is None or top != after or end <= after:
            return False
        if not self._spans:
            self._committable = end
            return True
        self._spans.append(_Span(after, end - 1, 0, 0, at))
        return True

    def start_at_end(self, end: int) -> bool:
        """The consumer's first report since the partition was positioned is its end, at
        ``end``, with no record before it: the offsets from where reading began hold no record
        it can see (a transaction aborted under read_committed and its marker: Apache Kafka
        hands over nothing of them), and those below were committed before or passed over by
        the reset policy. ``end`` is committable. Only while nothing was ever registered: else
        where reading began is known, and ``skip_to`` judges the gap. True if it moved."""
        if self._spans or self._parts or self._committable is not None:
            return False
        self._committable = end
        return True

    # -- completing (results, dead letters) -----------------------------------------
    def complete(self, batch_id: int) -> bool:
        """Mark a batch done; True when this moved the committable offset."""
        part = self._parts.pop(batch_id, None)
        if part is None:
            return False  # a duplicate acknowledgement (redelivery) changes nothing
        part.span.open -= 1
        moved = False
        while self._spans and self._spans[0].open == 0:
            head = self._spans.popleft()
            self._span_records -= head.records
            self._committable = head.last + 1
            moved = True
        if self._spans and self._spans[0].split:
            moved = self._within_bisected_head() or moved
        return moved

    def _within_bisected_head(self) -> bool:
        """The pieces of a bisected batch finish in any order, over several workers' lives:
        every offset of the head span below its lowest piece not done is done (or holds no
        record), so it is committable now, not only once the poison record is isolated. A
        revocation mid-bisection would otherwise hand the next owner pieces already written
        (their outputs twice: seen under KIP-848, with two members). True if it moved."""
        head = self._spans[0]
        low = min(p.first for p in self._parts.values() if p.span is head)
        # Until the first piece is done the committable offset is at most head.first.
        if low > head.first and (self._committable is None or low > self._committable):
            self._committable = low
            return True
        return False

    def split(self, batch_id: int, parts: list[tuple[int, int, int]]) -> None:
        """Replace an unfinished batch by sub-batches (batch_id, first, last) of the same
        records: used when a batch is bisected to isolate a poison record."""
        old = self._parts.get(batch_id)
        if old is None:
            raise ValueError(f"batch {batch_id} is not pending")
        if not parts or parts[0][1] < old.first or parts[-1][2] > old.last:
            raise ValueError("sub-batches must lie inside the batch")
        new_ids = [bid for bid, _, _ in parts]
        if len(set(new_ids)) != len(new_ids) or any(b in self._parts for b in new_ids):
            raise ValueError(f"sub-batches of {batch_id} need new ids, not {new_ids}")
        del self._parts[batch_id]
        old.span.open += len(parts) - 1
        old.span.split = True
        for bid, first, last in parts:
            self._parts[bid] = _Part(old.span, first, last)
        if self._spans[0] is old.span:  # its other lanes' batches may be done already
            self._within_bisected_head()

    def oldest_at(self) -> float | None:
        """When the oldest span not done yet was cut (None: everything registered is done)."""
        return self._spans[0].at if self._spans else None

    def is_pending(self, batch_id: int) -> bool:
        return batch_id in self._parts

    # -- reading ----------------------------------------------------------------------
    @property
    def committable(self) -> int | None:
        """Offset to commit (next to read), or None when nothing is done yet."""
        return self._committable

    @property
    def committed(self) -> int | None:
        return self._committed

    @property
    def unfinished(self) -> int:
        """Batches registered and not done."""
        return len(self._parts)

    @property
    def uncommitted_records(self) -> int:
        """Records registered past the committable offset (done or not): how far the
        fastest lane may have run ahead of the slowest, the bound key/unordered modes cap."""
        return self._span_records

    @property
    def handled_to(self) -> int | None:
        """The offset past every record registered or done: records below it were handed out
        already (None: nothing registered or done since the last rewind, or ever)."""
        return self._spans[-1].last + 1 if self._spans else self._committable

    def restart_offset(self) -> int | None:
        """Where to read again from to redo everything not done: the committable offset, or
        the first registered offset if nothing is done yet (None: nothing registered)."""
        if self._committable is not None:
            return self._committable
        return self._spans[0].first if self._spans else self._base

    def needs_commit(self) -> bool:
        return self._committable is not None and self._committable != self._committed

    def mark_committed(self, offset: int | None) -> None:
        self._committed = offset

    def discard_unfinished(self, keep: bool = False) -> None:
        """Forget every span not done: the partition is read again from restart_offset()
        (a rewind). Batches still out there complete nothing afterwards. (``keep``: a share
        group's, acknowledgements.py; the log keeps a consumer group's records.)"""
        self._spans.clear()
        self._parts.clear()
        self._span_records = 0
