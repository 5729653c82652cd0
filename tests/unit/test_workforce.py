"""runtime.supervisor.workers.workforce.Workforce, the worker lifecycle policy, driven by a fake pool and one
fake clock (the supervisor's and the boards'). A worker's end is judged by what it reported
and what it was doing, never by its exit status."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import ProcPool as FakePool
from fakes import TickClock as Clock

import runtime.transport.board as board_mod
from runtime.config import Settings
from runtime.errors import PluginError, WorkerCrashLoop
from runtime.supervisor.workers.workforce import Death, State, Workforce
from runtime.transport.board import (
    PHASE_CALL,
    PHASE_COMMIT,
    PHASE_DELIVER,
    PHASE_IDLE,
    PHASE_OFFSETS,
    PHASE_WAIT,
)
from runtime.transport.frames import STOP_FRAME


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    # The boards read time themselves: give them the same fake clock.
    monkeypatch.setattr(board_mod, "time", SimpleNamespace(monotonic_ns=c.ns))
    yield c


def settings(**workers: Any) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": workers.pop("processes", 1), **workers},
    })


@dataclass
class Rig:
    wf: Workforce
    pool: FakePool
    clock: Clock
    out: dict[int, set[int]]  # worker -> batch ids in its ring (the scheduler's count)
    drained: list[int] = field(default_factory=list)

    def manage(self) -> list[Death]:
        """One tick as the loop runs it (loop.py manage_workers): the dead are drained first,
        then reaped; the STOP frames due are written (here straight to the fake rings; the
        scheduler's write_stop in the daemon)."""
        dead = self.wf.dead()
        self.drained += [h.index for h in dead]
        deaths = self.wf.manage(dead, [len(self.out.get(i, ())) for i in range(self.pool.max_slots)])
        for i in self.wf.stops_due():
            if self.pool.handles[i].ring.try_write(STOP_FRAME):
                self.wf.stop_written(i)
        return deaths

    def at(self, t: float) -> list[Death]:
        """Advance the clock to start + t and run one tick."""
        self.clock.now = 1000.0 + t
        return self.manage()

    def accepting(self, i: int) -> bool:
        """Would the scheduler write a frame to worker i's ring now (the loop hands it the
        workforce's allowance, counted against the batches in that ring)?"""
        return len(self.out[i]) < self.wf.allowance()[i]

    def life(self, i: int = 0) -> Any:
        return self.wf.lives[i]

    def ready(self, i: int = 0) -> None:
        self.pool.handles[i].board.set_ready()
        self.manage()
        assert self.life(i).state is State.READY


def rig(clock: Clock, **workers: Any) -> Rig:
    s = settings(**workers)
    pool = FakePool(s.workers.processes, clock)
    out: dict[int, set[int]] = {i: set() for i in range(s.workers.processes)}
    wf = Workforce(s.workers, s.output.delivery_timeout_s, pool, clock)  # type: ignore[arg-type]
    wf.start_all()
    return Rig(wf, pool, clock, out)


# ---------------------------------------------------------------------- start failures
def test_a_plugin_that_says_why_it_cannot_start_stops_the_daemon_after_start_attempts(clock: Clock) -> None:
    r = rig(clock, start_attempts=2, restart_backoff_s=1.0)
    why = "cannot import plugin 'workers.nope': ModuleNotFoundError: No module named 'workers.nope'"
    h = r.pool.handles[0]
    assert r.pool.spawned == [0] and r.life().state is State.STARTING
    r.wf.on_fatal_report(h, why)  # type: ignore[arg-type]
    r.pool.exit(0, 1)
    deaths = r.at(0.1)
    assert deaths == [Death(0, None, "exited with status 1")]
    assert r.drained == [0], "the dead worker's last results are read first"
    assert r.wf.fatal is None, "one failure of two allowed"
    assert r.life().state is State.RESTARTING and r.life().restart_at == pytest.approx(1001.1)
    assert r.life().start_failure == why
    r.at(1.0)
    assert r.pool.spawned == [0], "no restart before the back-off is over"
    r.at(1.2)
    assert r.pool.spawned == [0, 0] and h.incarnation == 2 and r.life().restarts == 1
    r.wf.on_fatal_report(h, why)  # type: ignore[arg-type]
    r.pool.exit(0, 1)
    r.at(1.3)
    fatal = r.wf.fatal
    assert isinstance(fatal, PluginError) and fatal.exit_code == 3
    assert why in str(fatal) and "2 attempts" in str(fatal)
    r.at(100)
    assert r.pool.spawned == [0, 0], "nothing restarts once the daemon is stopping for good"


def test_start_failures_below_start_attempts_back_off_then_the_last_one_is_fatal(clock: Clock) -> None:
    r = rig(clock, start_attempts=3, restart_backoff_s=0.5)
    h = r.pool.handles[0]
    for n in range(2):
        r.wf.on_fatal_report(h, f"setup() failed: attempt {n}")  # type: ignore[arg-type]
        r.pool.exit(0, 1)
        r.at(n * 10.0)
        assert r.wf.fatal is None
        assert r.life().state is State.RESTARTING
        assert r.life().restart_at == pytest.approx(1000 + n * 10.0 + 0.5 * 2**n)
        r.at(n * 10.0 + 5)
        assert r.life().state is State.STARTING
    r.wf.on_fatal_report(h, "setup() failed: attempt 2")  # type: ignore[arg-type]
    r.pool.exit(0, 1)
    r.at(30)
    assert isinstance(r.wf.fatal, PluginError) and "attempt 2" in str(r.wf.fatal)
    assert "3 attempts" in str(r.wf.fatal)


def test_workers_that_die_before_ready_without_a_word_are_a_crash_loop(clock: Clock) -> None:
    r = rig(clock, processes=2, start_attempts=2)
    r.pool.exit(0, -signal.SIGSEGV)
    r.pool.exit(1, -signal.SIGSEGV)
    deaths = r.at(0.1)
    assert [d.why for d in deaths] == ["killed by SIGSEGV"] * 2
    fatal = r.wf.fatal
    assert isinstance(fatal, WorkerCrashLoop) and fatal.exit_code == 6
    assert "2 times" in str(fatal) and "workers.enrich" in str(fatal)


@pytest.mark.parametrize("first_said_why", [False, True])
def test_the_same_worker_dying_twice_before_ready_without_a_word_is_a_crash_loop(clock: Clock,
                                                                                first_said_why: bool) -> None:
    # What counts is what the last incarnation said (nothing), not what an earlier one did.
    r = rig(clock, processes=1, start_attempts=2, restart_backoff_s=0.1)
    if first_said_why:
        r.wf.on_fatal_report(r.pool.handles[0], "setup() failed: once")  # type: ignore[arg-type]
    r.pool.exit(0, 1)
    r.at(0.0)
    assert r.wf.fatal is None
    r.at(1.0)
    assert r.pool.spawned == [0, 0]
    r.pool.exit(0, -signal.SIGSEGV)
    r.at(1.1)
    assert isinstance(r.wf.fatal, WorkerCrashLoop), f"got {type(r.wf.fatal).__name__}: {r.wf.fatal}"
    assert r.wf.fatal.exit_code == 6


def test_once_a_worker_was_ready_start_failures_are_retried_forever_with_capped_back_off(
        clock: Clock) -> None:
    r = rig(clock, processes=1, start_attempts=1, restart_backoff_s=0.5, restart_backoff_max_s=4.0)
    r.ready()
    assert r.wf.started_once
    r.pool.exit(0, -signal.SIGKILL)  # a crash: it was ready
    r.at(1.0)
    delays = []
    t = 1.0
    for n in range(12):
        t = r.life().restart_at - 1000.0
        r.at(t)
        assert r.life().state is State.STARTING, f"restart {n} did not happen"
        if n % 2:
            r.wf.on_fatal_report(r.pool.handles[0], "setup() failed: ConnectionError: db away")  # type: ignore[arg-type]
        r.pool.exit(0, 1)
        r.at(t + 0.01)
        assert r.wf.fatal is None, f"failure {n + 1} stopped the daemon"
        delays.append(round(r.life().restart_at - (1000.0 + t + 0.01), 6))
    assert delays == [0.5, 1.0, 2.0, 4.0] + [4.0] * 8
    assert r.life().start_failures == 12


# ---------------------------------------------------------------------- crashes
@pytest.mark.parametrize("code", [3, 0, 75, 1, -signal.SIGKILL])
@pytest.mark.parametrize(("phase", "crashed", "during"), [
    ("between batches", None, ""),
    (PHASE_CALL, 17, "reading the batch or running the plugin"),
    (PHASE_DELIVER, 17, "delivering outputs or dead letters"),
    (PHASE_WAIT, 17, "waiting to retry"),
    (PHASE_COMMIT, 17, "committing its transaction"),
    (PHASE_OFFSETS, 17, "reading its partition's committed offset"),
    (PHASE_IDLE, 17, "reporting the batch"),
])
def test_a_ready_worker_that_exits_has_crashed_and_a_death_in_any_phase_of_a_batch_blames_it(
        clock: Clock, code: int, phase: int | str, crashed: int | None, during: str) -> None:
    r = rig(clock, start_attempts=1, restart_backoff_s=0.25)
    r.ready()
    board = r.pool.handles[0].board
    if isinstance(phase, int):
        board.begin(17, 2)
        board.set_phase(phase)
    r.pool.exit(0, code)
    deaths = r.at(5.0)
    assert len(deaths) == 1
    assert deaths[0].index == 0 and deaths[0].crashed_batch == crashed
    assert deaths[0].during == during
    assert r.wf.fatal is None, "a crash never stops the daemon, whatever the exit status"
    assert r.life().state is State.RESTARTING and r.life().crashes == 1
    assert r.life().restart_at == pytest.approx(1005.25)
    assert r.life().last_exit == deaths[0].why


def test_a_worker_killed_by_sigkill_that_we_did_not_send_has_crashed_perhaps_out_of_memory(
        clock: Clock) -> None:
    r = rig(clock)
    r.ready()
    r.pool.exit(0, -signal.SIGKILL)
    deaths = r.at(1.0)
    assert deaths[0].why == "killed by SIGKILL (perhaps out of memory)"
    assert r.life().exits == {"crashed": 1}


def test_a_worker_the_supervisor_killed_for_its_deadline_is_counted_killed_and_says_why(
        clock: Clock, caplog: pytest.LogCaptureFixture) -> None:
    r = rig(clock, batch_timeout_s=5.0, heartbeat_timeout_s=60.0)
    r.ready()
    board = r.pool.handles[0].board
    board.begin(42, 0)
    for t in (3.0, 6.0, 9.0):
        board.beat()
        r.at(t)
    assert r.pool.kills[-1] == (0, signal.SIGKILL), "SIGTERM ignored: SIGKILL after the grace"
    r.pool.exit(0, -signal.SIGKILL)
    with caplog.at_level("DEBUG", logger="ringmaster.workforce"):
        deaths = r.at(9.5)
    why = deaths[0].why
    assert why.startswith("killed by the supervisor (SIGKILL): batch exceeded its deadline"), why
    assert "out of memory" not in why and "workers.batch_timeout_s" in why
    assert r.life().exits == {"killed": 1}, "our own kill is not a crash"
    assert r.life().last_exit == why
    (line,) = [rec for rec in caplog.records if rec.getMessage().startswith("worker killed")]
    assert line.levelname == "WARNING" and line.__dict__["worker"] == 0 and line.__dict__["incarnation"] == 1


def test_a_worker_killed_at_once_for_a_revocation_is_counted_killed_with_the_reason(clock: Clock) -> None:
    r = rig(clock)
    r.ready()
    h = r.pool.handles[0]
    h.board.begin(8, 0)  # the batch the revocation waited for: slow, not poison
    r.wf.kill_now(h, "still busy on a revoked partition after 10 s (supervisor.revoke_timeout_s)")  # type: ignore[arg-type]
    assert r.pool.kills == [(0, signal.SIGKILL)]
    r.pool.exit(0, -signal.SIGKILL)
    deaths = r.at(0.5)
    assert deaths[0].crashed_batch is None
    assert deaths[0].why == ("killed by the supervisor (SIGKILL): still busy on a revoked partition after "
                             "10 s (supervisor.revoke_timeout_s)")
    assert r.life().exits == {"killed": 1}
    assert r.life().state is State.RESTARTING


def test_a_retiring_worker_that_exits_0_in_the_middle_of_a_batch_has_crashed(clock: Clock) -> None:
    r = rig(clock, max_batches=1)
    r.ready()
    h = r.pool.handles[0]
    r.out[0].add(5)
    r.at(1.0)
    assert r.life().state is State.RETIRING, "the STOP frame is queued behind batch 5"
    h.board.begin(5, 0)  # the worker runs batch 5 in the plugin ...
    r.pool.exit(0, 0)  # ... and the plugin calls os._exit(0)
    deaths = r.at(2.0)
    assert deaths[0].crashed_batch == 5
    assert r.life().crashes == 1


def test_a_worker_ready_and_dead_within_one_tick_has_crashed_not_failed_to_start(clock: Clock) -> None:
    r = rig(clock, start_attempts=1)
    r.pool.handles[0].board.set_ready()
    r.pool.handles[0].board.begin(9, 0)
    r.pool.exit(0, 3)  # before the supervisor saw it ready
    deaths = r.at(0.5)
    assert deaths[0].crashed_batch == 9
    assert r.wf.fatal is None and r.wf.started_once
    assert r.life().start_failures == 0 and r.life().crashes == 1


def test_consecutive_crashes_back_off_and_a_finished_batch_resets_them(clock: Clock) -> None:
    r = rig(clock, restart_backoff_s=1.0, restart_backoff_max_s=100)
    t = 0.0
    for n in range(3):
        r.ready()
        r.pool.exit(0, -signal.SIGKILL)
        r.at(t)
        assert r.life().restart_at == pytest.approx(1000 + t + 2**n)
        t = r.life().restart_at - 1000
        r.at(t)
    r.ready()
    r.wf.on_batch_done(r.pool.handles[0])  # type: ignore[arg-type]
    r.pool.exit(0, -signal.SIGKILL)
    r.at(t + 1)
    assert r.life().restart_at == pytest.approx(1000 + t + 1 + 1.0), "back to the first back-off"


# ---------------------------------------------------------------------- deadlines
def test_a_worker_whose_setup_hangs_is_terminated_then_killed_and_that_is_a_start_failure(
        clock: Clock) -> None:
    r = rig(clock, start_attempts=1, setup_timeout_s=10.0)
    r.at(9.9)
    assert r.pool.kills == []
    r.at(10.1)
    assert r.pool.kills == [(0, signal.SIGTERM)]
    assert not r.accepting(0), "no frames to a worker being killed"
    r.at(12.0)
    assert r.pool.kills == [(0, signal.SIGTERM)], "SIGKILL only after the grace"
    r.at(12.2)
    assert r.pool.kills[-1] == (0, signal.SIGKILL)
    r.pool.exit(0, -signal.SIGKILL)
    deaths = r.at(12.3)
    assert "setup_timeout_s" in deaths[0].why and deaths[0].crashed_batch is None
    assert "setup_timeout_s" in (r.life().start_failure or "")
    fatal = r.wf.fatal
    assert isinstance(fatal, PluginError), "setup hung: the plugin's fault, exit 3"
    assert "workers.setup_timeout_s" in str(fatal)


def test_a_hung_setup_below_start_attempts_is_retried(clock: Clock) -> None:
    r = rig(clock, start_attempts=2, setup_timeout_s=10.0, restart_backoff_s=1.0)
    r.at(10.5)
    r.pool.exit(0, -signal.SIGTERM)  # it obeyed SIGTERM
    r.at(11.0)
    assert r.wf.fatal is None and r.life().state is State.RESTARTING
    r.at(12.5)
    assert r.pool.spawned == [0, 0] and r.life().kill is None and r.accepting(0)


def test_the_batch_deadline_counts_plugin_time_only_not_delivery(clock: Clock) -> None:
    r = rig(clock, batch_timeout_s=5.0, heartbeat_timeout_s=30.0)
    r.ready()
    board = r.pool.handles[0].board
    r.at(10.0)
    board.begin(42, 0)  # PHASE_CALL from 10.0
    r.at(11.0)
    board.set_phase(PHASE_DELIVER)  # waiting for the broker from 11.0
    for t in (14.0, 18.0, 25.0):
        board.beat()
        r.at(t)
    assert r.pool.kills == [], "a long delivery is not a slow plugin"
    assert r.accepting(0)
    board.set_phase(PHASE_CALL)  # a retry: back in the plugin from 25.0
    board.beat()
    r.at(29.9)
    assert r.pool.kills == []
    board.beat()
    r.at(30.1)
    assert r.pool.kills == [(0, signal.SIGTERM)]
    assert "workers.batch_timeout_s" in (r.life().kill or "")
    r.pool.exit(0, -signal.SIGTERM)
    deaths = r.at(30.2)
    assert deaths[0].crashed_batch == 42, "killed in the plugin: the batch counts a crash"
    assert "batch exceeded its deadline" in deaths[0].why


def _beating_until_killed(r: Any, board: Any, bound: float) -> None:
    """The worker beats every 10 s in its phase: not killed before ``bound``, killed past it."""
    t = 0.0
    while t < bound - 1:
        t += 10
        board.beat()
        r.at(min(t, bound - 0.5))
    assert r.pool.kills == []
    board.beat()
    r.at(bound + 0.5)
    assert r.pool.kills == [(0, signal.SIGTERM)]


def test_a_delivery_wait_far_past_its_own_bound_is_killed(clock: Clock) -> None:
    r = rig(clock, batch_timeout_s=5.0, heartbeat_timeout_s=30.0)
    bound = r.wf.delivery_bound_s
    assert bound == 2 * 30.0 + 30
    r.ready()
    board = r.pool.handles[0].board
    board.begin(7, 0)
    board.set_phase(PHASE_DELIVER)
    _beating_until_killed(r, board, bound)
    r.pool.exit(0, -signal.SIGTERM)
    assert r.at(bound + 1)[0].crashed_batch is None, "not the batch's fault"


def test_a_transaction_commit_past_its_timeout_is_killed_sooner_than_a_delivery(clock: Clock) -> None:
    """Exactly-once: librdkafka's send_offsets_to_transaction ignores its timeout (#5456) and
    hangs while the coordinator answers CONCURRENT_TRANSACTIONS (after a broker stall) or
    after the group coordinator's node left a cluster (#5511: 44 s without outputs after a
    frozen coordinator, issue 40). The worker sat until the delivery bound (2 x 30 + 30 s),
    then 2 x 30 + 10 s; the commit takes at most its own timeout (5 s, or the delivery
    timeout if shorter; a failed one is not aborted: its producer is replaced), so past that
    and a margin it is killed."""
    r = rig(clock, batch_timeout_s=5.0, heartbeat_timeout_s=60.0)
    bound = r.wf.commit_bound_s
    assert bound == 5.0 + 5 < r.wf.delivery_bound_s
    r.ready()
    board = r.pool.handles[0].board
    board.begin(7, 0)
    board.set_phase(PHASE_COMMIT)
    _beating_until_killed(r, board, bound)  # it beats on: a thread beats while librdkafka blocks
    assert "committing its transaction for over 10 s" in (r.life().kill or "")
    r.pool.exit(0, -signal.SIGTERM)
    assert r.at(bound + 1)[0].crashed_batch is None, "not the batch's fault"


def test_a_committed_offset_read_past_the_workers_own_deadline_is_killed_not_blamed(clock: Clock) -> None:
    """Exactly-once: a batch starts by reading its partition's committed offset, which the
    worker gives up past the delivery timeout and a grace (runtime/kafka/committed_offsets.py).
    Issue 40 saw a worker over 3 minutes inside librdkafka's committed() after a supervisor
    SIGKILL, its board in PHASE_CALL: held to batch_timeout_s (300 s by default) and blamed on
    the batch as poison. Its own phase has its own bound, and the batch is not blamed."""
    r = rig(clock, batch_timeout_s=5.0, heartbeat_timeout_s=600.0)
    bound = r.wf.offsets_bound_s
    assert 30.0 < bound < r.wf.delivery_bound_s
    r.ready()
    board = r.pool.handles[0].board
    board.begin(7, 0)
    board.set_phase(PHASE_OFFSETS)
    r.at(bound - 0.5)
    assert r.pool.kills == [], "neither the plugin's deadline nor a kill before the read's bound"
    _beating_until_killed(r, board, bound)
    assert "reading its partition's committed offset for over" in (r.life().kill or "")
    r.pool.exit(0, -signal.SIGTERM)
    assert r.at(bound + 1)[0].crashed_batch is None, "not the batch's fault"


def test_a_silent_worker_is_terminated_after_heartbeat_timeout(clock: Clock) -> None:
    r = rig(clock, heartbeat_timeout_s=10.0)
    r.ready()
    r.at(9.9)
    assert r.pool.kills == [] and r.wf.stuck() == []
    r.at(10.2)
    assert r.pool.kills == [(0, signal.SIGTERM)]
    assert "workers.heartbeat_timeout_s" in (r.life().kill or "")
    assert r.wf.stuck() == ["worker 0 silent for 10 s (workers.heartbeat_timeout_s 10)"]
    r.at(12.3)
    assert r.pool.kills[-1] == (0, signal.SIGKILL), "a SIGSTOPped worker ignores SIGTERM"


def test_a_starting_worker_is_judged_by_setup_timeout_not_by_its_heartbeat(clock: Clock) -> None:
    # Its first beat comes after the interpreter started and imported the runtime: slow on a
    # loaded host, and no sign of a stopped process.
    r = rig(clock, heartbeat_timeout_s=2.0, setup_timeout_s=10.0)
    r.at(9.9)
    assert r.pool.kills == [] and r.wf.stuck() == [] and r.life().state is State.STARTING
    r.at(10.1)
    assert r.pool.kills == [(0, signal.SIGTERM)] and "setup_timeout_s" in (r.life().kill or "")


def test_a_worker_silent_while_it_delivers_is_killed_and_its_batch_counts_a_crash(clock: Clock) -> None:
    r = rig(clock, heartbeat_timeout_s=10.0)
    r.ready()
    board = r.pool.handles[0].board
    board.begin(31, 0)
    board.set_phase(PHASE_DELIVER)
    r.at(10.2)
    assert r.pool.kills == [(0, signal.SIGTERM)]
    r.pool.exit(0, -signal.SIGTERM)
    (death,) = r.at(10.5)
    assert death.crashed_batch == 31, "a batch that silences its worker in any phase is at fault"
    assert death.during == "delivering outputs or dead letters"


def test_a_worker_that_keeps_beating_is_never_silent(clock: Clock) -> None:
    r = rig(clock, heartbeat_timeout_s=10.0)
    r.ready()
    for t in range(1, 60, 5):
        r.pool.handles[0].board.beat()
        r.at(float(t))
    assert r.pool.kills == []


# ---------------------------------------------------------------------- accepting / recycling
def test_frames_may_wait_in_the_ring_of_a_starting_or_ready_worker(clock: Clock) -> None:
    r = rig(clock)
    assert r.life().state is State.STARTING and r.accepting(0)
    r.ready()
    assert r.accepting(0)


def test_a_restarting_worker_accepts_nothing(clock: Clock) -> None:
    r = rig(clock, restart_backoff_s=1.0)
    r.ready()
    r.pool.exit(0, 1)
    r.at(1.0)
    assert r.life().state is State.RESTARTING and not r.accepting(0)
    r.at(2.5)
    assert r.life().state is State.STARTING and r.accepting(0)


def test_a_worker_past_max_batches_accepts_nothing_and_is_recycled_behind_its_work(clock: Clock) -> None:
    r = rig(clock, max_batches=3)
    r.ready()
    h = r.pool.handles[0]
    for bid in (1, 2):
        h.board.begin(bid, 0)
        h.board.end(10)
    assert r.accepting(0), "2 of 3 given"
    r.out[0].add(3)
    assert not r.accepting(0), "2 done + 1 queued: the budget is spent"
    r.at(1.0)
    assert h.ring.frames == [STOP_FRAME], "the STOP frame goes right behind the last batch"
    assert r.life().state is State.RETIRING and not r.accepting(0)
    r.at(2.0)
    assert h.ring.frames == [STOP_FRAME], "one STOP frame"
    h.board.begin(3, 0)
    h.board.end(10)
    r.out[0].discard(3)
    r.pool.exit(0, 0)
    deaths = r.at(3.0)
    assert deaths == [Death(0, None, "exited with status 0")]
    assert r.life().crashes == 0, "recycled, not crashed"
    assert r.pool.spawned == [0, 0], "replaced within the same tick, without a back-off"
    assert r.life().state is State.STARTING and r.accepting(0), "a fresh incarnation, a fresh budget"


def test_a_recycling_worker_that_finds_its_ring_full_tries_again_later(clock: Clock) -> None:
    r = rig(clock, max_batches=1)
    r.ready()
    h = r.pool.handles[0]
    h.board.begin(1, 0)
    h.board.end(1)
    h.ring.room = False
    r.at(1.0)
    assert r.life().state is State.READY and not r.accepting(0)
    h.ring.room = True
    r.at(1.1)
    assert r.life().state is State.RETIRING and h.ring.frames == [STOP_FRAME]


def test_a_worker_being_killed_accepts_nothing(clock: Clock) -> None:
    r = rig(clock, heartbeat_timeout_s=5.0)
    r.ready()
    assert r.accepting(0)
    r.at(6.0)
    assert r.life().kill is not None and not r.accepting(0)


def test_after_stop_all_the_dead_are_not_restarted(clock: Clock) -> None:
    r = rig(clock)
    r.ready()
    r.wf.stop_all(1.0)
    deaths = r.at(1.0)
    assert len(deaths) == 1
    r.at(100.0)
    assert r.pool.spawned == [0] and r.life().state is State.STOPPED
