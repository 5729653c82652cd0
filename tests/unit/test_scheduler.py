"""The scheduler (runtime/supervisor/scheduling/scheduler.py): batch-level placement. A lane's batches in
rings are on one worker at a time and leave their lane in order (invariant 2), however
batches are completed, workers die or stop accepting; every backlogged lane makes progress;
lanes move to workers that have nothing to do."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.scheduling.capacity import Capacity
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.workers.workforce import NO_LIMIT


@dataclass
class Ring:
    capacity: int = 10_000
    frames: list[Batch] = field(default_factory=list)  # what the worker will run, in order
    full: bool = False

    def try_write(self, payload: bytes) -> bool:
        if self.full:
            return False
        self.frames.append(BATCHES[payload])
        return True

    def used_bytes(self) -> int:
        return sum(len(b.frame) for b in self.frames)

    def write_position(self) -> int:
        return 0

    def reader_reached(self, position: int) -> bool:
        return True


@dataclass
class Handle:
    index: int
    ring: Ring = field(default_factory=Ring)
    bell: Any = None


BATCHES: dict[bytes, Batch] = {}  # frame -> batch: the fake rings keep batches, not bytes


def batch(bid: int, tp: Any, bucket: int | None = None, count: int = 10,
          buckets: tuple[int, ...] | None = None) -> Batch:
    frame = f"frame-{bid}".encode()
    b = Batch(bid, tp, 0, 1, bid * 10, bid * 10 + count - 1, count, frame, bucket, buckets=buckets)
    BATCHES[frame] = b
    return b


def lanes_of(b: Batch) -> list[tuple[Any, Any]]:
    return [(b.tp, x) for x in b.buckets] if b.buckets else [(b.tp, b.bucket)]


class Rigged(Scheduler):
    """The scheduler as the loop drives it: each call handed the workforce's allowance, here
    any number of batches for every worker but the ``closed`` ones (``limit``: at most so many)."""

    def __init__(self, handles: list[Handle], ordered: bool) -> None:
        super().__init__(handles, ordered)
        self.closed: set[int] = set()
        self.limit: dict[int, int] = {}

    def allowance(self) -> list[int]:
        return [0 if i in self.closed else self.limit.get(i, NO_LIMIT) for i in range(len(self.handles))]

    def room(self) -> Capacity:
        """What the workers can take now, as the loop asks it before placing."""
        return self.capacity(self.allowance())

    def pending(self, tp: Any) -> int:
        return self.snapshot().pending.get(tp, 0)


def rig(workers: int, ordered: bool = True) -> tuple[Rigged, list[Handle], set[int]]:
    handles = [Handle(i) for i in range(workers)]
    s = Rigged(handles, ordered)
    return s, handles, s.closed


def run_first(s: Scheduler, h: Handle, busy_ms: float = 1.0) -> Batch:
    b = h.ring.frames.pop(0)
    assert s.returned(h.index, b.batch_id) is b
    s.learn(h.index, busy_ms, b.count)
    return b


def test_a_lane_goes_to_the_least_loaded_worker_and_stays_while_its_batches_are_out() -> None:
    s, hs, _ = rig(2)
    s.enqueue([batch(1, ("t", 0)), batch(2, ("t", 0)), batch(3, ("t", 0))])
    s.dispatch(s.room())
    assert [b.batch_id for b in hs[0].ring.frames] == [1, 2] and not hs[1].ring.frames
    assert s.pending(("t", 0)) == 1, "one running, one queued: the third waits in its lane"
    run_first(s, hs[0])
    s.dispatch(s.room())
    assert [b.batch_id for b in hs[0].ring.frames] == [2, 3], "its next batch follows it, in order"


def test_a_lane_never_has_batches_in_two_rings() -> None:
    s, hs, _ = rig(2)
    s.enqueue([batch(i, ("t", 0)) for i in range(1, 6)])
    for _ in range(8):
        s.dispatch(s.room())
        assert sum(1 for h in hs if h.ring.frames) <= 1
        for h in hs:
            if h.ring.frames:
                run_first(s, h)
    assert all(not h.ring.frames for h in hs) and s.pending(("t", 0)) == 0


def test_a_lane_leaves_a_busy_worker_for_a_hungry_one_between_batches() -> None:
    """Worker 0 serves lanes a and b; worker 1 comes free. Neither lane may have batches in
    two rings, so the first to drain moves; the other stays."""
    s, hs, closed = rig(2)
    a, b = ("t", 0), ("t", 1)
    closed.add(1)
    s.enqueue([batch(1, a), batch(2, b)])
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[0].ring.frames] == [1, 2]
    s.enqueue([batch(3, a), batch(4, b)])
    closed.discard(1)
    s.dispatch(s.room())
    assert not hs[1].ring.frames and s.pending(a) == s.pending(b) == 1, "a lane out on worker 0 waits"
    run_first(s, hs[0])  # a's batch 1 done: lane a has nothing out
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[1].ring.frames] == [3], "a moved to the worker with nothing to do"
    assert [x.batch_id for x in hs[0].ring.frames] == [2, 4], "b stayed: worker 0 serves only b now"


def test_a_worker_with_room_stops_taking_a_lane_when_another_worker_has_nothing_to_do() -> None:
    """Worker 0 has room for minutes of cheap work and serves two lanes; worker 1 comes free.
    Topping both lanes up on worker 0 would leave worker 1 idle for as long as the backlog
    lasts: the lanes stop growing there, and the first to drain moves."""
    s, hs, closed = rig(2)
    a, b = ("t", 0), ("t", 1)
    closed.add(1)
    s.learn(0, 0.01, 10)  # 1 µs per record: worker 0 has room for 20,000 records
    s.enqueue([batch(i, a) for i in range(1, 4)] + [batch(i, b) for i in range(4, 7)])
    s.dispatch(s.room())
    assert len(hs[0].ring.frames) == 6
    s.enqueue([batch(i, a) for i in range(7, 9)] + [batch(i, b) for i in range(9, 11)])
    closed.discard(1)
    s.dispatch(s.room())
    assert len(hs[0].ring.frames) == 6, "worker 0 takes no more while worker 1 has nothing to do"
    moved = []
    while not moved:
        run_first(s, hs[0], busy_ms=0.01)
        s.dispatch(s.room())
        moved = [x.batch_id for x in hs[1].ring.frames]
    assert moved[0] in (7, 9), f"the first lane to drain moved to worker 1: {moved}"


def test_round_robin_serves_every_backlogged_lane_on_one_worker() -> None:
    """Two partitions' backlogs on one worker: they alternate; neither waits for the other to
    drain (the old design drained a worker's partitions one after another)."""
    s, hs, _ = rig(1)
    a, b = ("t", 0), ("t", 1)
    s.enqueue([batch(i, a) for i in range(1, 11)])
    s.enqueue([batch(i, b) for i in range(11, 21)])
    order = []
    for _ in range(20):
        s.dispatch(s.room())
        order.append(run_first(s, hs[0]).tp)
    assert order[:6].count(a) == 3 and order[:6].count(b) == 3, order


def test_unordered_batches_go_to_whichever_worker_has_room() -> None:
    s, hs, _ = rig(3, ordered=False)
    s.enqueue([batch(i, ("t", 0)) for i in range(1, 7)])
    s.dispatch(s.room())
    assert [len(h.ring.frames) for h in hs] == [2, 2, 2], "one partition spread over every worker"


def test_a_worker_not_accepting_gets_nothing_and_a_dead_workers_batches_go_back_in_order() -> None:
    s, hs, closed = rig(2)
    s.enqueue([batch(1, ("t", 0)), batch(2, ("t", 0))])
    s.dispatch(s.room())
    worker = 0 if hs[0].ring.frames else 1
    lost = s.take_all(worker)
    hs[worker].ring.frames.clear()
    closed.add(worker)
    s.requeue(lost)
    s.dispatch(s.room())
    other = 1 - worker
    assert [b.batch_id for b in hs[other].ring.frames] == [1, 2]


def test_a_ring_holds_no_more_batches_than_the_workforce_allows_and_the_rest_wait() -> None:
    """The workforce's allowance (a worker's max_batches budget left) bounds what its ring holds:
    counted against the batches in it, so a result lets the next one go."""
    s, hs, _ = rig(1, ordered=False)
    s.limit[0] = 1
    s.enqueue([batch(1, ("t", 0)), batch(2, ("t", 0))])
    assert s.room().spare is False, "a batch waits: nothing more to cut for"
    s.dispatch(s.room())
    assert [b.batch_id for b in hs[0].ring.frames] == [1] and s.waiting_for_room()
    assert not s.room().hungry, "a worker at its allowance is not hungry"
    run_first(s, hs[0])
    s.dispatch(s.room())
    assert [b.batch_id for b in hs[0].ring.frames] == [2]
    s.limit[0] = 0
    run_first(s, hs[0])
    assert not s.room().spare, "no room where nothing is allowed"


def test_forgetting_a_partition_drops_its_lanes_and_late_results() -> None:
    s, _hs, _ = rig(1)
    s.enqueue([batch(1, ("t", 0)), batch(2, ("t", 0)), batch(3, ("t", 0))])
    s.dispatch(s.room())
    s.forget(("t", 0))
    assert not s.has_out(("t", 0)) and s.pending(("t", 0)) == 0 and s.count(0) == 0
    assert s.returned(0, 1) is None, "a result of a forgotten partition counts for nothing"


def test_learnt_cost_lets_a_worker_queue_a_few_milliseconds_of_work_and_no_more() -> None:
    s, hs, _ = rig(1)
    s.enqueue([batch(i, ("t", 0), count=10) for i in range(1, 30)])
    s.dispatch(s.room())
    run_first(s, hs[0], busy_ms=1.0)  # 100 µs per record: 20 ms is 200 records, 20 batches
    s.dispatch(s.room())
    assert 15 <= len(hs[0].ring.frames) <= 21, len(hs[0].ring.frames)


def test_old_code_is_preferred_while_it_has_room_and_a_lane_never_goes_back_to_older_code() -> None:
    """A reload runs old and new workers side by side: lanes stay on the old code while it has
    room (no rush onto the first new worker), and a lane that ran on new code never runs on
    older code again (its records never see an old version after a new one)."""
    s, hs, closed = rig(3)
    s.new_worker(0, 1)
    s.new_worker(1, 1)
    s.new_worker(2, 2)
    a, b = ("t", 0), ("t", 1)
    s.enqueue([batch(1, a)])
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[0].ring.frames] == [1], "the old code first, though both are idle"
    run_first(s, hs[0])
    closed.update({0, 1})  # the old workers retire
    s.enqueue([batch(2, a)])
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[2].ring.frames] == [2], "the lane moves to the new code"
    run_first(s, hs[2])
    closed.clear()
    closed.add(2)
    s.enqueue([batch(3, a), batch(4, b)])
    s.dispatch(s.room())
    assert s.pending(a) == 1, "never back to the old code, however idle it is"
    assert [x.batch_id for x in hs[0].ring.frames] == [4], "a lane that never ran new code may"
    s.lower_floors(1)  # the reload was rolled back: no new worker any more
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[1].ring.frames] == [3]


