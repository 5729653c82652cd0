"""Per-partition completion tracking → committable offset.

The one rule, applied here and nowhere else: a committed offset is the next offset to
read, and it may only move past a batch when that batch and every batch before it in
the partition are done (invariant 1). Batches of a partition are registered in offset
order as the supervisor cuts them; they may finish in any order (retries, restarts).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(slots=True)
class _Span:
    batch_id: int
    first: int
    last: int
    done: bool = False


class OffsetTracker:
    """Runs in: supervisor. Not thread-safe (the supervisor is single-threaded)."""

    def __init__(self, start: int | None = None) -> None:
        self._spans: deque[_Span] = deque()
        self._by_id: dict[int, _Span] = {}
        self._committable: int | None = start
        self._committed: int | None = start

    def register(self, batch_id: int, first: int, last: int) -> None:
        if last < first:
            raise ValueError("empty span")
        if self._spans and first <= self._spans[-1].last:
            raise ValueError(f"batch {batch_id} [{first}..{last}] overlaps or goes backwards")
        span = _Span(batch_id, first, last)
        self._spans.append(span)
        self._by_id[batch_id] = span

    def complete(self, batch_id: int) -> bool:
        """Mark a batch done; True when this moved the committable offset."""
        span = self._by_id.get(batch_id)
        if span is None or span.done:
            return False  # a duplicate acknowledgement (redelivery) changes nothing
        span.done = True
        moved = False
        while self._spans and self._spans[0].done:
            head = self._spans.popleft()
            del self._by_id[head.batch_id]
            self._committable = head.last + 1
            moved = True
        return moved

    @property
    def committable(self) -> int | None:
        """Offset to commit (next to read), or None when nothing is done yet."""
        return self._committable

    @property
    def unfinished(self) -> int:
        return sum(1 for s in self._spans if not s.done)

    def needs_commit(self) -> bool:
        return self._committable is not None and self._committable != self._committed

    def mark_committed(self, offset: int | None) -> None:
        self._committed = offset

    @property
    def committed(self) -> int | None:
        return self._committed

    def split(self, batch_id: int, parts: list[tuple[int, int, int]]) -> None:
        """Replace an unfinished batch by sub-batches (batch_id, first, last) covering the
        same offsets in order: used when a batch is bisected to isolate a poison record."""
        span = self._by_id.get(batch_id)
        if span is None or span.done:
            raise ValueError(f"batch {batch_id} is not pending")
        if parts[0][1] < span.first or parts[-1][2] > span.last:
            raise ValueError("sub-batches must lie inside the batch")
        spans = list(self._spans)
        i = spans.index(span)
        new = [_Span(bid, first, last) for bid, first, last in parts]
        spans[i:i + 1] = new
        self._spans = deque(spans)
        del self._by_id[batch_id]
        for s in new:
            self._by_id[s.batch_id] = s
