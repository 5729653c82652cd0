"""The scheduler: which worker runs each batch, and when. Runs in: supervisor. The only room
that writes frames to rings.

    intake ─cut─▶ lanes (batches in offset order) ─place─▶ worker rings ─result─▶ returned()

A **lane** is a sequence of batches that must run in order, one worker at a time: a partition
in ``partition`` ordering, a key bucket of a partition in ``key`` ordering (``crc32(key) %
buckets``, a fixed number for the run, so a key always maps to the same lane).
``unordered`` batches keep no order and go to whichever worker has room.

INVARIANT (2): all the batches of a lane that are in rings are in one worker's ring; the next
batch goes to another worker only once none is out. Each ring is read in order, so a lane's
batches run in offset order on whichever workers it visits: a partition is on one worker at a
time, not for life (issue 16: binding a partition to a worker for the life of its assignment
left N partitions over W workers unbalanced, and a worker's partitions drained one after
another).

**Plugin versions** (a reload, rollout.py): each worker runs a generation of the plugin code,
and each lane remembers the newest generation it has run on (its ``floor``). A lane's batches
only go to workers of its floor's generation or newer, so its records never see an old
version after a new one (per partition in partition ordering, per key in key ordering; in
unordered, per partition in the order batches are sent: a batch redelivered after a crash may
still run after later ones, as unordered allows). Old-generation workers are preferred while they have
room: a lane moves to the new code when its worker retires or the old ones are full, not all
at once onto the first new worker.

Where a batch goes:

* a worker **has room** while it runs at most one batch and has at most one more queued, or
  while its queued work (records in its ring × its learnt µs per record) is under
  ``_AHEAD_S``: enough that it never waits for the supervisor, little enough that a record
  does not wait long behind others (latency) and lanes can move (balance). Batches wait in
  their lane meanwhile, and flow control counts them;
* a lane with batches out stays on its worker while that worker has room, unless the worker
  also serves other lanes and another worker is hungry: then the lane drains and moves;
* a lane with nothing out goes to the worker with room and the least queued work (the one
  that will start it soonest);
* lanes are served least recently served first, one batch per lane per round (round
  robin), so every backlogged partition (and key lane) makes progress: no partition waits
  while another drains. Not oldest-head first: a partition with a long backlog cut early
  would always have the oldest head and starve the others.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.supervisor.partitions import Batch, Bucket
from runtime.supervisor.seams import Bell, SlotRing
from runtime.tp import TP

log = logging.getLogger("ringmaster.scheduler")

_AHEAD_S = 0.02  # queued work a worker may have beyond one queued batch (see module docstring)
_COST_WEIGHT = 0.2  # moving average of a worker's µs per record


class HandleLike(Protocol):
    """What the scheduler needs of a worker handle (seams.Handle; runtime/supervisor/pool.py).
    Read-only: a handle whose ring is a Ring (or a test's fake) fits, as a settable
    ``ring: SlotRing`` would not let it."""

    @property
    def index(self) -> int: ...
    @property
    def ring(self) -> SlotRing: ...
    @property
    def bell(self) -> Bell | None: ...


LaneKey = tuple[TP, Bucket]


@dataclass(eq=False, slots=True)
class Lane:
    key: LaneKey
    pending: deque[Batch] = field(default_factory=deque)
    out: int = 0  # batches of this lane in rings
    worker: int | None = None  # whose ring they are in (None when none is out)
    served: int = 0  # the dispatch count when it last sent a batch (round robin)
    floor: int = 0  # the newest plugin generation it ran on: it never goes back to an older one


class Scheduler:
    def __init__(self, handles: Sequence[HandleLike], accepting: Callable[[int], bool],
                 ordered: bool, slots: int = 0) -> None:
        """``handles`` may grow, up to ``slots`` workers (the pool adds slots as a resize needs them)."""
        self.handles = handles
        self.accepting = accepting
        self.ordered = ordered  # False: unordered, batches go anywhere
        n = max(slots, len(handles))
        self._lanes: dict[LaneKey, Lane] = {}
        self._of_tp: dict[TP, set[LaneKey]] = {}
        self._ready: dict[LaneKey, Lane] = {}  # lanes with pending batches
        self._out: list[dict[int, Batch]] = [{} for _ in range(n)]  # worker -> batches in its ring
        self._queued = [0] * n  # records in each worker's ring
        self._lanes_on = [0] * n  # lanes with batches out on each worker
        self._cost_us = [0.0] * n  # each worker's µs per record, learnt from results
        self._gen = [0] * n  # the plugin generation each worker runs
        self._probe: set[int] = set()  # new workers on probation: the next free lane goes to them
        self._probe_lane: dict[int, LaneKey] = {}  # probe -> the lane draining so it can go there
        self._pending_bytes: dict[TP, int] = {}
        self._out_bytes: dict[TP, int] = {}
        self._pending_batches: dict[TP, int] = {}
        self._out_by_tp: dict[TP, int] = {}
        self._sent_count = 0

    # ------------------------------------------------------------------ batches in
    def enqueue(self, batches: Iterable[Batch]) -> None:
        """Batches cut by intake, in offset order within each lane."""
        for b in batches:
            lane = self._lane(b)
            lane.pending.append(b)
            self._ready[lane.key] = lane
            self._add_pending(b, 1)

    def requeue(self, batches: Sequence[Batch]) -> None:
        """Put batches back in front of their lanes, in the order given (a worker died with
        them in its ring: they run again, on whichever worker the lane goes to next)."""
        for b in reversed(batches):
            lane = self._lane(b)
            lane.pending.appendleft(b)
            self._ready[lane.key] = lane
            self._add_pending(b, 1)

    def _lane(self, b: Batch) -> Lane:
        key = (b.tp, b.bucket)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key)
            self._of_tp.setdefault(b.tp, set()).add(key)
        return lane

    def _add_pending(self, b: Batch, sign: int) -> None:
        self._pending_bytes[b.tp] = self._pending_bytes.get(b.tp, 0) + sign * len(b.frame)
        self._pending_batches[b.tp] = self._pending_batches.get(b.tp, 0) + sign

    # ------------------------------------------------------------------ dispatch
    def dispatch(self) -> None:
        """Write pending batches into rings while workers have room; never block
        (invariant 3: a batch that finds no room waits in its lane)."""
        if not self._ready:
            return
        lanes = sorted(self._ready.values(), key=_served)
        full: set[int] = set()  # rings that refused a frame this round
        hungry = self._hungry()
        written: dict[int, int] = {}  # worker -> its ring's write position before this round
        while lanes:
            next_round = []
            for lane in lanes:
                b = lane.pending[0]
                w = self._place(lane, full, hungry)
                if w is None:
                    continue
                ring = self.handles[w].ring
                start = ring.write_position()
                if not ring.try_write(b.frame):
                    full.add(w)  # its ring has no room for the frame: another worker may
                    next_round.append(lane)
                    continue
                written.setdefault(w, start)
                lane.pending.popleft()
                self._add_pending(b, -1)
                self._sent(w, lane, b)
                hungry.discard(w)
                if lane.pending:
                    next_round.append(lane)
                else:
                    del self._ready[lane.key]
            lanes = next_round
        for w, start in written.items():
            # A worker still busy with frames written before this round reads the new ones
            # without sleeping: a doorbell write per dispatch cost 6 % of the supervisor.
            h = self.handles[w]
            if h.bell is not None and h.ring.reader_reached(start):
                h.bell.ring()

    def _place(self, lane: Lane, full: set[int], hungry: set[int]) -> int | None:
        if self.ordered and lane.out:
            w = lane.worker
            assert w is not None
            if w in full or not self._room(w):
                return None
            # Stay, unless this worker serves other lanes too and another one that the lane
            # would go to (the same code) has too little to do: then let this lane drain, so
            # that its next batch can go there.
            if self._lanes_on[w] > 1 and any(h != w and self._gen[h] == self._gen[w] for h in hungry):
                return None
            if self._probe and self._drains_for_probe(lane):
                return None
            return w
        for w in sorted(self._probe):
            # A worker on probation (a reload's first new worker) is given a lane at once: its
            # first batch tells whether the new code works, and a partition tried on it goes
            # back to the old code if it does not (lower_floors).
            if w not in full and self._gen[w] >= lane.floor and self._room(w):
                return w
        best = None
        for w in range(len(self.handles)):
            if w in full or self._gen[w] < lane.floor or not self._room(w):
                continue
            # INVARIANT: never an older plugin version after a newer one in a lane; among the
            # rest, the oldest code first (module docstring), then the one that starts it soonest.
            load = (self._gen[w], self._queued_s(w), self._queued[w], w)
            if best is None or load < best[0]:
                best = (load, w)
        return None if best is None else best[1]

    def _drains_for_probe(self, lane: Lane) -> bool:
        """A worker on probation waits for a lane with nothing out, and under steady load no
        lane ever has nothing out (each keeps a batch queued behind the running one): one
        lane, the first one served, takes no more batches until those out are done, and then
        goes to the probe. Only while the probe takes frames (a reload's new worker takes
        none before it is ready), or the lane would drain and go straight back."""
        for w in self._probe:
            key = self._probe_lane.get(w)
            if key is None and self._gen[w] >= lane.floor and self._room(w):
                self._probe_lane[w] = key = lane.key
            if key == lane.key:
                return self._room(w)
        return False

    def _room(self, w: int) -> bool:
        if not self.accepting(w):
            return False
        out = len(self._out[w])
        if out < 2:
            return True  # one running, one queued: the worker never waits for us
        if not self._cost_us[w]:
            return False  # nothing learnt yet: no more than that
        return self._queued_s(w) < _AHEAD_S

    def _queued_s(self, w: int) -> float:
        return self._queued[w] * self._cost_us[w] / 1e6

    def _hungry(self) -> set[int]:
        """Workers with room and next to nothing to do."""
        return {w for w in range(len(self.handles))
                if len(self._out[w]) < 2 and self._queued_s(w) < _AHEAD_S / 2 and self.accepting(w)}

    def _sent(self, w: int, lane: Lane, b: Batch) -> None:
        self._probe.discard(w)
        self._probe_lane.pop(w, None)
        self._sent_count += 1
        lane.served = self._sent_count
        self._out[w][b.batch_id] = b
        self._queued[w] += b.count
        lane.floor = max(lane.floor, self._gen[w])
        if lane.out == 0 and self.ordered:
            lane.worker = w
            self._lanes_on[w] += 1
        lane.out += 1
        self._out_bytes[b.tp] = self._out_bytes.get(b.tp, 0) + len(b.frame)
        self._out_by_tp[b.tp] = self._out_by_tp.get(b.tp, 0) + 1

    # ------------------------------------------------------------------ batches back
    def returned(self, w: int, batch_id: int) -> Batch | None:
        """A worker reported a batch (done, skipped, deferred...): it is no longer in its
        ring. None when it was not out (its partition was released meanwhile, or a
        duplicate report): such a result counts for nothing."""
        b = self._out[w].pop(batch_id, None)
        if b is not None:
            self._back(w, b)
        return b

    def take_all(self, w: int) -> list[Batch]:
        """Every batch in a dead worker's ring, in ring order."""
        batches = list(self._out[w].values())
        self._out[w] = {}
        for b in batches:
            self._back(w, b)
        return batches

    def _back(self, w: int, b: Batch) -> None:
        self._queued[w] -= b.count
        self._out_bytes[b.tp] -= len(b.frame)
        self._out_by_tp[b.tp] -= 1
        lane = self._lanes.get((b.tp, b.bucket))
        if lane is not None:
            lane.out -= 1
            if lane.out == 0 and self.ordered:
                lane.worker = None
                self._lanes_on[w] -= 1

    def new_worker(self, w: int, generation: int, probe: bool = False) -> None:
        """Slot w gets a worker running plugin generation ``generation``: nothing learnt of it
        yet (a new version may be faster or slower). Its ring is empty. ``probe``: it is on
        probation, and gets the next lane that has nothing out, whatever the others' load."""
        self._gen[w] = generation
        self._cost_us[w] = 0.0
        self._probe.discard(w)
        self._probe_lane.pop(w, None)
        if probe:
            self._probe.add(w)

    def lower_floors(self, generation: int) -> None:
        """A reload was rolled back: no worker runs a generation above this any more, and the
        lanes that ran on its first worker go back to the old code (the one place a lane sees
        a newer version before an older one)."""
        for lane in self._lanes.values():
            lane.floor = min(lane.floor, generation)

    def learn(self, w: int, busy_ms: float, records: int) -> None:
        """A worker's speed, from the time its batches take (queued work estimates)."""
        if records > 0 and busy_ms >= 0:
            sample = busy_ms * 1000 / records
            old = self._cost_us[w]
            self._cost_us[w] = sample if not old else (1 - _COST_WEIGHT) * old + _COST_WEIGHT * sample

    # ------------------------------------------------------------------ partitions
    def drop_pending(self, tp: TP) -> None:
        """Forget the partition's batches not yet in a ring (a fence made them stale)."""
        for key in self._of_tp.get(tp, ()):
            lane = self._lanes[key]
            for b in lane.pending:
                self._add_pending(b, -1)
            lane.pending.clear()
            self._ready.pop(key, None)

    def forget(self, tp: TP) -> None:
        """The partition was released: its batches in rings are stale (workers skip them: a
        new epoch) and a late result of one completes nothing."""
        self.drop_pending(tp)
        for w, out in enumerate(self._out):
            for bid in [bid for bid, b in out.items() if b.tp == tp]:
                self._back(w, out.pop(bid))
        for key in self._of_tp.pop(tp, ()):
            del self._lanes[key]
        for w, key in list(self._probe_lane.items()):
            if key[0] == tp:
                del self._probe_lane[w]
        for table in (self._pending_bytes, self._out_bytes, self._pending_batches, self._out_by_tp):
            table.pop(tp, None)

    # ------------------------------------------------------------------ questions
    def has_out(self, tp: TP) -> bool:
        return self._out_by_tp.get(tp, 0) > 0

    def out_on(self, w: int, batch_id: int) -> bool:
        return batch_id in self._out[w]

    def count(self, w: int) -> int:
        """Batches in worker w's ring (running or queued)."""
        return len(self._out[w])

    def pending(self, tp: TP) -> int:
        """Batches of the partition cut and waiting for a ring."""
        return self._pending_batches.get(tp, 0)

    def backlog_bytes(self, tp: TP) -> int:
        """Frame bytes of the partition waiting for a ring or in one."""
        return self._pending_bytes.get(tp, 0) + self._out_bytes.get(tp, 0)

    def total_backlog_bytes(self) -> int:
        return sum(self._pending_bytes.values()) + sum(self._out_bytes.values())

    def waiting_for_room(self) -> bool:
        """Batches are waiting for a worker: a result is what lets them go."""
        return bool(self._ready)

    def can_take_more(self) -> bool:
        """Some worker has room and nothing pending is waiting for it: cutting a small batch
        now costs nothing (adaptive batching)."""
        return not self._ready and any(self._room(w) for w in range(len(self.handles)))

    def worker_of(self, tp: TP) -> int | None:
        """The worker a partition's batches are on now (partition ordering), if any is out."""
        lane = self._lanes.get((tp, None))
        return lane.worker if lane is not None and self.ordered else None

    def queued_records(self, w: int) -> int:
        return self._queued[w]

    def cost_us(self, w: int) -> float:
        return self._cost_us[w]

    def lanes_on(self, w: int) -> int:
        return self._lanes_on[w]


def _served(lane: Lane) -> int:
    return lane.served