def test_a_worker_on_probation_gets_a_lane_under_steady_load_once_it_takes_frames() -> None:
    """A reload's first new worker must finish a batch to pass. Under steady load every lane
    always has a batch out on an old worker, so one lane drains (only once the probe takes
    frames) and goes to the probe; the other lanes stay where they are."""
    s, hs, closed = rig(3)
    s.new_worker(0, 1)
    s.new_worker(1, 1)
    a, b = ("t", 0), ("t", 1)
    bid = iter(range(1, 1000))
    closed.add(2)  # no worker in slot 2 yet
    s.enqueue([batch(next(bid), tp) for tp in (a, b) for _ in range(3)])
    s.dispatch(s.room())  # each lane on an old worker, two batches out, one waiting
    assert len(hs[0].ring.frames) == len(hs[1].ring.frames) == 2
    s.new_worker(2, 2, probe=True)  # starting: takes no frames yet
    for _ in range(3):  # steady load: every batch done is replaced by a new one
        for h in hs[:2]:
            done = run_first(s, h)
            s.enqueue([batch(next(bid), done.tp)])
        s.dispatch(s.room())
        assert not hs[2].ring.frames and all(len(h.ring.frames) >= 2 for h in hs[:2]), \
            "no lane drains for a probe that takes no frames"
    closed.discard(2)  # ready
    for _ in range(3):
        for h in hs[:2]:
            if h.ring.frames:
                done = run_first(s, h)
                s.enqueue([batch(next(bid), done.tp)])
        s.dispatch(s.room())
        if hs[2].ring.frames:
            break
    assert hs[2].ring.frames, "the probe was given a lane"
    (moved,) = {x.tp for x in hs[2].ring.frames}
    assert all(x.tp != moved for h in hs[:2] for x in h.ring.frames), "a lane is in one ring at a time"
    assert any(h.ring.frames for h in hs[:2]), "the other lane stayed on the old code"


