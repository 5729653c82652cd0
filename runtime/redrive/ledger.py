"""The progress of one partition of the dead-letter topic: which offset may be committed.

The one rule, as in runtime/supervisor/partition/offsets.py: a committed offset is the next one to read,
and it moves past a letter only when that letter and every letter before it are settled –
redriven and acknowledged by the broker (the copy, or its new dead letter), or passed over.
Letters are taken in offset order and settle in any order (copies to different partitions
are acknowledged independently).

Pure. Runs in: the CLI (``ringmaster redrive``).
"""

from __future__ import annotations

from collections import deque


class Ledger:
    def __init__(self) -> None:
        self._taken: deque[int] = deque()  # offsets taken, in order, not yet below the cursor
        self._unsettled: set[int] = set()
        self._next: int | None = None  # after the last offset taken

    def take(self, offset: int) -> None:
        """A letter is being handled (its copy is on its way)."""
        if self._next is not None and offset < self._next:
            raise ValueError(f"offset {offset} taken after {self._next - 1}: letters go in order")
        self._taken.append(offset)
        self._unsettled.add(offset)
        self._next = offset + 1

    def settle(self, offset: int) -> None:
        """The letter's copy (or new dead letter) was acknowledged."""
        self._unsettled.discard(offset)
        while self._taken and self._taken[0] not in self._unsettled:
            self._taken.popleft()

    def pass_over(self, offset: int) -> None:
        """A letter handled at once (passed over)."""
        self.take(offset)
        self.settle(offset)

    @property
    def in_flight(self) -> int:
        return len(self._unsettled)

    def committable(self) -> int | None:
        """The offset to commit: the first letter not settled, or after the last one taken;
        None before any letter was taken."""
        return self._taken[0] if self._taken else self._next
