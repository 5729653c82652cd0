"""runtime.supervisor.control.rollout: reload and resize, driven tick by tick with the real workforce and
scheduler over fake processes and one fake clock. A reload's first new worker is a canary: if
it cannot start, nothing else changed; otherwise the old workers go one at a time, the pool
never runs fewer workers than it aims at, and no lane goes back to older code."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import ProcPool, TickClock

import runtime.transport.board as board_mod
from runtime.config import Settings
from runtime.errors import ConfigError
from runtime.supervisor.control.rollout import OpKind, OpState, Rollout, not_applied
from runtime.supervisor.scheduling.batches import Batch
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import PluginCode
from runtime.supervisor.workers.workforce import Death, State, Workforce
from runtime.transport.board import PHASE_CALL
from runtime.transport.frames import STOP_FRAME


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[TickClock]:
    c = TickClock()
    monkeypatch.setattr(board_mod, "time", SimpleNamespace(monotonic_ns=c.ns))
    yield c


def settings(**workers: Any) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 2, "restart_backoff_s": 1.0, **workers}})


class FakeFlow:
    def __init__(self) -> None:
        self.sizes: list[int] = []

    def resize(self, workers: int) -> None:
        self.sizes.append(workers)


@dataclass
class Rig:
    s: Settings
    clock: TickClock
    pool: ProcPool
    wf: Workforce
    sched: Scheduler
    flow: FakeFlow
    rollout: Rollout
    deaths: list[Death] = field(default_factory=list)
    finished: list[Any] = field(default_factory=list)
    accepting_seen: list[int] = field(default_factory=list)  # workers taking batches, each tick
    alive_seen: list[int] = field(default_factory=list)

    def tick(self, dt: float = 0.05) -> None:
        self.clock.now += dt
        self.deaths += self.wf.manage(self.wf.dead(), self.sched.counts())
        for i in self.wf.stops_due():  # as the loop hands them on (loop.py manage_workers)
            if self.sched.write_stop(i):
                self.wf.stop_written(i)
        op = self.rollout.step()
        if op is not None:
            self.finished.append(op)
        self.accepting_seen.append(sum(self.accepting(h.index) for h in self.pool.handles))
        self.alive_seen.append(sum(h.alive for h in self.pool.handles))

    def accepting(self, i: int) -> bool:
        """Would the scheduler write a frame to worker i's ring now (as the loop drives it)?"""
        return self.sched.count(i) < self.wf.allowance()[i]

    def ready(self, i: int, version: str) -> None:
        """Worker i's plugin started (HELLO) and it is ready."""
        h = self.pool.handles[i]
        self.wf.on_hello(h, version)  # type: ignore[arg-type]
        h.board.set_ready()

    def stopped_by_frame(self, i: int) -> bool:
        return STOP_FRAME in self.pool.handles[i].ring.frames

    def first_batch(self, i: int) -> None:
        """Worker i finishes a batch (what a reload's canary waits for)."""
        board = self.pool.handles[i].board
        board.begin(1, 0)
        board.end(10)

    def run_until(self, cond: Any, ticks: int = 200) -> None:
        for _ in range(ticks):
            if cond():
                return
            self.tick()
            for h in self.pool.handles:  # workers do what they are told: start, run a batch, read STOP
                life = self.wf.lives[h.index]
                if h.alive and life.state is State.STARTING and not h.board.ready:
                    gen = life.code.generation if life.code else 0
                    self.ready(h.index, f"v{gen}")
                elif h.alive and life.probation and h.board.ready and not h.board.batches:
                    self.first_batch(h.index)
                if h.alive and STOP_FRAME in h.ring.frames:
                    h.ring.frames.clear()
                    self.pool.exit(h.index, 0)
        raise AssertionError("condition not reached")


def rig(clock: TickClock, reread: Any = "same", **workers: Any) -> Rig:
    s = settings(**workers)
    pool = ProcPool(s.workers.processes, clock, max_slots=s.workers.process_limit + 1)
    wf = Workforce(s.workers, s.output.delivery_timeout_s, pool, clock)  # type: ignore[arg-type]
    sched = Scheduler(pool.handles, ordered=True, slots=pool.max_slots)  # type: ignore[arg-type]
    flow = FakeFlow()
    again = (lambda: settings(**{**workers, "settings": {"v": 2}})) if reread == "same" else reread
    r = Rig(s, clock, pool, wf, sched, flow, Rollout(s, wf, sched, flow, again, clock,  # type: ignore[arg-type]
                                                    wall=lambda: 1_700_000_000.0))
    wf.start_all()
    for i in range(s.workers.processes):
        r.ready(i, "v1")
    r.tick()
    return r