def test_a_hungry_worker_on_new_code_does_not_make_lanes_leave_the_old_code() -> None:
    s, hs, closed = rig(2)
    s.new_worker(0, 1)
    s.new_worker(1, 2)
    a, b = ("t", 0), ("t", 1)
    closed.add(1)
    s.enqueue([batch(1, a), batch(2, b)])
    s.dispatch(s.room())
    s.enqueue([batch(3, a), batch(4, b)])
    closed.discard(1)
    run_first(s, hs[0])
    s.dispatch(s.room())
    assert not hs[1].ring.frames and [x.batch_id for x in hs[0].ring.frames][:2] == [2, 3], \
        "the lanes stay on worker 0: the old code has room"


def test_a_refused_frame_tries_another_worker_in_the_same_round() -> None:
    s, hs, _ = rig(2)
    hs[0].ring.full = True
    s.enqueue([batch(1, ("t", 0))])
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[1].ring.frames] == [1]


class Scheduling(RuleBasedStateMachine):
    """Random enqueues, completions, deaths and workers closing: a lane's batches in rings
    are always in one ring, in lane order, and every batch runs."""

    @initialize(workers=st.integers(1, 4), ordered=st.booleans())
    def setup(self, workers: int, ordered: bool) -> None:
        self.s, self.hs, self.closed = rig(workers, ordered)
        self.ordered = ordered
        self.next_id = 1
        self.enqueued: dict[tuple[Any, Any], list[int]] = {}
        self.finished: set[int] = set()
        self.ran: dict[tuple[Any, Any], list[int]] = {}
        self.sent: dict[tuple[Any, Any], list[int]] = {}  # lane -> generation of each worker it was sent to
        self.newest = 0
        sent = self.s._lane_sent

        def record(w: int, lane: Any, b: Batch, allowance: Any) -> None:
            self.sent.setdefault(lane.key, []).append(self.s._gen[w])
            sent(w, lane, b, allowance)
        self.s._lane_sent = record  # type: ignore[method-assign]

    @rule(tp=st.integers(0, 2), bucket=st.sampled_from([None, 0, 1, 2, (0, 1), (1, 2)]), n=st.integers(1, 4))
    def enqueue(self, tp: int, bucket: int | tuple[int, int] | None, n: int) -> None:
        """A tuple: one frame holding several key buckets' records (key ordering's small cuts)."""
        batches = []
        for _ in range(n):
            if isinstance(bucket, tuple):
                b = batch(self.next_id, ("t", tp), bucket[0], buckets=bucket)
            else:
                b = batch(self.next_id, ("t", tp), bucket)
            batches.append(b)
            for key in lanes_of(b):
                self.enqueued.setdefault(key, []).append(self.next_id)
            self.next_id += 1
        self.s.enqueue(batches)

    @rule()
    def dispatch(self) -> None:
        self.s.dispatch(self.s.room())

    @rule(w=st.integers(0, 3), cost=st.floats(0.0, 50.0))
    def complete(self, w: int, cost: float) -> None:
        if w < len(self.hs) and self.hs[w].ring.frames:
            b = run_first(self.s, self.hs[w], cost)
            self.finished.add(b.batch_id)
            for key in lanes_of(b):
                self.ran.setdefault(key, []).append(b.batch_id)

    @rule(w=st.integers(0, 3))
    def finish_all(self, w: int) -> None:
        """Worker w runs everything in its ring (its lanes have nothing out any more)."""
        while w < len(self.hs) and self.hs[w].ring.frames:
            self.complete(w, 1.0)

    @rule(w=st.integers(0, 3), newer=st.booleans(), probe=st.booleans())
    def new_code(self, w: int, newer: bool, probe: bool) -> None:
        """Worker w is replaced by one running the newest code (or newer still): a reload,
        whose first new worker is on probation (it gets a lane at once)."""
        if w < len(self.hs):
            self.die(w)
            self.newest += newer
            self.s.new_worker(w, self.newest, probe=probe)

    @rule(w=st.integers(0, 3))
    def die(self, w: int) -> None:
        if w < len(self.hs):
            lost = self.s.take_all(w)
            assert [b.batch_id for b in lost] == [b.batch_id for b in self.hs[w].ring.frames]
            self.hs[w].ring.frames.clear()
            self.s.requeue(lost)

    @rule(w=st.integers(0, 3), accepting=st.booleans())
    def accept(self, w: int, accepting: bool) -> None:
        if w < len(self.hs) - 1:  # one worker always accepts
            (self.closed.discard if accepting else self.closed.add)(w)

    @invariant()
    def lanes_are_in_one_ring_in_order(self) -> None:
        for key in self.enqueued:
            rings = [[b.batch_id for b in h.ring.frames if key in lanes_of(b)] for h in self.hs]
            holding = [r for r in rings if r]
            if self.ordered:
                assert len(holding) <= 1, f"lane {key} in {len(holding)} rings"
                for r in holding:
                    assert r == sorted(r), f"lane {key} out of order in a ring: {r}"

    @invariant()
    def counts_match_the_rings(self) -> None:
        for h in self.hs:
            assert self.s.count(h.index) == len(h.ring.frames)

    @invariant()
    def ordered_lanes_run_in_order(self) -> None:
        if self.ordered:
            for key, ids in self.ran.items():
                assert ids == sorted(ids), f"lane {key} ran out of order: {ids}"

    @invariant()
    def no_lane_goes_back_to_older_code(self) -> None:
        """In the order batches are sent (which is the order they run, in an ordered lane)."""
        for key, gens in self.sent.items():
            assert gens == sorted(gens), f"lane {key} sent to older code after newer: {gens}"

    def teardown(self) -> None:
        # Drain: every batch enqueued runs, with the workers that accept.
        self.closed.clear()
        for _ in range(10_000):
            self.s.dispatch(self.s.room())
            progressed = False
            for h in self.hs:
                if h.ring.frames:
                    b = run_first(self.s, h)
                    self.finished.add(b.batch_id)
                    progressed = True
            if not progressed:
                break
        every = {i for ids in self.enqueued.values() for i in ids}
        assert every <= self.finished, f"never ran: {sorted(every - self.finished)[:10]}"


