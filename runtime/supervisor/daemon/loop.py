"""The supervisor: one thread, one loop, every decision about fetching, dispatch, fencing,
pausing and committing taken in one place, so the races between them cannot happen.

    broker ─consume()─▶ intake: runs per partition ─cut─▶ scheduler: lanes ─▶ worker rings
                        (flow control pauses what is over its share of the backlog)
    worker result pipes ─▶ results: offset trackers ─▶ commits (async, periodic; sync on revoke/stop)
    worker deaths ─▶ workforce: restart ─▶ results: crash isolation, batches back in their lanes

The Supervisor coordinates; the rooms act, each the one writer of its state:

    intake.py       fetch, cut batches                  (fetched records, batch sizing)
    scheduler.py    which worker runs which batch       (lanes, batches in rings)
    assignment.py   partitions, fencing, rewinds        (the partition table, epochs)
    flowcontrol.py  holds, backpressure, pause/resume   (what the client is told)
    results.py      results, deaths, dead-letter routing (counters)
    workforce.py    worker start-up, deaths, restarts   (each worker's life)
    rebalance.py    the rebalance story (assign, revoke, lose)
    operator.py     operator pauses applied to partitions
    rollout.py      reload and resize: workers replaced or added while records flow
    commands.py     the control socket's requests and SIGHUP/SIGTTIN/SIGTTOU, one at a time
    commits.py, deadletter_desk.py, caught_up.py, report.py

Rebalance callbacks run inside ``consume()`` on this same thread. Signal handlers only
enqueue; the loop handles them between steps.

Runs in: the supervisor process.
"""

from __future__ import annotations

import functools
import gc
import logging
import os
import select
import time
from collections.abc import Callable
from typing import Generic

from runtime.config import Settings
from runtime.errors import RingmasterError
from runtime.ops.admin_server import Health
from runtime.ops.backstop import last_resort
from runtime.ops.control import OperatorPauses
from runtime.ops.metrics import Histograms
from runtime.ops.status import StatusFile, StatusSnapshot, Stopped, final_snapshot
from runtime.ops.systemd import Notifier
from runtime.ops.topic_commands import RequestSource
from runtime.supervisor.control.commands import Commands
from runtime.supervisor.control.operator import OperatorHolds
from runtime.supervisor.control.rollout import Rollout
from runtime.supervisor.control.signals import Intent, SignalHandlers, SignalQueue, log_status
from runtime.supervisor.daemon.report import Reporter
from runtime.supervisor.datapath.assignment import Assignment, SlotTable
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.flowcontrol import FlowControl
from runtime.supervisor.datapath.intake import BatchIds, Intake
from runtime.supervisor.datapath.results import Results
from runtime.supervisor.group.caught_up import CaughtUp
from runtime.supervisor.group.commits import committer_for
from runtime.supervisor.group.rebalance import Rebalance
from runtime.supervisor.partition.partition import Partition, Partitions
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer
from runtime.supervisor.seams.pool import H, LoopPool
from runtime.supervisor.workers.pool import become_subreaper
from runtime.supervisor.workers.workforce import Workforce
from runtime.transport.board import EpochTable
from runtime.transport.packing import PACK

log = logging.getLogger("ringmaster.supervisor")

_GC_THRESHOLD = 50_000  # young-generation GC threshold in the supervisor (see _quiet_gc())
# The close's own deadline (a helper thread) comes first; this one only if Python cannot run.
_LAST_RESORT_GRACE_S = 2.0
_GAVE_UP = ("leaving the consumer group did not finish and the Kafka client holds the interpreter; exiting "
            "without it (offsets were committed before; the workers end with the supervisor; the broker "
            "drops this member after session.timeout.ms)")
_STOPPING = "partitions released: the daemon is stopping"  # not "revoked": the group took nothing
_IDLE_WAIT_S = 0.02  # the longest a tick waits for records or results
# ... but Intake.hungry_wait_s (1 ms after records came, doubling while fetches bring none)
# while batches wait for their lanes' busy workers and another worker has next to nothing
# to do: the records a fetch may bring are work for it, and the client's wait cannot be woken
# by a result. Not whenever some worker has room: on 2 cores a loop turning every millisecond
# takes CPU the workers need (issue 24).