# ---------------------------------------------------------------------- reload
def test_a_reload_starts_one_canary_then_replaces_the_old_workers_one_at_a_time(clock: TickClock) -> None:
    r = rig(clock, processes=3)
    op = r.rollout.reload("test")
    canary = 3
    assert r.pool.spawned[-1] == canary, "the first new worker goes to a spare slot, beside the old ones"
    code = r.pool.codes[canary]
    assert isinstance(code, PluginCode) and code.generation == 2 and code.settings == {"v": 2}
    for _ in range(5):
        r.tick()
    assert not any(r.stopped_by_frame(i) for i in range(3)), "no old worker goes before the canary is ready"
    assert r.rollout.code.generation == 1 and op.state is OpState.RUNNING
    r.run_until(lambda: bool(r.finished))
    assert r.finished == [op] and op.ok, op.message
    assert op.from_version == "v1" and op.to_version == "v2"
    assert "3 workers run plugin 'workers.enrich' version v2 (was v1)" in op.message
    in_use = r.wf.in_use()
    assert len(in_use) == 3 and all(r.wf.lives[i].code.generation == 2 for i in in_use)  # type: ignore[union-attr]
    assert min(r.accepting_seen) >= 3, "never fewer workers taking batches than the pool aims at"
    assert max(r.alive_seen) <= 4, "at most one worker more than the pool while replacing"
    assert r.rollout.code.generation == 2 and r.rollout.version == "v2"
    assert not r.deaths or all(d.crashed_batch is None for d in r.deaths)
    assert all(r.wf.lives[i].restarts == 0 for i in range(4)), "a replacement is not a restart"


def test_a_canary_that_cannot_start_is_rolled_back_and_the_old_workers_never_stop(clock: TickClock) -> None:
    r = rig(clock)
    op = r.rollout.reload("test")
    canary = 2
    why = "plugin 'workers.enrich' setup() failed: RuntimeError: no model file"
    r.wf.on_fatal_report(r.pool.handles[canary], why)  # type: ignore[arg-type]
    r.pool.exit(canary, 1)
    r.tick()
    assert r.finished == [op] and op.state is OpState.FAILED
    assert why in op.message and "rolled back" in op.message and "version v1" in op.message
    assert r.rollout.code.generation == 1 and r.rollout.version == "v1", "the daemon keeps its old code"
    assert not any(r.stopped_by_frame(i) for i in range(2)) and not r.pool.kills
    assert all(r.accepting(i) for i in range(2))
    clock.now += 100
    r.tick()
    assert r.wf.lives[canary].state is State.SPARE and r.pool.spawned.count(canary) == 1, "not restarted"
    assert r.wf.fatal is None and r.rollout.outcomes == {"reload failed": 1}


def test_a_canary_that_dies_on_its_first_batch_is_rolled_back_and_the_batch_counts_no_crash(
        clock: TickClock) -> None:
    r = rig(clock)
    op = r.rollout.reload("test")
    canary = 2
    for old in (0, 1):
        r.sched.learn(old, 0.01, 10)  # fast old workers: room for all the batches below
    # Under load: batches wait in their lanes when the canary becomes ready.
    r.sched.enqueue([Batch(bid, ("t", bid), 0, 1, 10, 19, 10, b"f%d" % bid, None) for bid in range(3, 8)])
    r.ready(canary, "v2")
    r.tick()
    assert r.wf.lives[canary].probation, "ready, but it has not run a batch while batches wait"
    r.sched.dispatch(r.sched.capacity(r.wf.allowance()))
    assert r.sched.count(canary) == 1, \
        "ready: it is given a lane at once (its probe), though the old code has room for them all"
    b = next(iter(r.sched._out[canary].values()))
    r.tick()
    assert r.wf.lives[canary].probation, "its first batch is not done: still on probation"
    r.pool.handles[canary].board.begin(b.batch_id, 0)  # in the plugin ...
    assert r.pool.handles[canary].board.phase == PHASE_CALL
    r.pool.exit(canary, -11)  # ... and it segfaults
    r.tick()
    assert op.state is OpState.FAILED and "killed by SIGSEGV" in op.message
    assert [d.crashed_batch for d in r.deaths] == [None], "the new code's fault, not the record's"
    assert r.rollout.code.generation == 1