TestScheduling = Scheduling.TestCase
TestScheduling.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_lane_does_not_join_a_worker_with_far_more_work_left() -> None:
    """A hot partition's worker with room now is not joined by a lane with nothing out: that
    would halve the hot lane's speed for a batch's worth of wait elsewhere."""
    s, hs, _closed = rig(2)
    hot, cold, other = ("t", 0), ("t", 1), ("t", 2)
    s.set_behind({hot: 100_000})
    s.enqueue([batch(1, hot, count=100), batch(2, other, count=100)])
    s.dispatch(s.room())
    assert [x.batch_id for x in hs[0].ring.frames] == [1] and [x.batch_id for x in hs[1].ring.frames] == [2]
    s.enqueue([batch(3, other, count=100), batch(4, other, count=100)])
    s.dispatch(s.room())  # worker 1: a batch running, one queued (no room)
    s.enqueue([batch(5, cold, count=100)])
    s.dispatch(s.room())
    assert 5 not in [x.batch_id for x in hs[0].ring.frames], "cold waits rather than share the hot worker"
    run_first(s, hs[1])
    s.dispatch(s.room())
    assert 5 in [x.batch_id for x in hs[1].ring.frames]


def test_ties_between_idle_workers_are_taken_in_turn() -> None:
    """Issue 24, gap 4: with every worker equally idle, lanes did not all go to worker 0, 1, 2."""
    s, hs, _closed = rig(4, ordered=False)
    s.enqueue([batch(i, ("t", i)) for i in range(1, 5)])
    s.dispatch(s.room())
    assert [len(h.ring.frames) for h in hs] == [1, 1, 1, 1]
    for h in hs:
        run_first(s, h)
    s.enqueue([batch(9, ("t", 9))])
    s.dispatch(s.room())
    assert [len(h.ring.frames) for h in hs] == [1, 0, 0, 0], "after worker 3, the turn is worker 0's"
    run_first(s, hs[0])
    s.enqueue([batch(10, ("t", 10))])
    s.dispatch(s.room())
    assert [len(h.ring.frames) for h in hs] == [0, 1, 0, 0], "then worker 1's, not worker 0 again"


