"""How long a turn of the loop waits, and for what (runtime/supervisor/daemon/loop.py). Runs
in: supervisor.

A tick waits for what unblocks it: for a result when batches wait for room in rings (the
cut gives a worker with room whatever is open: only a result lets the rest go), else for
records (the client returns as soon as one is there). The client's own wait cannot be woken
by a result, so the wait for workers comes first, on their result pipes and deaths.

While batches wait for their lanes' busy workers and another worker has next to nothing to do
(``Capacity.hungry``), the wait for workers is short: 1 ms after a fetch that brought
records, doubled after each that brought none, up to the idle wait. The records a fetch may
bring are work for it. Not whenever some worker has room: a loop turning every millisecond
for a hungry worker no record reached took the supervisor from 3.4-3.7 to 4.0-4.6 µs of CPU
a record on 2 cores (issue 24).

Never while a worker is hungry and the client may hold more records: a consume() that returned
all it was asked for left records queued, and they are work for it (issue 41). The loop waited
1 ms for a result on ~295 of 304 turns of a run at ~10 µs a record, the supervisor the
bottleneck, with 3-8 of 15 workers' rings empty and records in the client's queue: a fifth of
the run idle (an outside simulator; 0.52 of ideal, behind Pool(15)'s 0.57).

Longer when the daemon is quiet: nothing cut or in a ring, nothing owed to the group, no
command under way (``Supervisor.fetch``). No result can come then, and the client's wait ends
at the first record, so a longer wait costs a record nothing; only housekeeping that comes due
meanwhile (a signal, a command, a status, a worker's restart) waits up to _QUIET_WAIT_S. An idle
daemon turned 50 times a second at the idle wait: 2.4 % of a core in its supervisor, against
0.7 % at 100 ms (medians of 3; docs/performance.md, *An idle daemon*).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.supervisor.scheduling.capacity import Capacity

_IDLE_WAIT_S = 0.02  # the longest a tick waits for records or results while work is under way
_QUIET_WAIT_S = 0.1  # ... and when nothing is (module docstring)
_HUNGRY_WAIT_S, _HUNGRY_MAX_S = 0.001, 0.02  # the wait for a hungry worker's records (above)
_LEAST_WAIT_S = 0.001  # batch_max_wait_ms = 0 must not spin a core


@dataclass(frozen=True, slots=True)
class Wait:
    workers_s: float | None  # wait this long for a worker to report or die first (None: not)
    consume_s: float  # then the client waits this long for a first record


class Waits:
    def __init__(self, batch_max_wait_ms: float) -> None:
        self.batch_max_wait_s = batch_max_wait_ms / 1000
        self.hungry_wait_s = _HUNGRY_WAIT_S
        self.more_queued = False  # the last consume() returned all it was asked for: maybe more

    def plan(self, capacity: Capacity, open_records: bool, fetching: bool, quiet: bool = False) -> Wait:
        """``open_records``: some partition not held has records fetched and not cut;
        ``fetching``: some partition is not paused (or none was ever assigned); ``quiet``:
        nothing is under way (module docstring)."""
        waiting_for_room = open_records or capacity.waiting
        idle_s = _QUIET_WAIT_S if quiet and not waiting_for_room else _IDLE_WAIT_S
        wait_s = min(self.batch_max_wait_s, _IDLE_WAIT_S) if open_records else idle_s
        wait_s = max(wait_s, _LEAST_WAIT_S)
        hungry = fetching and bool(capacity.hungry)
        if hungry and self.more_queued:
            return Wait(None, 0.0)  # take what the client holds now (module docstring)
        workers_s = None
        if waiting_for_room or not fetching:  # the idle wait, or less for a hungry worker (above)
            workers_s = self.hungry_wait_s if hungry else wait_s
        return Wait(workers_s, wait_s if fetching and not waiting_for_room else 0.0)

    def fetched(self, records: int, wanted: int) -> None:
        """What the tick's consume() brought of the ``wanted``: the wait for a hungry worker
        follows it."""
        self.more_queued = records > 0 and records >= wanted
        self.hungry_wait_s = _HUNGRY_WAIT_S if records else min(2 * self.hungry_wait_s, _HUNGRY_MAX_S)