def test_a_canary_that_passed_and_crashes_later_is_restarted_and_the_reload_goes_on(clock: TickClock) -> None:
    r = rig(clock)
    op = r.rollout.reload("test")
    canary = 2
    r.ready(canary, "v2")
    r.first_batch(canary)
    r.tick()
    assert r.rollout.code.generation == 2, "passed: ready and its first batch done"
    r.pool.exit(canary, 13)
    r.tick()
    assert r.wf.lives[canary].state is State.RESTARTING and op.state is OpState.RUNNING
    r.run_until(lambda: bool(r.finished))
    assert op.ok and r.pool.codes[canary].generation == 2, "restarted with the new code"


def test_with_no_traffic_the_canary_waits_for_a_batch_and_the_old_workers_keep_running(
        clock: TickClock) -> None:
    """Issue 28: with no traffic a reload replaced every old worker without the canary ever
    running a batch, so a plugin that crashes on its first record reached every worker."""
    r = rig(clock)
    op = r.rollout.reload("test")
    canary = 2
    r.ready(canary, "v2")
    for _ in range(200):  # ten seconds of an idle topic
        r.tick()
    assert op.state is OpState.RUNNING and r.rollout.code.generation == 1, "setup() alone proves nothing"
    assert "waits for its first batch" in op.message and "old workers keep running" in op.message
    assert not any(r.stopped_by_frame(i) for i in range(2)) and all(r.accepting(i) for i in range(2))
    assert r.wf.lives[canary].probation
    # the first record comes, and the new code crashes on it: rolled back, nothing else changed
    r.pool.handles[canary].board.begin(7, 0)
    r.pool.exit(canary, -11)
    r.tick()
    assert op.state is OpState.FAILED and "rolled back" in op.message
    assert r.rollout.code.generation == 1 and all(r.accepting(i) for i in range(2))
    assert [d.crashed_batch for d in r.deaths] == [None], "the new code's fault, not the record's"


def test_an_idle_canary_that_finishes_its_first_batch_lets_the_reload_go_on(clock: TickClock) -> None:
    r = rig(clock)
    op = r.rollout.reload("test")
    r.ready(2, "v2")
    for _ in range(20):
        r.tick()
    assert op.state is OpState.RUNNING
    r.first_batch(2)
    r.run_until(lambda: bool(r.finished))
    assert op.ok and r.rollout.code.generation == 2


def test_a_config_that_cannot_be_read_fails_the_reload_and_starts_nothing(clock: TickClock) -> None:
    def broken() -> Settings:
        raise ConfigError("config 'x.toml': workers.batch_max_records: Input should be greater than or "
                          "equal to 1")
    r = rig(clock, reread=broken)
    spawned = list(r.pool.spawned)
    op = r.rollout.reload("SIGHUP")
    assert op.state is OpState.FAILED and "workers.batch_max_records" in op.message
    assert r.pool.spawned == spawned and not r.rollout.busy


def test_a_reload_before_the_daemon_is_ready_is_refused(clock: TickClock) -> None:
    s = settings()
    pool = ProcPool(2, clock)
    wf = Workforce(s.workers, s.output.delivery_timeout_s, pool, clock)  # type: ignore[arg-type]
    wf.start_all()
    sched = Scheduler(pool.handles, ordered=True, slots=3)  # type: ignore[arg-type]
    rollout = Rollout(s, wf, sched, FakeFlow(), lambda: s, clock)  # type: ignore[arg-type]
    op = rollout.reload("test")
    assert op.state is OpState.FAILED and "still starting" in op.message


def test_the_reply_names_changed_settings_a_reload_does_not_apply() -> None:
    old = settings(processes=2)
    new = settings(processes=4, plugin="workers.fingerprint", settings={"k": 1}, ring_bytes=2**20)
    assert not_applied(old, new, target=2) == ["workers.processes (use ringmaster scale; 2 run now)",
                                               "workers.ring_bytes"]
    assert not_applied(old, settings(processes=3), target=3) == [], "processes already what runs"


# ---------------------------------------------------------------------- resize
def test_scaling_up_starts_the_missing_workers_at_once_and_waits_for_them(clock: TickClock) -> None:
    r = rig(clock, max_processes=5)
    op = r.rollout.scale(5, "test")
    r.tick()
    assert sorted(r.pool.spawned[-3:]) == [2, 3, 4] and r.flow.sizes == [5]
    assert op.state is OpState.RUNNING
    r.run_until(lambda: bool(r.finished))
    assert op.ok and op.message == "resized from 2 to 5 workers" and len(r.wf.in_use()) == 5