def test_a_frame_of_several_buckets_waits_to_head_each_of_its_lanes_on_one_worker() -> None:
    """Key ordering's small cut is one frame of several buckets (intake.py): it goes after each
    of its lanes' earlier batches, and only to the one worker those lanes are out on."""
    s, hs, _ = rig(2)
    s.enqueue([batch(1, ("t", 0), 0), batch(2, ("t", 0), 1)])
    s.dispatch(s.room())
    assert {b.batch_id for b in hs[0].ring.frames} | {b.batch_id for b in hs[1].ring.frames} == {1, 2}
    assert hs[0].ring.frames and hs[1].ring.frames, "two lanes, two idle workers: one each"
    s.enqueue([batch(3, ("t", 0), 0, buckets=(0, 1)), batch(4, ("t", 0), 0)])
    s.dispatch(s.room())
    assert len(hs[0].ring.frames) == len(hs[1].ring.frames) == 1, "its lanes are out on two workers"
    assert s.pending(("t", 0)) == 2, "and the lane's next batch waits behind it"
    run_first(s, hs[0])
    s.dispatch(s.room())
    assert not hs[0].ring.frames, "not to the idle worker: one of its lanes is still out on the other"
    assert [b.batch_id for b in hs[1].ring.frames][-1] == 3
    while hs[1].ring.frames:
        run_first(s, hs[1])
    s.dispatch(s.room())
    assert [b.batch_id for h in hs for b in h.ring.frames] == [4], "then lane 0 goes on"
