"""The workforce room: worker lifecycle. Runs in: supervisor.

Decides when workers start, are replaced and stop; the pool (pool.py) carries it out.
Each worker has a :class:`Life`, written here only.

How a worker's end is judged – by what it reported and what it was doing, never by its exit
status (a plugin can produce any status):

* it sent FATAL before it was ready, or died before it was ready, or did not become ready
  within ``setup_timeout_s``: a **start failure**. Before any worker of this run was ready,
  ``start_attempts`` of them in a row stop the daemon: exit 3 if the worker said why
  (import or ``setup()`` failed, or setup hung), exit 6 if it died without a word. Once the
  plugin has started in this run, a start failure (a later incarnation whose ``setup()``
  hits a transient error) is retried with back-off for as long as it takes.
* it was ready and died: a **crash**. Its batches go back to their lanes; the one it was
  running counts a crash (crash isolation, isolation.py) only if it died in the plugin, not
  while waiting for the broker.
* it exited after a STOP frame: **recycled** (memory or batch budget).

Kills: a plugin call past ``batch_timeout_s``, a worker silent past
``heartbeat_timeout_s`` (SIGSTOPped, stuck holding the GIL), a delivery wait far past its
own bound: SIGTERM, then SIGKILL two seconds later.
"""

from __future__ import annotations

import enum
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from runtime.board import PHASE_CALL, PHASE_DELIVER
from runtime.config import Settings
from runtime.errors import PluginError, RingmasterError, WorkerCrashLoop
from runtime.flow import InFlight
from runtime.frames import STOP_FRAME
from runtime.pool import WorkerHandle, WorkerPool, describe_exit

log = logging.getLogger("ringmaster.workforce")

_KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this
_WATCH_S = 2.0  # psutil checks: memory, processes the plugin started


class State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    RETIRING = "retiring"  # a STOP frame is queued behind its last batch
    RESTARTING = "restarting"  # dead; a new incarnation starts at restart_at
    STOPPED = "stopped"


@dataclass
class Life:
    state: State = State.STOPPED
    restart_at: float | None = None
    kill: str | None = None  # why we are killing it (SIGTERM sent at term_sent_at)
    term_sent_at: float | None = None
    reported: str | None = None  # why this incarnation cannot start: its FATAL report, or a setup timeout
    start_failure: str | None = None  # why the worker is failing to start (shown until it is ready)
    start_failures: int = 0  # in a row, this worker
    crashes: int = 0  # in a row since its last finished batch (restart back-off)
    last_exit: str | None = None
    restarts: int = 0
    exits: dict[str, int] = field(default_factory=dict)  # by cause: crashed, killed, recycled, start_failure


@dataclass(frozen=True)
class Death:
    """What the supervisor needs to redeliver a dead worker's batches."""

    index: int
    crashed_batch: int | None  # the batch it was running in the plugin when it died
    why: str  # "exited with status 13", "killed by SIGKILL (perhaps out of memory)", ...