def test_a_new_worker_that_cannot_start_is_not_retried_and_the_resize_says_so(clock: TickClock) -> None:
    r = rig(clock, max_processes=4)
    op = r.rollout.scale(4, "test")
    r.tick()
    r.wf.on_fatal_report(r.pool.handles[3], "plugin 'workers.enrich' setup() failed: OSError: too many files")  # type: ignore[arg-type]
    r.pool.exit(3, 1)
    r.run_until(lambda: bool(r.finished))
    assert op.state is OpState.FAILED and "to 3 workers, not 4" in op.message
    assert "too many files" in op.message
    assert r.rollout.target == 3 and r.flow.sizes == [4, 3]
    clock.now += 100
    r.tick()
    assert r.wf.lives[3].state is State.SPARE and r.pool.spawned.count(3) == 1


def test_scaling_down_lets_the_removed_workers_drain_before_they_stop(clock: TickClock) -> None:
    r = rig(clock, processes=3)
    busy = Batch(1, ("t", 0), 0, 1, 0, 9, 10, b"f1", None)
    r.sched.enqueue([busy])
    r.sched.dispatch(r.sched.capacity(r.wf.allowance()))
    holder = next(i for i in range(3) if r.sched.count(i))
    op = r.rollout.scale(1, "SIGTTOU")
    r.tick()
    retiring = [i for i in range(3) if r.wf.lives[i].retiring]
    assert len(retiring) == 2 and holder not in retiring, "the worker with work queued stays"
    assert not any(r.accepting(i) for i in retiring), "no frame goes in before the STOP frame"
    r.tick()  # the STOP frames are due: the scheduler writes them on the next tick
    for i in retiring:
        assert r.pool.handles[i].ring.frames[-1] == STOP_FRAME and not r.accepting(i)
        assert not r.pool.kills, "drained, not killed"
    r.run_until(lambda: bool(r.finished))
    assert op.ok and op.message == "resized from 3 to 1 workers" and r.wf.in_use() == [holder]
    assert all(r.wf.lives[i].state is State.SPARE for i in retiring) and r.flow.sizes == [1]


def test_a_size_out_of_bounds_is_refused_in_one_line(clock: TickClock) -> None:
    r = rig(clock, max_processes=3)
    op = r.rollout.scale(4, "ringmaster scale")
    assert op.state is OpState.FAILED and "workers.max_processes is 3" in op.message
    assert "\n" not in op.message
    assert r.rollout.scale(0, "SIGTTOU").state is OpState.FAILED
    assert r.flow.sizes == [] and r.rollout.target == 2


def test_a_resize_that_finds_no_room_for_a_ring_says_why(clock: TickClock) -> None:
    r = rig(clock, max_processes=4)
    r.pool.no_room = "cannot add worker slot 3: /dev/shm has 1 MiB free but the rings need 8 MiB"
    op = r.rollout.scale(4, "test")
    r.run_until(lambda: bool(r.finished))
    assert op.state is OpState.FAILED and "/dev/shm has 1 MiB free" in op.message
    assert len(r.wf.in_use()) == r.rollout.target == 2 and r.flow.sizes == [4, 2]


def test_generations_are_never_reused_after_a_rollback(clock: TickClock) -> None:
    r = rig(clock)
    r.rollout.reload("test")
    r.pool.exit(2, 1)
    r.tick()
    r.rollout.reload("test")
    assert r.pool.codes[2].generation == 3, "a new generation: frames of the failed one mean nothing"
    assert r.rollout.last[OpKind.RELOAD].state is OpState.RUNNING


# ---------------------------------------------------------------------- the loop's part
def test_the_loop_hands_reload_and_resize_signals_to_the_commands_and_keeps_running() -> None:
    from fakes import make

    sup, _consumer, _clock, _pool = make(workers=2, max_processes=6)
    for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGTTIN):
        sup.signals.queue.put(sig)
    sup.handle_signals()
    assert not sup.stopping, "SIGHUP, SIGTTIN and SIGTTOU do not stop the daemon"
    assert [(c.kind, c.change) for c in sup.commands.queue] == [(OpKind.RELOAD, 0), (OpKind.SCALE, 1)]
    assert sup.intake.buckets == 6, "key lanes per partition: max_processes, fixed for the run"
    sup.signals.queue.put(signal.SIGTERM)
    sup.handle_signals()
    assert sup.stopping