class Supervisor(Generic[H]):
    """The loop, built on its collaborators (consumer, pool, epoch table, clock, sleep): tests and
    the simulator (scripts/benchkit/sim) pass fakes, ``run_daemon`` the real ones (seams.py)."""

    def __init__(self, settings: Settings, consumer: Consumer, pool: LoopPool[H], epochs: EpochTable, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 on_status: Callable[[StatusSnapshot], None] | None = None,
                 dead_letters: DeadLetterDesk | None = None, pauses: OperatorPauses | None = None,
                 histograms: Histograms | None = None, notifier: Notifier | None = None,
                 status_file: StatusFile | None = None, control: RequestSource | None = None,
                 reread: Callable[[], Settings] | None = None, signals: SignalQueue | None = None) -> None:
        self.s, w, self.sleep = settings, settings.workers, sleep
        self.clock, self.consumer, self.pool, self.on_status = clock, consumer, pool, on_status
        self.notifier = notifier or Notifier()
        self.status_file = status_file or StatusFile(settings.supervisor.status_file)
        self.partitions: Partitions = {}
        ring, ids, share = pool.handles[0].ring, BatchIds(), settings.kafka.group_type == "share"
        # Rooms are built bottom up, each given what it reads; none is handed a function of
        # another: what one room needs of another, the loop asks and hands on each tick.
        self.workforce = Workforce(w, settings.output.delivery_timeout_s, pool, clock)
        self.scheduler = Scheduler(pool.handles, ordered=w.ordering != "unordered", slots=pool.max_slots)
        # Key lanes per partition: fixed for the run (a key keeps its lane across resizes).
        # Exactly-once: a record set aside at intake is dead-lettered in its lane's transactions.
        in_lane = (dead_letters.max_bytes if settings.output.guarantee == "exactly-once"
                   and dead_letters is not None and not share else None)
        self.intake = Intake(w, share, consumer, self.partitions, w.process_limit, ring.capacity,
                             ring.max_frame, ids, clock, in_lane)
        self.flow = FlowControl(w, consumer, self.partitions, self.intake, self.scheduler,
                                ring.capacity, clock)
        self.assignment = Assignment(w.batch_max_records, share, consumer, self.partitions, SlotTable(epochs),
                                     self.intake, self.scheduler, self.flow, clock)
        self.results = Results(settings.output, settings.dead_letter.max_crashes, self.partitions,
                               pool.handles, self.scheduler, self.workforce, self.assignment, self.intake,
                               dead_letters, ids, histograms, clock)
        self.rollout = Rollout(settings, self.workforce, self.scheduler, self.flow, reread, clock)
        self.commands = Commands(control, self.rollout)
        sup = settings.supervisor
        self.commits = committer_for(share, consumer, self.partitions,
                                     sup.commit_interval_ms / 1000, clock, sup.revoke_timeout_s,
                                     settings.output.guarantee == "exactly-once")
        self.operator = OperatorHolds(pauses, self.partitions, self.assignment, self.flow)
        self.caught_up = CaughtUp(sup, consumer, self.partitions, self.intake, self.assignment,
                                  self.workforce, clock, self.commits.transactional)
        self.rebalance = Rebalance(sup.revoke_timeout_s, self.assignment, self.flow, self.operator,
                                   self.results, self.commits, self.caught_up, self.scheduler, self.workforce,
                                   pool.handles, dead_letters, clock)
        self.reporter = Reporter(settings.kafka.group_id, w.ordering, consumer, self.partitions, pool.handles,
                                 self.intake, self.scheduler, self.results, self.workforce, self.commits,
                                 self.rebalance, self.operator, self.rollout, dead_letters, clock)
        self.dead_letters, self.histograms = dead_letters, histograms
        self.signals = SignalHandlers(signals or SignalQueue())
        self.stopping = False
        self.exit_error: RingmasterError | None = None  # a clean stop that still exits non-zero
        self.stop_reason = "stopped"  # why, for the final status: a signal, caught up
        self.final_status: StatusSnapshot | None = None
        self.stop_deadline: float | None = None  # by when a stop begun must be done (clock time)
        self.latest_status: StatusSnapshot | None = None
        self._last_tick, self._last_status, self._last_watchdog = clock(), 0.0, 0.0

    # ------------------------------------------------------------------ the story
    def run(self) -> int:
        """Run until stopped by a signal or (optionally) caught up. Returns the exit code;
        raises RingmasterError for a stop the user must act on."""
        self.signals.queue.install()
        try:
            self.start()
            while not self.stopping:
                self._last_tick = self.clock()
                self.handle_signals()
                self.operator.apply()
                self.fetch()
                allowance = self.workforce.allowance()
                hungry = functools.partial(self.scheduler.has_hungry, allowance)  # asked if a cut gathers
                self.scheduler.enqueue(self.intake.cut(self.scheduler.can_take_more(allowance), hungry))
                self.results.dead_letter_set_aside(self.intake.take_too_large())
                self.results.collect()  # just before placing: a worker done must not look full
                self.scheduler.dispatch(self.workforce.allowance())
                self.manage_workers()
                self.commands.step()
                self.results.deliver_dead_letters()
                self.assignment.tick()
                self.flow.reconcile()
                self.scheduler.set_behind(self.intake.lag())  # lanes' weights: work left (every 50 ms)
                self.commits.commit_if_due()
                self.report_if_due()
                self.stop_if_caught_up()
        except RingmasterError as exc:
            # A stop the user must act on (the plugin cannot start, a fatal Kafka error): it
            # still ends like any stop – batches in progress finish, what is done is committed,
            # the final status says why – and only then is it raised for the exit code.
            self.exit_error = exc
            log.critical(f"stopping: {exc}")
        try:
            self.shutdown()
        except RingmasterError as exc:
            log.error("stopping did not finish cleanly", extra={"error": str(exc)})
            self.exit_error = self.exit_error or exc
        if self.exit_error is not None:
            raise self.exit_error
        return 0

    def start(self) -> None:
        become_subreaper()
        self.workforce.start_all()
        self.report_if_due(force=True)  # a snapshot before /readyz can say 200: /status never 503 then
        self.operator.load()
        self.consumer.subscribe(self.s.kafka.topics, self.rebalance.on_assign, self.rebalance.on_revoke,
                                self.rebalance.on_lost)
        _quiet_gc()
        self.notifier.notify("READY=1", f"STATUS=consuming {', '.join(self.s.kafka.topics)}")
        log.info("supervisor started", extra={
            "group": self.s.kafka.group_id, "topics": ",".join(self.s.kafka.topics),
            "workers": self.s.workers.processes, "plugin": self.s.workers.plugin, "pid": os.getpid(),
            "ordering": self.s.workers.ordering, "start_method": self.s.workers.start_method,
            "frame_packer": "C" if PACK.in_c else f"Python ({PACK.why_python})"})

    def handle_signals(self) -> None:
        """What the signals that arrived ask for (signals.py), each handed to the room that does it."""
        for asked in self.signals.dispatch():
            if asked.intent is Intent.STOP:
                self.stop_reason, self.stopping = f"{self.signals.stop_requested} received", True
            elif asked.intent is Intent.LOG_STATUS:
                log_status(self.latest_status)
            else:
                self.commands.on_signal(asked)

    # ------------------------------------------------------------------ steps
    def fetch(self) -> None:
        """Take what the client has queued. A tick waits for what unblocks it: for results when
        batches wait for room in rings (cut() gives a worker with room whatever is open: only
        a result lets them go), else for records (the client returns as soon as one is there)."""
        open_msgs = any(p.intake.open_msgs and not p.held for p in self.partitions.values())
        waiting_for_room = open_msgs or self.scheduler.waiting_for_room()
        wait_s = min(self.s.workers.batch_max_wait_ms / 1000, _IDLE_WAIT_S) if open_msgs else _IDLE_WAIT_S
        wait_s = max(wait_s, 0.001)  # batch_max_wait_ms = 0 must not spin a core
        fetching = not self.assignment.assigned_once or any(
            not p.pause.paused for p in self.partitions.values())
        if waiting_for_room or not fetching:  # the idle wait, or less for a hungry worker (above)
            hungry = fetching and self.scheduler.has_hungry(self.workforce.allowance())
            self._wait_for_workers(self.intake.hungry_wait_s if hungry else wait_s)
        fetched = self.intake.fetch(self.flow.records_wanted(),
                                    wait_s if fetching and not waiting_for_room else 0)
        self.assignment.settle(fetched)
        self.assignment.retry_seeks()
        if self.workforce.fatal is not None:
            raise self.workforce.fatal
        first = self.intake.first_record_at
        self.intake.take(fetched)
        if first is None and self.intake.first_record_at is not None:
            self.reporter.first_record_seen()

    def _wait_for_workers(self, timeout_s: float) -> None:
        """Sleep until a worker reports or dies (a sentinel is a file descriptor)."""
        waitables = self.pool.result_fds() + self.pool.sentinels()
        if waitables:
            select.select(waitables, [], [], timeout_s)
        else:
            self.sleep(timeout_s)

    def manage_workers(self) -> None:
        """A dead worker's last results are read before it is reaped (acknowledgements sent
        before death count); the STOP frames the workforce wants are the scheduler's to write."""
        dead = self.workforce.dead()
        for h in dead:
            self.results.drain(h)
        for death in self.workforce.manage(dead, self.scheduler.counts()):
            self.results.redeliver(death)
        for i in self.workforce.stops_due():
            if self.scheduler.write_stop(i):
                self.workforce.stop_written(i)
        if self.workforce.fatal is not None:
            raise self.workforce.fatal

    def report_if_due(self, force: bool = False, held: list[Partition] | None = None,
                      final: Stopped | None = None) -> None:
        now = self.clock()
        interval = self.notifier.watchdog_interval_s
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            self.notifier.notify("WATCHDOG=1")
        if not force and now - self._last_status < self.s.supervisor.status_interval_s:
            return
        self._last_status = now
        for seconds in self.rebalance.take_timings():  # histograms show as of each snapshot
            if self.histograms is not None:
                self.histograms.observe_revocation(seconds)
        stopped = Stopped(self.exit_error.exit_code, str(self.exit_error)) if self.exit_error else None
        snapshot = self.reporter.snapshot(now - self._last_tick, self.ready(), stopped, held)
        if final is not None:
            snapshot = final_snapshot(snapshot, final)
        self.latest_status = snapshot
        self.status_file.write(snapshot)
        if self.on_status is not None:
            self.on_status(snapshot)

    def stop_if_caught_up(self) -> None:
        # The judge of the exit status speaks after the final commit (shutdown).
        if self.caught_up.should_stop(self.rebalance.rebalances):
            self.stop_reason = "caught up with the end of every assigned partition (--until-caught-up)"
            self.stopping = True

    # ------------------------------------------------------------------ health (any thread)
    def health(self) -> Health:
        """Liveness. Runs in: the admin server's thread: reads plain values only. Fails when
        the loop has not gone round within its bound (a rebalance may hold it for up to
        revoke_timeout_s: the bound is above that), when a worker is stuck and not yet
        replaced, or when a fatal error is stopping the daemon. Lag, outages, pauses and
        rebalances are not failures of liveness."""
        reasons = []
        age = self.loop_age()
        bound = max(self.s.admin.loop_stuck_s, self.s.supervisor.revoke_timeout_s + 10)
        if age > bound and not self.stopping:
            reasons.append(f"the supervisor's loop has not gone round for {age:.0f} s (bound {bound:g} s)")
        reasons += self.workforce.stuck()
        if self.exit_error is not None:
            reasons.append(f"stopping: {self.exit_error}")
        return Health(not reasons, reasons)

    def ready(self) -> bool:
        """Readiness: workers started and the group joined, and not stopping."""
        return self.workforce.started_once and self.assignment.assigned_once and not self.stopping

    def loop_age(self) -> float:
        """Seconds since the loop last went round. Runs in: any thread."""
        return max(0.0, self.clock() - self._last_tick)

    # ------------------------------------------------------------------ stop
    def shutdown(self) -> None:
        """Stop fetching, finish only the batches in progress, fence the rest, commit, leave
        the group, stop the workers. Like a revocation, the time this takes is bounded by
        one batch (or revoke_timeout_s), not by how much work waits in the rings: batches
        still in rings are not committed, so the partitions' next owner reads them again."""
        deadline = self.stop_deadline = self.clock() + self.s.supervisor.shutdown_timeout_s
        self.notifier.notify("STOPPING=1")
        self.consumer.stop()
        self.commands.close("the daemon is stopping")
        self.flow.pause_all()
        self.results.settle_dead_letters(min(deadline, self.clock() + 2.0), self.sleep)
        held, over = list(self.partitions.values()), list(self.assignment.over_capacity)
        self.rebalance.release(list(self.partitions) + over, commit=True, why=_STOPPING)  # over capacity too
        self.exit_error = self.exit_error or self.caught_up.verdict(held, self.signals.stop_requested, over)
        error = self.exit_error
        final = Stopped(error.exit_code, str(error)) if error else Stopped(0, self.stop_reason)
        self.report_if_due(force=True, held=held, final=final)
        self.final_status = self.latest_status
        _leave_group(self.consumer, self.pool, max(1.0, deadline - self.clock()), final)
        self.workforce.stop_all(max(1.0, deadline - self.clock()))
        restarts = sum(life.restarts for life in self.workforce.lives)
        log.info("supervisor stopped", extra={"records": self.results.totals.records, "restarts": restarts})


def _quiet_gc() -> None:
    """Every fetched record is a Message the cyclic GC tracks. With the default threshold (700
    net allocations) a collection runs inside nearly every consume() and walks thousands of
    live Messages: 1,139 collections and 100-130 ns per record on trivial work. Messages die
    once packed, so net allocations stay far below _GC_THRESHOLD and young collections all but
    stop; garbage cycles (rare here) are still collected once that many objects pile up.
    Freezing what start-up built (modules, config, clients) keeps full collections short."""
    gc.freeze()
    gc.set_threshold(_GC_THRESHOLD, *gc.get_threshold()[1:])


def _leave_group(consumer: Consumer, pool: LoopPool[H], close_s: float, final: Stopped) -> None:
    """Leave the group; nothing is assigned to revoke any more. Bounded: SIGTERM must end the
    process within shutdown_timeout_s whatever the group is doing, also when the client holds
    the GIL for good inside close() (runtime/ops/backstop.py)."""
    with last_resort(close_s + _LAST_RESORT_GRACE_S, final.code, log, _GAVE_UP,
                     {"timeout_s": round(close_s, 1), "stop": final.reason}, pool.segment_paths()):
        consumer.close(close_s)