class Workforce:
    def __init__(self, settings: Settings, pool: WorkerPool, in_flight: InFlight,
                 clock: Callable[[], float]) -> None:
        self.w = settings.workers
        self.delivery_bound_s = 2 * settings.output.delivery_timeout_s + 30
        self.pool = pool
        self.in_flight = in_flight
        self.clock = clock
        self.lives = [Life() for _ in pool.handles]
        self.started_once = False  # a worker of this run became ready at least once
        self.start_failures = 0  # in a row, all workers, before started_once
        self.fatal: RingmasterError | None = None
        self._last_watch = 0.0
        self.stopping = False

    # ------------------------------------------------------------------ queries
    def accepting(self, i: int) -> bool:
        """May frames be written to worker i's ring now? (Also before it is ready: frames
        wait in its ring while it starts.)"""
        life = self.lives[i]
        if life.state not in (State.STARTING, State.READY) or life.kill is not None:
            return False
        return not self._budget_spent(self.pool.handles[i])

    def _budget_spent(self, h: WorkerHandle) -> bool:
        """Has this incarnation been given its max_batches (done, or queued in its ring)?
        Then it gets no more frames, and the STOP frame that recycles it comes right after
        its last batch instead of behind a ring's worth of more work."""
        given = h.board.batches + self.in_flight.count(h.index)
        return bool(self.w.max_batches) and given >= self.w.max_batches

    def stuck(self) -> list[str]:
        """Workers silent past heartbeat_timeout_s and not yet replaced (for /healthz).
        Runs in: any thread: reads only lifecycle states and the boards in shared memory
        (never the process objects, whose polling reaps)."""
        out = []
        for h, life in zip(self.pool.handles, self.lives, strict=True):
            if life.state in (State.STARTING, State.READY, State.RETIRING):
                age = h.board.heartbeat_age_s
                if age > self.w.heartbeat_timeout_s:
                    out.append(f"worker {h.index} silent for {age:.0f} s (workers.heartbeat_timeout_s "
                               f"{self.w.heartbeat_timeout_s:g})")
        return out

    # ------------------------------------------------------------------ start / stop
    def start_all(self) -> None:
        for h in self.pool.handles:
            self._spawn(h)

    def _spawn(self, h: WorkerHandle) -> None:
        life = self.lives[h.index]
        if h.incarnation:
            life.restarts += 1
        self.pool.spawn_worker(h)
        life.state = State.STARTING
        life.restart_at = life.kill = life.term_sent_at = life.reported = None
        # A start failure stays visible (status) until this incarnation is ready.

    # ------------------------------------------------------------------ reports
    def on_fatal_report(self, h: WorkerHandle, detail: str) -> None:
        """The worker could not start the plugin, and said why (it exits next)."""
        self.lives[h.index].reported = detail

    def on_batch_done(self, h: WorkerHandle) -> None:
        self.lives[h.index].crashes = 0

    # ------------------------------------------------------------------ the tick
    def manage(self, drain: Callable[[WorkerHandle], None]) -> list[Death]:
        """Notice readiness, reap the dead (returned: their batches are the caller's to
        redeliver), restart when a back-off is over, enforce deadlines, recycle. ``drain``
        reads a dead worker's last results first: acknowledgements sent before death count."""
        deaths = []
        for h in self.pool.dead():
            drain(h)
            deaths.append(self._reap(h))
        now = self.clock()
        for h, life in zip(self.pool.handles, self.lives, strict=True):
            if life.state is State.RESTARTING and life.restart_at is not None and now >= life.restart_at \
                    and not self.stopping and self.fatal is None:
                self._spawn(h)
            elif h.alive:
                if life.state is State.STARTING and h.board.ready:
                    self._became_ready(h, life)
                self._enforce_bounds(h, life, now)
        if now - self._last_watch >= _WATCH_S:
            self._last_watch = now
            self.pool.watch_descendants()
            self.pool.reap_orphans()
            self._recycle_if_needed(check_rss=bool(self.w.max_rss_mb))
        elif self.w.max_batches:
            self._recycle_if_needed(check_rss=False)
        return deaths

    def _became_ready(self, h: WorkerHandle, life: Life) -> None:
        life.state = State.READY
        life.start_failure = None
        life.start_failures = 0
        if not self.started_once:
            self.started_once = True
            self.start_failures = 0
        log.debug("worker ready", extra={"worker": h.index, "pid": h.pid})

    def _enforce_bounds(self, h: WorkerHandle, life: Life, now: float) -> None:
        if life.kill is not None:
            if life.term_sent_at is not None and now - life.term_sent_at > _KILL_GRACE_S:
                self.pool.kill(h, signal.SIGKILL)
            return
        reason = None
        if life.state is State.STARTING and now - h.started_at > self.w.setup_timeout_s:
            reason = (f"plugin setup did not finish within {self.w.setup_timeout_s:g} s "
                      "(workers.setup_timeout_s)")
            life.reported = reason
        elif h.board.in_phase_for_s(PHASE_CALL) > self.w.batch_timeout_s:
            reason = f"batch exceeded its deadline of {self.w.batch_timeout_s:g} s (workers.batch_timeout_s)"
        elif h.board.in_phase_for_s(PHASE_DELIVER) > self.delivery_bound_s:
            reason = f"waiting for the broker for over {self.delivery_bound_s:g} s"
        elif h.board.heartbeat_age_s > self.w.heartbeat_timeout_s:
            reason = f"silent for {h.board.heartbeat_age_s:.0f} s (workers.heartbeat_timeout_s)"
        if reason is not None:
            log.error(f"stopping worker: {reason}", extra={"worker": h.index, "pid": h.pid})
            life.kill = reason
            life.term_sent_at = now
            self.pool.kill(h, signal.SIGTERM)

    def _recycle_if_needed(self, check_rss: bool) -> None:
        """Replace workers past their memory or batch budget, between batches: a STOP frame
        goes behind the work already in the ring and nothing more is written after it."""
        for h, life in zip(self.pool.handles, self.lives, strict=True):
            if not h.alive or life.state is not State.READY or life.kill is not None:
                continue
            reason = None
            if self._budget_spent(h):
                queued = self.in_flight.count(h.index)
                reason = f"{h.board.batches} batches done, {queued} more in its ring"
            elif check_rss:
                try:
                    rss_mb = psutil.Process(h.pid).memory_info().rss / 2**20
                except psutil.Error:
                    continue
                if rss_mb > self.w.max_rss_mb:
                    reason = f"RSS {rss_mb:.0f} MiB over {self.w.max_rss_mb} MiB"
            if reason and h.ring.try_write(STOP_FRAME):
                life.state = State.RETIRING
                if h.bell is not None:
                    h.bell.ring()
                log.info("recycling worker", extra={"worker": h.index, "pid": h.pid, "why": reason})

    # ------------------------------------------------------------------ deaths
    def _reap(self, h: WorkerHandle) -> Death:
        life = self.lives[h.index]
        was_ready = h.board.ready
        batch, _slot = h.board.current
        in_plugin = bool(batch) and h.board.phase == PHASE_CALL
        pid = h.pid
        if was_ready and life.state is State.STARTING:
            self._became_ready(h, life)  # ready and dead within one tick
        code = self.pool.forget(h)
        level, words = describe_exit(code)
        if life.kill is not None:
            words = f"{words} after {life.kill}"
        life.last_exit = words
        # Recycled: it read its STOP frame and exited 0, idle. Exiting 0 in the middle of a
        # batch (a plugin's os._exit(0)) is a crash like any other, or that record would loop forever.
        recycled = life.state is State.RETIRING and code == 0 and not batch
        cause = ("recycled" if recycled
                 else "start_failure" if not was_ready else "killed" if life.kill is not None else "crashed")
        if not self.stopping:
            life.exits[cause] = life.exits.get(cause, 0) + 1
        if self.stopping:
            life.state = State.STOPPED
            return Death(h.index, batch if in_plugin else None, words)
        if recycled:
            log.info("worker recycled", extra={"worker": h.index, "pid": pid})
            life.state, life.restart_at = State.RESTARTING, self.clock()
            return Death(h.index, None, words)
        if not was_ready:
            self._start_failed(h, life, words)
            return Death(h.index, None, words)
        log.log(level, f"worker {words}", extra={"worker": h.index, "pid": pid, "exitcode": code,
                                                 "batches_in_flight": self.in_flight.count(h.index)})
        life.crashes += 1
        self._restart_later(life, life.crashes)
        return Death(h.index, batch if in_plugin else None, words)

    def _start_failed(self, h: WorkerHandle, life: Life, words: str) -> None:
        reported = life.reported
        why = reported or f"worker {words} during start-up"
        life.start_failure = why
        life.start_failures += 1
        if not self.started_once:
            self.start_failures += 1
            if self.start_failures >= self.w.start_attempts:
                if reported is not None:
                    self.fatal = PluginError(f"the plugin cannot start: {why} ({self.start_failures} "
                                             "attempts); fix the plugin or its settings, then start again")
                else:
                    self.fatal = WorkerCrashLoop(
                        f"workers died {self.start_failures} times during start-up ({words}) before "
                        f"any was ready; check plugin {self.w.plugin!r} and the worker's log")
                return
        log.error("worker failed to start; retrying", extra={
            "worker": h.index, "why": why, "attempt": life.start_failures,
            "plugin_started_before": self.started_once})
        self._restart_later(life, life.start_failures)

    def _restart_later(self, life: Life, failures: int) -> None:
        backoff = min(self.w.restart_backoff_s * 2 ** (failures - 1), self.w.restart_backoff_max_s)
        life.state, life.restart_at = State.RESTARTING, self.clock() + backoff

    # ------------------------------------------------------------------ stop
    def stop_all(self, timeout_s: float, drain: Callable[[], None]) -> None:
        self.stopping = True
        self.pool.stop_all(timeout_s, drain)
        for life in self.lives:
            life.state = State.STOPPED
