"""The scheduler: which worker runs each batch, and when. Runs in: supervisor. The only room
that writes frames to rings.

    intake ─cut─▶ lanes (batches in offset order) ─place─▶ worker rings ─result─▶ returned()

A **lane** is a sequence of batches that must run in order, one worker at a time: a partition
in ``partition`` ordering, a key bucket of a partition in ``key`` ordering (``crc32(key) %
buckets``, a fixed number for the run, so a key always maps to the same lane).
``unordered`` batches keep no order and go to whichever worker has room.

In ``key`` ordering one frame may hold several buckets' records (a small cut, intake.py: 15
frames of a dozen records each filled the supervisor with per-frame work, issue 24). Such a
batch is in each of its buckets' lanes, and goes only when it heads all of them and they are
out on no worker but the one it goes to: invariant 2 holds for each of its lanes.

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
  also serves other lanes and either another worker is hungry, or the work left would end
  sooner with the lane elsewhere (``_better_elsewhere``: balance while every worker is busy,
  the lane furthest ahead first): then it drains and moves, not back while others are there;
* a lane with nothing out goes to the worker with room whose lanes have the least work
  left, provided that is within a margin of the least any worker has (ordered lanes;
  unordered batches go to the least queued work); ties are taken in turn, not lowest
  index first;
* **work left** is a lane's pending and in-ring records plus its share of its partition's
  records not fetched yet (``set_behind``, from the loop): a hot partition's lane gets a
  worker to itself, and lanes that all have a backlog finish together;
* lanes are served least recently served first, one batch per lane per round (round
  robin), so every backlogged partition (and key lane) makes progress: no partition waits
  while another drains. Not oldest-head first: a partition with a long backlog cut early
  would always have the oldest head and starve the others.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from runtime.supervisor.scheduling.batches import Batch, Bucket
from runtime.supervisor.scheduling.capacity import Capacity
from runtime.supervisor.seams.pool import Bell, SlotRing
from runtime.tp import TP
from runtime.transport.frames import STOP_FRAME

log = logging.getLogger("ringmaster.scheduler")

# Batches queued in a ring behind the one running, so that a worker never waits for the supervisor
# (ProcessPoolExecutor's EXTRA_QUEUED_CALLS); one more for a worker that delivers pipelined
# (worker/batch_runner.py): with two out, it found its ring empty and waited for the broker.
_EXTRA_QUEUED, _EXTRA_QUEUED_PIPELINED = 1, 2
_AHEAD_S = 0.02  # queued work a worker may have beyond one queued batch (see module docstring)
_COST_WEIGHT, _INF = 0.2, float("inf")  # the moving average of a worker's µs per record; infinity


class HandleLike(Protocol):
    """What the scheduler needs of a worker handle (seams.Handle; runtime/supervisor/workers/pool.py),
    read-only: a handle whose ring is a Ring (or a test's fake) fits."""

    @property
    def index(self) -> int: ...
    @property
    def ring(self) -> SlotRing: ...
    @property
    def bell(self) -> Bell | None: ...


LaneKey = tuple[TP, Bucket]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's share of the scheduler's work, as status shows it."""

    in_flight: int  # batches in its ring (running or queued)
    queued_records: int
    lanes: int  # lanes with batches out on it
    us_per_record: float  # learnt from its results


@dataclass(frozen=True, slots=True)
class SchedulerView:
    """What the scheduler reports (runtime/supervisor/daemon/report.py)."""

    workers: tuple[WorkerLoad, ...]  # per worker slot
    worker_of: dict[TP, int]  # partition ordering: the worker a partition's batches are on now
    pending: dict[TP, int]  # batches of each partition cut and waiting for a ring


@dataclass(eq=False, slots=True)
class Lane:
    key: LaneKey
    pending: deque[Batch] = field(default_factory=deque)
    out: int = 0  # batches of this lane in rings
    worker: int | None = None  # whose ring they are in (None when none is out)
    served: int = 0  # the dispatch count when it last sent a batch (round robin)
    floor: int = 0  # the newest plugin generation it ran on: it never goes back to an older one
    records: int = 0  # records in its pending batches
    out_records: int = 0  # records in its batches in rings
    leaving: int | None = None  # the worker it is draining from to move (balance): not back there


class Scheduler:
    def __init__(self, handles: Sequence[HandleLike], ordered: bool, slots: int = 0,
                 pipelined: bool = False) -> None:
        """``handles`` may grow, up to ``slots`` workers (the pool adds slots as a resize needs them).
        ``pipelined``: the workers run a batch while the last one's outputs are acknowledged."""
        self.handles = handles
        self._extra_queued = _EXTRA_QUEUED_PIPELINED if pipelined else _EXTRA_QUEUED
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
        self._turn = 0  # ties between equally loaded workers start after the last one chosen
        self._left_on = [0.0] * n  # work left in the lanes on each worker (_weigh, per round)
        self._ahead_on = [_INF] * n  # ... and the least one lane there has (the furthest ahead)
        self._least_left = self._next_left = 0.0  # the least of those (and the next), on _least_at
        self._least_at: int | None = None
        self._bound: dict[LaneKey, Lane] = {}  # lanes with batches out (ordered)
        self._behind: dict[TP, int] = {}  # records of each partition not fetched yet (set_behind)

    # ------------------------------------------------------------------ batches in
    def enqueue(self, batches: Iterable[Batch]) -> None:
        """Batches cut by intake, in offset order within each lane."""
        for b in batches:
            for lane in self._lanes_of(b):
                lane.pending.append(b)
                lane.records += b.count
                self._ready[lane.key] = lane
            self._add_pending(b, 1)

    def requeue(self, batches: Sequence[Batch]) -> None:
        """Put batches back in front of their lanes, in the order given (a worker died with
        them in its ring: they run again, on whichever worker the lane goes to next)."""
        for b in reversed(batches):
            for lane in self._lanes_of(b):
                lane.pending.appendleft(b)
                lane.records += b.count
                self._ready[lane.key] = lane
            self._add_pending(b, 1)

    def _lanes_of(self, b: Batch) -> list[Lane]:
        """The lanes a batch is in: its bucket's, or each of its buckets' (key ordering)."""
        if b.buckets is None:
            return [self._lane(b.tp, b.bucket)]
        return [self._lane(b.tp, x) for x in b.buckets]

    def _lane(self, tp: TP, bucket: Bucket) -> Lane:
        key = (tp, bucket)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = Lane(key)
            self._of_tp.setdefault(tp, set()).add(key)
        return lane

    def _add_pending(self, b: Batch, sign: int) -> None:
        self._pending_bytes[b.tp] = self._pending_bytes.get(b.tp, 0) + sign * len(b.frame)
        self._pending_batches[b.tp] = self._pending_batches.get(b.tp, 0) + sign

    # ------------------------------------------------------------------ dispatch
    def capacity(self, allowance: Sequence[int]) -> Capacity:
        """What the workers can take now, each ring within the workforce's ``allowance``
        (capacity.py). Which workers have room is asked here once, and again in dispatch only
        for a worker just written to: asking every worker for every lane cost the supervisor
        O(lanes × workers) per tick (480 key lanes × 15 workers: seconds of CPU in a simulated
        run)."""
        allowed = tuple(allowance)
        room = frozenset(w for w in range(len(self.handles)) if self._room(w, allowed))
        return Capacity(allowed, room, frozenset(self._hungry(allowed)), bool(self._ready))

    def dispatch(self, capacity: Capacity) -> None:
        """Write pending batches into rings while workers have room (``capacity``, taken just
        before), each ring within its allowance; never block (invariant 3: a batch that finds
        no room waits in its lane)."""
        if not self._ready:
            return
        allowance = capacity.allowance
        room = set(capacity.room)
        if not room:
            return
        lanes = sorted(self._ready.values(), key=_served)
        hungry = set(capacity.hungry)
        if self.ordered:
            self._weigh(allowance)
        written: dict[int, int] = {}  # worker -> its ring's write position before this round
        while lanes and room:
            next_round = []
            for lane in lanes:
                if not lane.pending:
                    continue  # a batch of several lanes, sent from another of them this round
                b = lane.pending[0]
                shared = None if b.buckets is None else self._lanes_of(b)
                if shared is None:
                    w = self._place(lane, room, hungry, allowance)
                else:
                    w = self._place_shared(b, shared, room, hungry, allowance)
                if w is None:
                    continue
                ring = self.handles[w].ring
                start = ring.write_position()
                if not ring.try_write(b.frame):
                    room.discard(w)  # its ring has no room for the frame: another worker may
                    next_round.append(lane)
                    continue
                written.setdefault(w, start)
                self._add_pending(b, -1)
                self._sent(w, b)
                for sent in shared or (lane,):
                    sent.pending.popleft()
                    sent.records -= b.count
                    self._lane_sent(w, sent, b, allowance)
                    if sent.pending:
                        if sent is lane:
                            next_round.append(lane)  # another of them is still in this round's list
                    else:
                        del self._ready[sent.key]
                hungry.discard(w)
                if not self._room(w, allowance):
                    room.discard(w)
            lanes = next_round
        for w, start in written.items():
            # A worker still busy with frames written before this round reads the new ones
            # without sleeping: a doorbell write per dispatch cost 6 % of the supervisor.
            h = self.handles[w]
            if h.bell is not None and h.ring.reader_reached(start):
                h.bell.ring()

    def _place(self, lane: Lane, room: set[int], hungry: set[int], allowance: Sequence[int]) -> int | None:
        if self.ordered and lane.out:
            w = lane.worker
            assert w is not None
            if w not in room:
                return None
            # Stay, unless this worker serves other lanes too and another one that the lane
            # would go to (the same code) has too little to do: then let this lane drain, so
            # that its next batch can go there.
            if self._lanes_on[w] > 1 and any(h != w and self._gen[h] == self._gen[w] for h in hungry):
                return None
            if self._lanes_on[w] > 1 and self._better_elsewhere(lane, w):
                # Balance while every worker is busy (no worker is hungry then, so the rule above
                # never fires: with 16 partitions over 15 workers two lanes shared one worker at
                # half speed and ended the run alone). It drains and takes a worker elsewhere.
                lane.leaving = w
                return None
            if self._probe and self._drains_for_probe(lane, allowance):
                return None
            return w
        for w in sorted(self._probe):
            # A worker on probation (a reload's first new worker) is given a lane at once: its
            # first batch tells whether the new code works, and a partition tried on it goes
            # back to the old code if it does not (lower_floors).
            if w in room and self._gen[w] >= lane.floor:
                return w
        best = None
        n = len(self.handles)
        leaving = lane.leaving
        if leaving is not None and (not self._lanes_on[leaving] or not any(
                self._accepting(h, allowance) for h in range(n) if h != leaving)):
            leaving = lane.leaving = None  # nothing left there to make room for, or nowhere else to go
        worst = self._acceptable_left(lane, leaving) if self.ordered else _INF
        for w in room:
            if self._gen[w] < lane.floor or w == leaving or self._left_on[w] > worst:
                continue
            # INVARIANT: never an older plugin version after a newer one in a lane; among the
            # rest, the oldest code first (module docstring), then the one that starts it
            # soonest; ties taken in turn from the worker after the last one chosen, not
            # always the lowest-numbered (under a supervisor limit that piled the work on
            # workers 0, 1, 2 and left the others idle).
            # Ordered lanes: the worker whose lanes have the least work left first (the one
            # that can best spare a share of itself).
            left = self._left_on[w] if self.ordered else 0.0
            load = (self._gen[w], left, self._queued_s(w), self._queued[w], (w - self._turn) % n)
            if best is None or load < best[0]:
                best = (load, w)
        if best is None:
            return None
        self._turn = best[1] + 1
        lane.leaving = None
        return best[1]

    def _place_shared(self, b: Batch, lanes: list[Lane], room: set[int], hungry: set[int],
                      allowance: Sequence[int]) -> int | None:
        """Where a batch of several lanes goes (key ordering, module docstring): only once it
        heads each of them; to the one worker those with batches out are on, or, none being
        out, where the first of them would go. Never to a worker older than any lane's floor."""
        if any(lane.pending[0] is not b for lane in lanes):
            return None  # a lane still has earlier batches to send: it comes back here after them
        on = {lane.worker for lane in lanes if lane.out}
        if len(on) > 1:
            return None  # they drain first: a result lets it go
        floor = max(lane.floor for lane in lanes)
        if on:
            w = on.pop()
            return w if w is not None and w in room and self._gen[w] >= floor else None
        first = lanes[0]
        first.floor, saved = floor, first.floor
        try:
            return self._place(first, room, hungry, allowance)
        finally:
            first.floor = saved

    def _left(self, lane: Lane) -> float:
        """Records a lane has left: pending, in rings, and its share of its partition's
        records not fetched yet."""
        tp = lane.key[0]
        behind = self._behind.get(tp, 0)
        return lane.records + lane.out_records + (behind / len(self._of_tp[tp]) if behind else 0.0)

    def _weigh(self, allowance: Sequence[int]) -> None:
        """Per worker, the work left in the lanes on it (a round's placements go by it)."""
        left, ahead = [0.0] * len(self._out), [_INF] * len(self._out)
        for lane in self._bound.values():
            assert lane.worker is not None
            left[lane.worker] += (v := self._left(lane))
            ahead[lane.worker] = min(ahead[lane.worker], v)
        self._left_on, self._ahead_on = left, ahead
        self._find_least(allowance)

    def _find_least(self, allowance: Sequence[int]) -> None:
        """The least work left on a worker that takes frames, which one, and the next least.
        (Workers of every plugin generation together: close enough for balance.)"""
        least = nxt = _INF
        at = None
        for h in range(len(self.handles)):
            if not self._accepting(h, allowance):
                continue
            v = self._left_on[h]
            if v < least:
                least, nxt, at = v, least, h
            elif v < nxt:
                nxt = v
        self._least_left, self._next_left, self._least_at = least, nxt, at

    def _acceptable_left(self, lane: Lane, leaving: int | None) -> float:
        """The most work left a worker may already have for this lane to join it: a little
        more than the least any worker that may run it has (but the one it is leaving). A
        worker with room now but far more to do (a hot partition's) is not joined: the lane
        waits for a better one, which gets room within a batch."""
        least = self._next_left if leaving is not None and leaving == self._least_at else self._least_left
        return least + 2 * self._batch_records(lane)

    @staticmethod
    def _batch_records(lane: Lane) -> float:
        if lane.out:
            return lane.out_records / lane.out
        return lane.records / len(lane.pending) if lane.pending else 0.0

    def _better_elsewhere(self, lane: Lane, w: int) -> bool:
        """Would the work left end sooner with this lane on another worker? The lanes on a
        worker share it in turn, so a worker finishes when the work left on it is done; the
        longest of those sets the run's end. Moving the lane to the worker with the least
        left shortens it when that worker, lane added, still has less left than this one
        (a margin of one of its batches against flapping). Only the lane furthest ahead there
        moves: the lane that had moved moving again did all the sharing and ended the run
        alone (issue 41: 16 partitions over 15 workers, 0.94 of ideal; 0.955 now)."""
        if self._left(lane) > self._ahead_on[w] + self._batch_records(lane):
            return False
        least = self._least_left if self._least_at != w else self._next_left
        return least + self._left(lane) + self._batch_records(lane) < self._left_on[w]

    def _drains_for_probe(self, lane: Lane, allowance: Sequence[int]) -> bool:
        """A worker on probation waits for a lane with nothing out, and under steady load no
        lane ever has nothing out (each keeps a batch queued behind the running one): one
        lane, the first one served, takes no more batches until those out are done, and then
        goes to the probe. Only while the probe takes frames (a reload's new worker takes
        none before it is ready), or the lane would drain and go straight back."""
        for w in self._probe:
            key = self._probe_lane.get(w)
            if key is None and self._gen[w] >= lane.floor and self._room(w, allowance):
                self._probe_lane[w] = key = lane.key
            if key == lane.key:
                return self._room(w, allowance)
        return False

    def _accepting(self, w: int, allowance: Sequence[int]) -> bool:
        return len(self._out[w]) < allowance[w]

    def _room(self, w: int, allowance: Sequence[int]) -> bool:
        if len(self._out[w]) >= allowance[w]:
            return False
        if len(self._out[w]) <= self._extra_queued:
            return True  # one running, one queued: the worker never waits for us
        if not self._cost_us[w]:
            return False  # nothing learnt yet: no more than that
        return self._queued_s(w) < _AHEAD_S

    def _queued_s(self, w: int) -> float:
        return self._queued[w] * self._cost_us[w] / 1e6

    def set_behind(self, behind: dict[TP, int] | None) -> None:
        """Records of each partition still in the log, not fetched yet (its lag beyond what
        the supervisor holds): part of the work a lane has left. None: no news."""
        if behind is not None:
            self._behind = behind

    def _hungry(self, allowance: Sequence[int]) -> set[int]:
        """Workers with room and next to nothing to do."""
        return {w for w in range(len(self.handles)) if len(self._out[w]) <= self._extra_queued
                and self._queued_s(w) < _AHEAD_S / 2 and self._accepting(w, allowance)}

    def _sent(self, w: int, b: Batch) -> None:
        self._probe.discard(w)
        self._probe_lane.pop(w, None)
        self._sent_count += 1
        self._out[w][b.batch_id] = b
        self._queued[w] += b.count
        self._out_bytes[b.tp] = self._out_bytes.get(b.tp, 0) + len(b.frame)
        self._out_by_tp[b.tp] = self._out_by_tp.get(b.tp, 0) + 1

    def _lane_sent(self, w: int, lane: Lane, b: Batch, allowance: Sequence[int]) -> None:
        lane.served = self._sent_count
        lane.out_records += b.count
        if self.ordered and lane.worker != w:
            self._left_on[w] += self._left(lane)
            self._find_least(allowance)
        lane.floor = max(lane.floor, self._gen[w])
        if lane.out == 0 and self.ordered:
            lane.worker = w
            self._lanes_on[w] += 1
            self._bound[lane.key] = lane
        lane.out += 1

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
        for bucket in (b.bucket,) if b.buckets is None else b.buckets:
            lane = self._lanes.get((b.tp, bucket))
            if lane is None:
                continue
            lane.out -= 1
            lane.out_records -= b.count
            if lane.out == 0 and self.ordered:
                lane.worker = None
                self._lanes_on[w] -= 1
                self._bound.pop(lane.key, None)

    def write_stop(self, w: int) -> bool:
        """A STOP frame behind the batches in worker w's ring (the workforce's stops_due: a
        recycle or a retirement): the worker finishes them, then exits. False when the ring has
        no room for it now: asked again next tick, and nothing else is written there meanwhile
        (the workforce allows the worker no more batches)."""
        h = self.handles[w]
        if not h.ring.try_write(STOP_FRAME):
            return False
        if h.bell is not None:
            h.bell.ring()
        return True

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
    def discard(self, tp: TP) -> list[Batch]:
        """Forget the partition's batches not yet in a ring (a fence made them stale, or a
        share group's lock ends before they would start; the partition says so,
        runtime/supervisor/partition/partition.py); returns them, each once."""
        dropped: dict[int, Batch] = {}  # a batch of several lanes is counted once
        for key in self._of_tp.get(tp, ()):
            lane = self._lanes[key]
            for b in lane.pending:
                if b.batch_id not in dropped:
                    dropped[b.batch_id] = b
                    self._add_pending(b, -1)
            lane.pending.clear()
            lane.records = 0
            self._ready.pop(key, None)
        return list(dropped.values())

    def forget(self, tp: TP) -> None:
        """The partition was released: its batches in rings are stale (workers skip them: a
        new epoch) and a late result of one completes nothing."""
        self.discard(tp)
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
    def snapshot(self) -> SchedulerView:
        workers = tuple(WorkerLoad(len(self._out[w]), self._queued[w], self._lanes_on[w], self._cost_us[w])
                        for w in range(len(self._out)))
        worker_of = {key[0]: lane.worker for key, lane in self._bound.items()
                     if key[1] is None and lane.worker is not None}
        return SchedulerView(workers, worker_of, {tp: n for tp, n in self._pending_batches.items() if n})

    def has_out(self, tp: TP) -> bool:
        return self._out_by_tp.get(tp, 0) > 0

    def out_on(self, w: int, batch_id: int) -> bool:
        return batch_id in self._out[w]

    def count(self, w: int) -> int:
        """Batches in worker w's ring (running or queued)."""
        return len(self._out[w])

    def counts(self) -> list[int]:
        """Batches in each worker's ring (what the workforce's recycling weighs, from the loop)."""
        return [len(out) for out in self._out]

    def backlog_bytes(self, tp: TP) -> int:
        """Frame bytes of the partition waiting for a ring or in one."""
        return self._pending_bytes.get(tp, 0) + self._out_bytes.get(tp, 0)

    def total_backlog_bytes(self) -> int:
        return sum(self._pending_bytes.values()) + sum(self._out_bytes.values())

    def waiting_for_room(self) -> bool:
        """Batches are waiting for a worker: a result is what lets them go."""
        return bool(self._ready)

    def queued_records(self, w: int) -> int:
        return self._queued[w]


def _served(lane: Lane) -> int:
    return lane.served
