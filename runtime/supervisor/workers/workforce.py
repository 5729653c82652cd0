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
  running counts a crash (crash isolation, isolation.py), whatever the phase it died in:
  reading the frame, in the plugin, delivering the outputs, waiting to retry, writing dead
  letters, reporting (a record whose outputs get the worker OOM-killed while they are
  delivered is as much at fault as one that crashes the plugin). Only the supervisor's own
  kills for what is not the batch's doing spare it: a delivery wait far past its bound (an
  outage), a revocation, a worker that ran out of a resource and did not leave.
* it exited after a STOP frame: **recycled** (memory, open files or batch budget), or
  **retired** (a reload or a resize no longer wants it: it took no more batches, finished
  those in its ring, and its slot is spare).
* it reported EXHAUSTED (out of file descriptors or memory) and exited: **exhausted**, the
  worker's fault, not the records': replaced at once, its batches run again on the new
  one and nothing counts against them – unless it ran out in its very first batch, when
  that batch is what exhausts a fresh worker and counts as a crash (isolation may follow).
  Workers are also recycled before they run out: at 80 % of their RLIMIT_NOFILE.

A worker a reload or a resize starts takes no frames before it is ready: a partition must
not wait behind a plugin's setup(). One **on probation** (a reload's first new worker, a
worker a resize added) is not restarted if it dies before it has finished a batch: the change
that started it is undone (rollout.py, which also decides when it passed), and the batch it
was running counts no crash (the fault is the new code's or the new process's, not the
record's).

Kills: a start (import and setup) past ``setup_timeout_s``, a plugin call past
``batch_timeout_s``, a started worker silent past ``heartbeat_timeout_s`` (SIGSTOPped, stuck
holding the GIL), a delivery wait far past its
own bound: SIGTERM, then SIGKILL two seconds later; a worker still busy on a revoked
partition after ``revoke_timeout_s``: SIGKILL at once (``kill_now``). A worker the
supervisor killed is logged as such, with why, and counted as ``killed`` (never as a crash
"perhaps out of memory").
"""

from __future__ import annotations

import enum
import logging
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic

import psutil

from runtime.backoff import backoff_s
from runtime.config import WorkerSettings
from runtime.errors import PluginError, RingmasterError, WorkerCrashLoop
from runtime.kafka.committed_offsets import GRACE_S as OFFSETS_GRACE_S
from runtime.kafka.transactions import commit_timeout_s
from runtime.ops.status import ExitCause
from runtime.supervisor.seams.pool import PluginCode, Pool, S
from runtime.supervisor.workers.pool import describe_exit
from runtime.transport.board import (
    DOING,
    PHASE_CALL,
    PHASE_COMMIT,
    PHASE_DELIVER,
    PHASE_FENCE,
    PHASE_IDLE,
    PHASE_OFFSETS,
    PHASE_SETTLE,
)

log = logging.getLogger("ringmaster.workforce")

NO_LIMIT = 1 << 62  # allowance(): a worker with no max_batches may hold any number of batches
_KILL_GRACE_S = 2.0  # SIGTERM, then SIGKILL after this
_WATCH_S = 2.0  # psutil checks: memory, open files, processes the plugin started
_RECLAIM_S = 30.0  # a look for segments of supervisors that died beside this one
# A worker holding this share of its RLIMIT_NOFILE is recycled between batches: a plugin that
# leaks descriptors would otherwise fail every record with EMFILE (issue 17.8).
_FD_RECYCLE_SHARE = 0.8
_EXHAUSTED_EXIT_S = 30.0  # an exhausted worker runs teardown and flushes (10 s), then exits


class State(enum.Enum):
    SPARE = "spare"  # a slot with no worker and none wanted (never used, retired, a failed probation)
    STARTING = "starting"
    READY = "ready"
    RETIRING = "retiring"  # a STOP frame is queued behind its last batch (the scheduler wrote it)
    RESTARTING = "restarting"  # dead; a new incarnation starts at restart_at
    STOPPED = "stopped"


@dataclass
class Life:
    state: State = State.SPARE
    code: PluginCode | None = None  # what this slot runs, restarts included
    version: str | None = None  # the plugin version its incarnation reported (HELLO)
    retiring: str | None = None  # why it is leaving for good: takes no batches, is not restarted
    stop_due: str | None = None  # why a STOP frame is due, not written yet (stops_due, stop_written)
    probation: bool = False  # not restarted if it fails before finishing a batch (module docstring)
    frames_once_ready: bool = False  # started by a reload or resize: no frames while it starts
    restart_at: float | None = None
    kill: str | None = None  # why we are killing it (SIGTERM sent at term_sent_at)
    kill_blames_batch: bool = True  # does our kill count against the batch it is in (module docstring)
    term_sent_at: float | None = None
    reported: str | None = None  # why this incarnation cannot start: its FATAL report, or a setup timeout
    start_failure: str | None = None  # why the worker is failing to start (shown until it is ready)
    start_failures: int = 0  # in a row, this worker
    crashes: int = 0  # in a row since its last finished batch (restart back-off)
    exhausted: str | None = None  # this incarnation reported EXHAUSTED: what it ran out of
    exhausted_batch: int | None = None  # ... in its very first batch: that batch counts a crash
    exhausted_at: float = 0.0
    last_exit: str | None = None
    restarts: int = 0
    exits: dict[ExitCause, int] = field(default_factory=dict)  # exits that led to a restart


_READY, _STARTING = State.READY, State.STARTING


def _takes_frames(life: Life) -> bool:
    """Workforce.takes_frames, for one life."""
    state = life.state
    return (state is _READY or (state is _STARTING and not life.frames_once_ready)) \
        and life.kill is None and not life.retiring and not life.stop_due


@dataclass(frozen=True)
class LifeView:
    """What status shows of one worker slot's life (runtime/supervisor/daemon/report.py)."""

    index: int
    state: State
    restarts: int
    last_exit: str | None
    start_failure: str | None
    exits: dict[ExitCause, int]
    version: str | None
    generation: int
    retiring: bool


@dataclass(frozen=True)
class Death:
    """What the supervisor needs to redeliver a dead worker's batches."""

    index: int
    crashed_batch: int | None  # the batch it died in, if its death counts against that batch
    why: str  # "exited with status 13", "killed by SIGKILL (perhaps out of memory)", ...
    version: str | None = None  # the plugin version it ran
    during: str = ""  # what it was doing in that batch: "running the plugin", "delivering outputs ...", ...


class Workforce(Generic[S]):
    """Generic in the pool's handle type ``S``: the handles given to it go back to the pool."""

    def __init__(self, w: WorkerSettings, delivery_timeout_s: float, pool: Pool[S],
                 clock: Callable[[], float]) -> None:
        """``delivery_timeout_s``: output.delivery_timeout_s (a delivery wait far past it is killed)."""
        self.w = w
        self.delivery_bound_s = 2 * delivery_timeout_s + 30
        # Exactly-once: sending the offsets and committing take at most commit_timeout_s
        # together (runtime/kafka/transactions.py; a failed commit is not aborted: the producer
        # is replaced, and its successor's init_transactions aborts what it left open). Past
        # that the worker is blocked in librdkafka, whose send_offsets_to_transaction ignores
        # its timeout (librdkafka#5456) and hangs when the group coordinator's node left the
        # cluster (#5511: a coordinator killed or frozen on a three-node cluster, issue 40), or
        # while the transaction coordinator answers CONCURRENT_TRANSACTIONS after a broker
        # stall (docs/exactly-once.md, Limits). Killed, its successor's init_transactions
        # fences it.
        self.commit_bound_s = commit_timeout_s(delivery_timeout_s) + 5
        # The worker gives its committed-offset read up past delivery_timeout_s and GRACE_S
        # (committed_offsets.py); a new producer's init_transactions has delivery_timeout_s.
        self.offsets_bound_s = delivery_timeout_s + OFFSETS_GRACE_S + 10
        self._txn_bounds = ((PHASE_COMMIT, self.commit_bound_s), (PHASE_OFFSETS, self.offsets_bound_s),
                            (PHASE_FENCE, delivery_timeout_s + 10))
        self.pool = pool
        self.clock = clock
        self.code = PluginCode(1, self.w.plugin, dict(self.w.settings))  # what start_all starts
        self.lives = [Life() for _ in range(pool.max_slots)]
        self.started_once = False  # a worker of this run became ready at least once
        self.start_failures = 0  # in a row, all workers, before started_once
        self.fatal: RingmasterError | None = None
        self._last_watch = 0.0
        self._last_reclaim = 0.0
        self.stopping = False

    # ------------------------------------------------------------------ queries
    def takes_frames(self, i: int) -> bool:
        """May frames be written to worker i's ring now (its batch budget aside)? Also before
        it is ready (frames wait in its ring while it starts), but for a worker a reload or
        resize started; never to one that is retiring, being killed or owed a STOP frame."""
        return _takes_frames(self.lives[i])

    def allowance(self) -> list[int]:
        """Per worker slot, how many batches its ring may hold now: the value the loop hands to
        the scheduler's placing (which keeps each ring under it), so that neither room calls
        the other. 0 for a worker that takes no frames; with ``max_batches``, what is left of
        its incarnation's budget (batches done count against it, the scheduler counts those
        queued), so the STOP frame that recycles it comes right after its last batch instead
        of behind a ring's worth of more work. Asked a few times a tick: kept to one pass."""
        budget, lives = self.w.max_batches, self.lives  # a life per slot; the pool's handles may be fewer
        if not budget:
            return [NO_LIMIT if _takes_frames(lives[h.index]) else 0 for h in self.pool.handles]
        return [max(budget - h.board.batches, 0) if _takes_frames(lives[h.index]) else 0
                for h in self.pool.handles]

    def _budget_spent(self, h: S, in_ring: int) -> bool:
        """Has this incarnation been given its max_batches (done, or ``in_ring``: queued there)?"""
        return bool(self.w.max_batches) and h.board.batches + in_ring >= self.w.max_batches

    def working(self) -> bool:
        """Is a live worker in a batch now (in the plugin, delivering, or waiting to retry)?"""
        return any(h.alive and h.board.phase != PHASE_IDLE for h in self.pool.handles)

    def snapshot(self) -> list[LifeView]:
        """Each slot's life, as status shows it."""
        return [LifeView(i, life.state, life.restarts, life.last_exit, life.start_failure, dict(life.exits),
                         life.version, life.code.generation if life.code else 0, bool(life.retiring))
                for i, life in enumerate(self.lives)]

    def stuck(self) -> list[str]:
        """Started workers silent past heartbeat_timeout_s and not yet replaced (for /healthz).
        Runs in: any thread: reads only lifecycle states and the boards in shared memory
        (never the process objects, whose polling reaps)."""
        out = []
        for h in self.pool.handles:
            if self.lives[h.index].state in (State.READY, State.RETIRING):  # STARTING: setup_timeout_s
                age = h.board.heartbeat_age_s
                if age > self.w.heartbeat_timeout_s:
                    out.append(f"worker {h.index} silent for {age:.0f} s (workers.heartbeat_timeout_s "
                               f"{self.w.heartbeat_timeout_s:g})")
        return out

    # ------------------------------------------------------------------ start / stop
    def start_all(self) -> None:
        for h in self.pool.handles:
            self.lives[h.index].code = self.code
            self._spawn(h)

    def start(self, i: int, code: PluginCode, probation: bool) -> None:
        """Start a worker running ``code`` in slot i, a spare one (creating its ring the first
        time: SharedMemoryError when shm_dir has no room for it)."""
        life = self.lives[i]
        assert life.state is State.SPARE, f"slot {i} is {life.state.value}"
        h = self.pool.handles[i] if i < len(self.pool.handles) else self.pool.add_slot()
        assert h.index == i
        life.code, life.probation, life.retiring = code, probation, None
        life.start_failure = None
        self._spawn(h)
        life.frames_once_ready = True

    def retire(self, i: int, why: str) -> None:
        """Slot i's worker leaves for good: it takes no more batches, finishes those in its
        ring, reads a STOP frame and exits (stops_due() asks for it). A worker that is not
        running (waiting to be restarted) is gone at once."""
        life = self.lives[i]
        life.retiring = why
        h = self.pool.handles[i]
        if life.state is State.RESTARTING:
            life.state, life.restart_at = State.SPARE, None
        elif life.state is State.STARTING and not h.board.ready:
            # Still in setup (which could hang past any STOP frame): stopped now; the frames
            # given to it meanwhile go back to their lanes when it is reaped.
            life.kill, life.term_sent_at = f"retired before it was ready ({why})", self.clock()
            self.pool.kill(h, signal.SIGTERM)
        else:
            life.stop_due = why

    def confirm(self, i: int) -> None:
        """Slot i's worker passed its probation (rollout.py): from now on an ordinary worker."""
        self.lives[i].probation = False

    def finished_batches(self, i: int) -> int:
        """Batches slot i's current incarnation has finished (its board)."""
        return self.pool.handles[i].board.batches

    def free_slot(self) -> int | None:
        """The lowest spare slot (its ring may not exist yet), or None if every one is in use."""
        for i, life in enumerate(self.lives):
            if life.state is State.SPARE:
                return i
        return None

    def in_use(self) -> list[int]:
        """Slots whose worker runs or will run again (restarts included), not retiring."""
        return [i for i, life in enumerate(self.lives)
                if life.state not in (State.SPARE, State.STOPPED) and not life.retiring]

    def _spawn(self, h: S) -> None:
        life = self.lives[h.index]
        if life.state is State.RESTARTING:
            life.restarts += 1
        assert life.code is not None
        try:
            self.pool.spawn_worker(h, life.code)
        except OSError as exc:
            # Out of file descriptors or processes (EMFILE, EAGAIN): the supervisor's own
            # trouble, never a reason for it to die; the worker is started again later.
            log.error("cannot start a worker now; retrying", extra={"worker": h.index, "error": str(exc)})
            self._restart_later(life, max(life.crashes, 1))
            return
        life.state, life.frames_once_ready = State.STARTING, False
        life.restart_at = life.kill = life.term_sent_at = life.reported = life.version = life.stop_due = None
        life.kill_blames_batch = True
        life.exhausted = life.exhausted_batch = None
        # A start failure stays visible (status) until this incarnation is ready.

    # ------------------------------------------------------------------ reports
    def on_fatal_report(self, h: S, detail: str) -> None:
        """The worker could not start the plugin, and said why (it exits next)."""
        self.lives[h.index].reported = detail

    def on_hello(self, h: S, version: str) -> None:
        """The worker started the plugin and says which version it runs."""
        self.lives[h.index].version = version
    def on_exhausted(self, h: S, batch_id: int, detail: str, fresh: bool) -> None:
        """The worker ran out of a resource and exits next; nothing more goes to its ring."""
        life = self.lives[h.index]
        life.exhausted = detail
        life.exhausted_batch = batch_id if fresh else None
        life.exhausted_at = self.clock()
        if life.state is State.READY:
            life.state = State.RETIRING

    def on_batch_done(self, h: S) -> None:
        self.lives[h.index].crashes = 0

    # ------------------------------------------------------------------ the tick
    def dead(self) -> list[S]:
        """Workers whose process ended, to reap with manage() once their last results are read
        (acknowledgements sent before death count)."""
        return self.pool.dead()

    def manage(self, dead: list[S], in_rings: Sequence[int]) -> list[Death]:
        """Notice readiness, reap the dead (returned: their batches are the caller's to
        redeliver), restart when a back-off is over, enforce deadlines, recycle (stops_due).
        ``in_rings``: batches in each worker's ring (the scheduler's counts, from the loop)."""
        deaths = [self._reap(h, in_rings[h.index]) for h in dead]
        now = self.clock()
        for h in self.pool.handles:
            life = self.lives[h.index]
            if life.state is State.RESTARTING and life.restart_at is not None and now >= life.restart_at \
                    and not self.stopping and self.fatal is None:
                self._spawn(h)
            elif h.alive:
                if life.state is State.STARTING and h.board.ready:
                    self._became_ready(h, life)
                if life.retiring and life.state is not State.RETIRING and life.kill is None:
                    life.stop_due = life.stop_due or life.retiring
                self._enforce_bounds(h, life, now)
        if now - self._last_watch >= _WATCH_S:
            self._last_watch = now
            self.pool.watch_descendants()
            self.pool.reap_orphans()
            self._recycle_if_needed(in_rings, watch=True)
        if now - self._last_reclaim >= _RECLAIM_S:
            self._last_reclaim = now
            self.pool.reclaim_dead_runs()
        elif self.w.max_batches:
            self._recycle_if_needed(in_rings, watch=False)
        return deaths

    def _became_ready(self, h: S, life: Life) -> None:
        life.state = State.READY
        life.start_failure = None
        life.start_failures = 0
        if not self.started_once:
            self.started_once = True
            self.start_failures = 0
        log.debug("worker ready", extra={"worker": h.index, "incarnation": h.incarnation, "pid": h.pid})

    def _enforce_bounds(self, h: S, life: Life, now: float) -> None:
        if life.kill is not None:
            if life.term_sent_at is not None and now - life.term_sent_at > _KILL_GRACE_S:
                self.pool.kill(h, signal.SIGKILL)
            return
        reason = None
        blames = True
        if life.state is State.STARTING and now - h.started_at > self.w.setup_timeout_s:
            reason = (f"plugin setup did not finish within {self.w.setup_timeout_s:g} s "
                      "(workers.setup_timeout_s)")
            life.reported = reason
        elif h.board.in_phase_for_s(PHASE_CALL) > self.w.batch_timeout_s:
            reason = f"batch exceeded its deadline of {self.w.batch_timeout_s:g} s (workers.batch_timeout_s)"
        elif h.board.in_phase_for_s(PHASE_DELIVER) > self.delivery_bound_s:
            reason = f"waiting for the broker for over {self.delivery_bound_s:g} s"
            blames = False  # an outage the producer's own timeout did not end: not the records'
        elif late := [(p, b) for p, b in self._txn_bounds if h.board.in_phase_for_s(p) > b]:
            reason = f"{DOING[late[0][0]]} for over {late[0][1]:g} s"
            blames = False  # the broker's, not the records'
        # A starting worker is judged by setup_timeout_s alone: its first beat comes only after
        # the interpreter has started and imported the runtime, which on a loaded host took
        # longer than a short heartbeat_timeout_s (2 s: every start was killed, and the daemon
        # stopped for a crash loop of a plugin that had done nothing wrong).
        elif life.state is not State.STARTING and h.board.heartbeat_age_s > self.w.heartbeat_timeout_s:
            reason = f"silent for {h.board.heartbeat_age_s:.0f} s (workers.heartbeat_timeout_s)"
        elif life.exhausted is not None and now - life.exhausted_at > _EXHAUSTED_EXIT_S:
            reason = f"still running {_EXHAUSTED_EXIT_S:g} s after it ran out of {life.exhausted}"
            blames = False  # the worker's own trouble, judged like its EXHAUSTED report
        if reason is not None:
            log.warning(f"killing worker: {reason}", extra={"worker": h.index, "incarnation": h.incarnation,
                                                            "pid": h.pid})
            life.kill, life.kill_blames_batch = reason, blames
            life.term_sent_at = now
            self.pool.kill(h, signal.SIGTERM)

    def kill_now(self, h: S, reason: str) -> None:
        """SIGKILL a worker at once and wait for it (a revocation that cannot wait longer).
        Its death is then the supervisor's doing: counted as ``killed``, logged with ``reason``."""
        life = self.lives[h.index]
        log.error(f"killing worker: {reason}", extra={"worker": h.index, "pid": h.pid})
        life.kill, life.kill_blames_batch = reason, False  # a revocation: slow is not poison
        life.term_sent_at = self.clock()
        self.pool.kill(h, signal.SIGKILL)
        if h.process is not None:
            h.process.join(5)

    def _recycle_if_needed(self, in_rings: Sequence[int], watch: bool) -> None:
        """Replace workers past their memory, open-files or batch budget, between batches: a
        STOP frame goes behind the work already in the ring and nothing more is written after
        it. ``watch``: look at the processes too (psutil), every _WATCH_S."""
        for h in self.pool.handles:
            life = self.lives[h.index]
            if not h.alive or life.state is not State.READY or life.kill is not None or life.retiring \
                    or life.stop_due:
                continue
            reason = None
            if self._budget_spent(h, in_rings[h.index]):
                reason = f"{h.board.batches} batches done, {in_rings[h.index]} more in its ring"
            elif watch:
                try:
                    reason = self._over_limits(psutil.Process(h.pid))
                except (psutil.Error, OSError):  # OSError: out of descriptors (EMFILE) itself
                    continue
            if reason:
                life.stop_due = reason
                log.info("recycling worker", extra={"worker": h.index, "incarnation": h.incarnation,
                                                    "pid": h.pid, "why": reason})

    def stops_due(self) -> list[int]:
        """Workers that must read a STOP frame behind the work in their rings and exit (recycled
        or retired). The scheduler writes it, the one writer of rings; until it has, nothing
        more is written to that ring (its allowance() is 0), and it is asked again each tick."""
        return [h.index for h in self.pool.handles
                if self.lives[h.index].stop_due and h.alive and self.lives[h.index].kill is None]

    def stop_written(self, i: int) -> None:
        """Worker i's STOP frame is in its ring: it finishes what is ahead of it, then exits."""
        life = self.lives[i]
        life.state, why, life.stop_due = State.RETIRING, life.stop_due, None
        log.debug("stop frame written", extra={"worker": i, "pid": self.pool.handles[i].pid, "why": why})

    def _over_limits(self, proc: psutil.Process) -> str | None:
        if self.w.max_rss_mb:
            rss_mb = proc.memory_info().rss / 2**20
            if rss_mb > self.w.max_rss_mb:
                return f"RSS {rss_mb:.0f} MiB over {self.w.max_rss_mb} MiB"
        limit = proc.rlimit(psutil.RLIMIT_NOFILE)[0]
        if limit > 0:
            fds = proc.num_fds()
            if fds >= _FD_RECYCLE_SHARE * limit:
                return (f"{fds} open files of its limit of {limit} (RLIMIT_NOFILE; recycled at "
                        f"{_FD_RECYCLE_SHARE:.0%}: does the plugin leak descriptors?)")
        return None

    # ------------------------------------------------------------------ deaths
    def _reap(self, h: S, in_ring: int) -> Death:
        life = self.lives[h.index]
        life.stop_due = None  # a STOP frame for a dead worker's ring is owed to nobody
        was_ready = h.board.ready
        batch, _slot = h.board.current
        during = DOING.get(h.board.phase, "") if batch else ""
        settling = h.board.settling
        if settling:  # waiting for the acknowledgements of the batch before (pipelined delivery)
            batch, during = settling, DOING[PHASE_SETTLE]
        # INVARIANT (8): a death in any phase of a batch counts against it, or a record whose
        # outputs (or dead letters, or anything after process() returned) kill the worker would
        # be run again for ever, never bisected, never dead-lettered, its partition stuck. A
        # batch the worker reported before it died is no longer out (drain() read the report),
        # so a death after the report blames nothing.
        blamed = batch if batch and (life.kill is None or life.kill_blames_batch) else None
        pid = h.pid
        if was_ready and life.state is State.STARTING:
            self._became_ready(h, life)  # ready and dead within one tick
        incarnation = h.incarnation
        finished_a_batch = h.board.batches > 0
        code = self.pool.forget(h)
        level, words = describe_exit(code)
        if life.kill is not None:
            # Our own kill, not an OOM kill or a crash: say so, and why.
            how = (f"exited with status {code}" if code is not None and code >= 0
                   else signal.Signals(-code).name if code is not None and -code in signal.valid_signals()
                   else "gone")
            level, words = logging.WARNING, f"killed by the supervisor ({how}): {life.kill}"
        life.last_exit = words
        # Recycled: it read its STOP frame and exited 0, idle. Exiting 0 in the middle of a
        # batch (a plugin's os._exit(0)) is a crash like any other, or that record would loop forever.
        recycled = life.state is State.RETIRING and code == 0 and not batch and not h.board.delivering
        exhausted = life.exhausted is not None and was_ready and life.kill is None
        cause = (ExitCause.RECYCLED if recycled else ExitCause.EXHAUSTED if exhausted
                 else ExitCause.START_FAILURE if not was_ready
                 else ExitCause.KILLED if life.kill is not None else ExitCause.CRASHED)
        version = life.version
        if self.stopping:
            life.state = State.STOPPED
            return Death(h.index, blamed, words, version, during)
        if life.retiring or (life.probation and not finished_a_batch):
            return self._gone(h, life, words, level, recycled, was_ready, blamed, during)
        life.exits[cause] = life.exits.get(cause, 0) + 1
        life.probation = False  # it finished a batch: it passed, and died later like any worker
        if recycled:
            log.info("worker recycled", extra={"worker": h.index, "incarnation": incarnation, "pid": pid})
            life.state, life.restart_at = State.RESTARTING, self.clock()
            return Death(h.index, None, words, version)
        if exhausted:
            first = life.exhausted_batch
            words = f"ran out of {life.exhausted}" + (" in its first batch" if first else "")
            life.last_exit = words
            if first is None:
                # INVARIANT (8): the worker's own leak fails no record: its batches, the one it
                # ran out in included, go back to their lanes uncounted, for a fresh worker.
                log.warning(f"worker replaced: it {words}; its batches run again on a new one",
                            extra={"worker": h.index, "pid": pid})
                life.state, life.restart_at = State.RESTARTING, self.clock()
                return Death(h.index, None, words, version)
            log.error(f"worker {words}: that batch exhausts a fresh worker and counts as a crash",
                      extra={"worker": h.index, "pid": pid})
            life.crashes += 1
            self._restart_later(life, life.crashes)
            return Death(h.index, first, words, version, during)
        if not was_ready:
            self._start_failed(h, life, words)
            return Death(h.index, None, words, version)
        log.log(level, f"worker {words}", extra={"worker": h.index, "incarnation": incarnation, "pid": pid,
                                                 "exitcode": code, "during": during or "between batches",
                                                 "batches_in_flight": in_ring})
        life.crashes += 1
        self._restart_later(life, life.crashes)
        return Death(h.index, blamed, words, version, during)

    def _gone(self, h: S, life: Life, words: str, level: int, recycled: bool, was_ready: bool,
              crashed_batch: int | None, during: str) -> Death:
        """A retiring worker, or one on probation that never finished a batch: its slot is
        spare, nothing restarts it. Its batches go back to their lanes all the same."""
        if life.probation:
            during = "" if was_ready else " during start-up"
            life.start_failure = life.reported or f"worker {words}{during}"
            log.error("new worker failed; not restarted", extra={
                "worker": h.index, "why": life.start_failure, "version": life.version})
            crashed_batch = None  # the new code's fault, not the record's: no crash counted
        elif recycled or not was_ready:
            log.info("worker retired", extra={"worker": h.index, "why": life.retiring})
        else:
            log.log(level, f"retiring worker {words}", extra={"worker": h.index, "why": life.retiring})
        life.state, life.restart_at, life.probation = State.SPARE, None, False
        return Death(h.index, crashed_batch, words, life.version, during)

    def _start_failed(self, h: S, life: Life, words: str) -> None:
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
            "worker": h.index, "incarnation": h.incarnation, "why": why, "attempt": life.start_failures,
            "plugin_started_before": self.started_once})
        self._restart_later(life, life.start_failures)

    def _restart_later(self, life: Life, failures: int) -> None:
        wait = backoff_s(self.w.restart_backoff_s, failures - 1, self.w.restart_backoff_max_s)
        life.state, life.restart_at = State.RESTARTING, self.clock() + wait

    # ------------------------------------------------------------------ stop
    def stop_all(self, timeout_s: float) -> None:
        self.stopping = True
        self.pool.stop_all(timeout_s)
        for life in self.lives:
            if life.state is not State.SPARE:
                life.state = State.STOPPED
