"""What the workers can take, as one value the loop passes on: the wait, the cut and the
placing of batches decide by it, and no room keeps it between calls.

    allowance  per worker slot, how many batches its ring may hold now: the workforce's answer
               (0 for a worker that takes no frames; with ``max_batches``, what is left of its
               incarnation's budget)
    room       the workers with room for another batch now (scheduler.py, ``_room``)
    hungry     the workers with room and next to nothing to do
    waiting    batches wait in their lanes for a worker: only a result lets them go

The scheduler computes it (``Scheduler.capacity``) from the allowance and what it has out in
each ring. A tick takes it twice: as it begins, for the wait and the cut, and again just before
placing, once the results that arrived meanwhile are read (runtime/supervisor/daemon/loop.py
says why). Runs in: supervisor.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Capacity:
    allowance: tuple[int, ...]
    room: frozenset[int]
    hungry: frozenset[int]
    waiting: bool

    @property
    def spare(self) -> bool:
        """Some worker has room and no batch waits for it: cutting a small batch now costs
        nothing (adaptive batching)."""
        return bool(self.room) and not self.waiting
