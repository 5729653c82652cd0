"""The supervisor: one thread, one loop, every decision about fetching, dispatch, fencing,
pausing and committing taken in one place, so the races between them cannot happen.

    broker ─consume()─▶ intake: runs per partition ─cut─▶ scheduler: lanes ─▶ worker rings
                        (flow control pauses what is over its share of the backlog)
    worker result pipes ─▶ results: effects ─▶ partitions: offset trackers ─▶ commits
    worker deaths ─▶ workforce: restart ─▶ results: crash isolation, batches back in their lanes

The Supervisor tells the story (``tick``: one named step after another, docs/design.md draws
them); the rooms act, each on what it holds, and the partitions change themselves
(runtime/supervisor/partition/partition.py):

    intake.py       what consume() returned, cut into batches
    scheduler.py    which worker runs which batch        (lanes, batches in rings)
    table.py        the partitions held, their slots     (each a Partition: its life)
    starts.py       where each partition is read from    (starts, rewinds read again)
    flowcontrol.py  backpressure, every pause/resume     (what the client is told)
    results.py      what a report means, as effects      (counters)
    applier.py      effects applied, result pipes read
    workforce.py    worker start-up, deaths, restarts    (each worker's life)
    rebalance.py    the rebalance callbacks: a revocation's release inside one, the rest
                    recorded for the loop's rebalance step
    operator.py     operator pauses applied to partitions
    rollout.py      reload and resize: workers replaced or added while records flow
    commands.py     the control socket's requests and SIGHUP/SIGTTIN/SIGTTOU, one at a time
    commits.py, deadletter_desk.py, caught_up.py, report.py, waits.py

The loop calls ``consume()`` itself; rebalance callbacks run inside it on this same thread.
Signal handlers only enqueue; the loop handles them between steps.

Runs in: the supervisor process.
"""

from __future__ import annotations

import gc
import logging
import os
import select
import time
from collections.abc import Callable
from typing import Generic

from runtime.config import Settings
from runtime.errors import RingmasterError
from runtime.kafka.consumer import Fetched
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
from runtime.supervisor.daemon.report import Reporter, Sections
from runtime.supervisor.daemon.waits import Waits
from runtime.supervisor.datapath.applier import Applier
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.flowcontrol import FlowControl
from runtime.supervisor.datapath.intake import BatchIds, Intake, Shape, Sizing
from runtime.supervisor.datapath.release import Release
from runtime.supervisor.datapath.results import Results, Rules
from runtime.supervisor.datapath.starts import Starts
from runtime.supervisor.group.caught_up import CaughtUp
from runtime.supervisor.group.commits import committer_for
from runtime.supervisor.group.rebalance import Rebalance, Released
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.partition.table import PartitionTable, SlotTable
from runtime.supervisor.scheduling.capacity import Capacity
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer, share_acks
from runtime.supervisor.seams.pool import H, LoopPool
from runtime.supervisor.workers.pool import become_subreaper
from runtime.supervisor.workers.workforce import Workforce
from runtime.tp import TP
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


class Supervisor(Generic[H]):
    """The loop, built on its collaborators (consumer, pool, epoch table, clock, sleep): tests and
    the simulator (scripts/benchkit/sim) pass fakes, ``run_daemon`` the real ones (seams/)."""

    def __init__(self, settings: Settings, consumer: Consumer, pool: LoopPool[H], epochs: EpochTable, *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 on_status: Callable[[StatusSnapshot], None] | None = None,
                 dead_letters: DeadLetterDesk | None = None, pauses: OperatorPauses | None = None,
                 histograms: Histograms | None = None, notifier: Notifier | None = None,
                 status_file: StatusFile | None = None, control: RequestSource | None = None,
                 reread: Callable[[], Settings] | None = None, signals: SignalQueue | None = None) -> None:
        self.s = settings
        self.clock = clock
        self.sleep = sleep
        self.consumer = consumer
        self.pool = pool
        self.on_status = on_status
        self.notifier = notifier or Notifier()
        self.status_file = status_file or StatusFile(settings.supervisor.status_file)
        self.dead_letters = dead_letters
        self.histograms = histograms
        w = settings.workers
        sup = settings.supervisor
        share = settings.kafka.group_type == "share"
        ring = pool.handles[0].ring
        ids = BatchIds()
        sizing = Sizing(w.batch_max_records, w.batch_target_ms, ring.max_frame, ring.capacity)
        # Exactly-once: a record set aside at intake is dead-lettered in its lane's transactions.
        eos_letters = settings.output.guarantee == "exactly-once" and not share
        letter_bytes = dead_letters.max_bytes if dead_letters is not None else None
        # Rooms are built bottom up, each given what it reads; none is handed a function of
        # another: what one room needs of another, the loop asks and hands on each tick.
        self.workforce = Workforce(w, settings.output.delivery_timeout_s, pool, clock)
        pipelined = w.pipelined_delivery and settings.output.guarantee != "exactly-once"
        self.scheduler = Scheduler(pool.handles, ordered=w.ordering != "unordered", slots=pool.max_slots,
                                   pipelined=pipelined)
        self.partitions = PartitionTable(SlotTable(epochs), consumer, self.scheduler, clock,
                                         w.batch_max_records, share)
        # Key lanes per partition (process_limit): fixed for the run (a key keeps its lane across resizes).
        self.acks = share_acks(consumer)  # a share group's consumer: its lock, its letters' guard
        shape = Shape(w, sizing, share, w.process_limit, letter_bytes if eos_letters else None,
                      self.acks.lock_s if self.acks is not None else None)
        self.intake = Intake(shape, consumer, self.partitions, ids, clock)
        self.flow = FlowControl(w, consumer, self.partitions, self.intake, self.scheduler, ring.capacity,
                                clock)
        self.starts = Starts(consumer, self.partitions, self.scheduler, clock)
        rules = Rules(settings.output, settings.dead_letter.max_crashes, pool.max_slots, letter_bytes,
                      ring.max_frame)
        self.results = Results(rules, self.partitions, self.scheduler, ids, clock)
        self.applier = Applier(self.results, self.workforce, pool.handles, self.scheduler, dead_letters,
                               histograms, sizing, clock)
        self.rollout = Rollout(settings, self.workforce, self.scheduler, self.flow, reread, clock)
        self.commands = Commands(control, self.rollout)
        self.commits = committer_for(share, consumer, self.partitions, sup.commit_interval_ms / 1000, clock,
                                     sup.revoke_timeout_s, settings.output.guarantee == "exactly-once")
        self.operator = OperatorHolds(pauses, self.partitions)
        self.caught_up = CaughtUp(sup, consumer, self.partitions, self.intake, self.scheduler,
                                  self.workforce, clock, self.commits.transactional)
        release = Release(self.partitions, self.applier, pool.handles, self.scheduler, self.workforce, clock)
        self.rebalance = Rebalance(sup.revoke_timeout_s, release, self.commits, clock)
        self.reporter = Reporter(settings.kafka.group_id, w.ordering, consumer, pool.handles, clock)
        self.waits = Waits(w.batch_max_wait_ms)
        self.signals = SignalHandlers(signals or SignalQueue())
        self.stopping = False
        self.exit_error: RingmasterError | None = None  # a clean stop that still exits non-zero
        self.stop_reason = "stopped"  # why, for the final status: a signal, caught up
        self.final_status: StatusSnapshot | None = None
        self.stop_deadline: float | None = None  # by when a stop begun must be done (clock time)
        self.latest_status: StatusSnapshot | None = None
        self._last_tick = clock()
        self._last_status = 0.0
        self._last_watchdog = 0.0

    # ------------------------------------------------------------------ the story
    def run(self) -> int:
        """Run until stopped by a signal or (optionally) caught up. Returns the exit code;
        raises RingmasterError for a stop the user must act on."""
        self.signals.queue.install()
        try:
            self.start()
            while not self.stopping:
                self.tick()
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

    def tick(self) -> None:
        """One turn of the loop, step by step (docs/design.md, "The tick")."""
        self._last_tick = self.clock()
        self.handle_signals()
        self.apply_operator_pauses()
        # What the workers can take as the tick begins: the wait and the cut go by it.
        capacity = self.capacity()
        wanted = self.intake.within_the_lock(self.flow.records_wanted())
        fetched = self.fetch(capacity, wanted)
        drained = fetched.count < wanted  # the client had nothing more queued (counted before settling)
        self.rebalanced(fetched)
        self.starts.retry(fetched)
        self.check_fatal()
        self.take(fetched)
        self.cut(capacity, drained)
        self.applier.collect()  # results just before placing: a worker done must not look full
        self.scheduler.dispatch(self.capacity())  # so placing asks for the workers' room anew
        self.manage_workers()
        self.commands.step()
        self.deliver_dead_letters()
        self.starts.read_again()
        self.flow.reconcile()
        self.scheduler.set_behind(self.intake.lag())  # lanes' weights: work left (every 50 ms)
        self.commits.commit_if_due()
        self.report_if_due()
        self.stop_if_caught_up()

    def start(self) -> None:
        become_subreaper()
        self.workforce.start_all()
        self.report_if_due(force=True)  # a snapshot before /readyz can say 200: /status never 503 then
        self.operator.load()
        self.subscribe()
        _quiet_gc()
        self.notifier.notify("READY=1", f"STATUS=consuming {', '.join(self.s.kafka.topics)}")
        log.info("supervisor started", extra={
            "group": self.s.kafka.group_id, "topics": ",".join(self.s.kafka.topics),
            "workers": self.s.workers.processes, "plugin": self.s.workers.plugin, "pid": os.getpid(),
            "ordering": self.s.workers.ordering, "start_method": self.s.workers.start_method,
            "frame_packer": "C" if PACK.in_c else f"Python ({PACK.why_python})"})

    def subscribe(self) -> None:
        """Join the group: librdkafka calls the rebalance callbacks from inside consume() from
        now on (rebalance.py). A share group's consumer announces partitions as their records
        come: no rebalance, so not counted as one."""
        rebalance = self.rebalance
        on_assign = rebalance.on_announce if self.s.kafka.group_type == "share" else rebalance.on_assign
        self.consumer.subscribe(self.s.kafka.topics, on_assign, rebalance.on_revoke, rebalance.on_lost)

    # ------------------------------------------------------------------ steps
    def handle_signals(self) -> None:
        """What the signals that arrived ask for (signals.py), each handed to the room that does it."""
        for asked in self.signals.dispatch():
            if asked.intent is Intent.STOP:
                self.stop_reason = f"{self.signals.stop_requested} received"
                self.stopping = True
            elif asked.intent is Intent.LOG_STATUS:
                log_status(self.latest_status)
            else:
                self.commands.on_signal(asked)

    def apply_operator_pauses(self) -> None:
        """The control topic followed; a partition an operator paused stops fetching now."""
        if self.operator.apply():
            self.flow.pause_held()

    def capacity(self) -> Capacity:
        """What the workers can take now (scheduling/capacity.py), the workforce's allowance in it."""
        return self.scheduler.capacity(self.workforce.allowance())

    def fetch(self, capacity: Capacity, wanted: int) -> Fetched:
        """Wait for what unblocks the tick (waits.py), then take what the client has queued, at
        most ``wanted`` records. Rebalance callbacks run inside consume()."""
        held = self.partitions.values()
        open_records = any(p.intake.open_msgs and not p.held for p in held)
        fetching = not self.partitions.assigned_once or any(not p.pause.paused for p in held)
        # Quiet: nothing a turn moves on (waits.py): no batch cut or in a ring, no offset owed,
        # no dead letter unacknowledged, no partition waiting for its start or rewound, no
        # command in progress; never in a batch run, whose end is judged every turn.
        quiet = (not self.caught_up.enabled and not self.scheduler.waiting_for_room()
                 and not any(self.scheduler.counts()) and not self.commits.owes() and self.commands.idle
                 and not (self.dead_letters is not None and self.dead_letters.pending())
                 and not any(p.seeking or p.rewinding for p in held))
        wait = self.waits.plan(capacity, open_records, fetching, quiet)
        if wait.workers_s is not None:
            self._wait_for_workers(wait.workers_s)
        fetched = self.consumer.consume(wanted, wait.consume_s)
        self.waits.fetched(fetched.count, wanted)
        return fetched

    def rebalanced(self, fetched: Fetched) -> None:
        """What librdkafka asked for inside consume(), applied now that it returned; then the
        partitions it touched start at their committed offsets, and what consume() returned
        for them is dropped (starts.py, the straddle)."""
        self.starts.settle(fetched, self.apply_rebalance())

    def apply_rebalance(self) -> set[TP]:
        """The changes the rebalance callbacks (or the stop) recorded, in order: the partitions
        they touched."""
        touched: set[TP] = set()
        for change in self.rebalance.take():
            touched.update(change.tps)
            if isinstance(change, Released):
                touched.update(self._released(change))
                continue
            new, over = self.partitions.assign(change.tps)
            self.operator.hold_new(new)
            self.flow.assigned(new, over)
            log.info("partitions assigned", extra={"partitions": ",".join(p.label for p in new),
                                                   "paused": sum(p.pause.paused for p in new)})
        return touched

    def _released(self, change: Released) -> list[TP]:
        """What a release left: the judge of a batch run hears what each partition came to, its
        dead letters are the next owner's to write, and slots it freed go to partitions held
        over capacity, which start as newly assigned ones do. The partitions taken in."""
        if not change.parts:
            return []
        parts = list(change.parts)
        self.caught_up.on_released(parts, change.answers)
        if self.dead_letters is not None:
            for p in parts:
                self.dead_letters.forget(p.tp)
        adopted = self.partitions.adopt()
        if adopted:
            self.operator.hold_new(adopted)
            self.flow.take_over(adopted)
        return [p.tp for p in adopted]

    def check_fatal(self) -> None:
        """A worker that could not start the plugin stops the daemon (workforce.py)."""
        if self.workforce.fatal is not None:
            raise self.workforce.fatal

    def take(self, fetched: Fetched) -> None:
        """What consume() returned, handed to each partition (intake.py)."""
        if self.intake.take(fetched):
            self.reporter.first_record_seen()

    def cut(self, capacity: Capacity, drained: bool) -> None:
        """Fetched records cut into batches for the scheduler's lanes; what fits in no ring is
        dead-lettered before anything is placed (without a dead-letter topic the partition
        stops at such a record, and the batches cut after it must not reach a ring)."""
        cut = self.intake.cut(capacity, drained)
        self.scheduler.enqueue(cut.batches)
        self.applier.apply(self.results.set_aside(cut.set_aside))

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
            self.applier.drain(h)
        for death in self.workforce.manage(dead, self.scheduler.counts()):
            self.applier.apply(self.results.redeliver(
                death, self.acks.may_dead_letter if self.acks is not None else None))
        for i in self.workforce.stops_due():
            if self.scheduler.write_stop(i):
                self.workforce.stop_written(i)
        self.check_fatal()

    def deliver_dead_letters(self) -> None:
        """The dead letters the supervisor writes: what is due sent, the acknowledged ones handled."""
        if self.dead_letters is not None:
            self.applier.apply(self.results.letters_delivered(self.dead_letters.poll()))

    def report_if_due(self, force: bool = False, held: list[Partition] | None = None,
                      final: Stopped | None = None) -> None:
        """``held``: the partitions to show instead of those held now (the final snapshot shows
        what was held when the stop began)."""
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
        snapshot = self.reporter.snapshot(self.sections(held), now - self._last_tick, self.ready(), stopped)
        if final is not None:
            snapshot = final_snapshot(snapshot, final)
        self.latest_status = snapshot
        self.status_file.write(snapshot)
        if self.on_status is not None:
            self.on_status(snapshot)

    def sections(self, held: list[Partition] | None = None) -> Sections:
        """Each room's snapshot, for the status (report.py)."""
        return Sections(
            list(self.partitions.values()) if held is None else held, dict(self.partitions.over_capacity),
            self.intake.snapshot(), self.scheduler.snapshot(), self.results.snapshot(),
            self.workforce.snapshot(), self.commits.snapshot(), self.rebalance.snapshot(),
            self.operator.snapshot(), self.rollout.snapshot(),
            self.dead_letters.pending() if self.dead_letters is not None else 0)

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
        return self.workforce.started_once and self.partitions.assigned_once and not self.stopping

    def loop_age(self) -> float:
        """Seconds since the loop last went round. Runs in: any thread."""
        return max(0.0, self.clock() - self._last_tick)

    # ------------------------------------------------------------------ stop
    def settle_dead_letters(self, until: float) -> None:
        """Stopping: dead letters on their way are waited for until ``until`` (a short wait),
        so that their records are committed now rather than read again by the next owner."""
        while self.dead_letters is not None and self.dead_letters.pending() and self.clock() < until:
            self.deliver_dead_letters()
            self.sleep(0.02)

    def shutdown(self) -> None:
        """Stop fetching, finish only the batches in progress, fence the rest, commit, leave
        the group, stop the workers. Like a revocation, the time this takes is bounded by
        one batch (or revoke_timeout_s), not by how much work waits in the rings: batches
        still in rings are not committed, so the partitions' next owner reads them again."""
        deadline = self.stop_deadline = self.clock() + self.s.supervisor.shutdown_timeout_s
        self.notifier.notify("STOPPING=1")
        self.consumer.stop()
        self.commands.close("the daemon is stopping")
        self.apply_rebalance()  # an assignment a consume() that then raised recorded: released below
        self.flow.pause_all()
        self.settle_dead_letters(min(deadline, self.clock() + 2.0))
        held = list(self.partitions.values())
        over = list(self.partitions.over_capacity)
        self.rebalance.release(list(self.partitions) + over, commit=True, why=_STOPPING)  # over capacity too
        self.apply_rebalance()  # what the release left: the judge of the run hears of it
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
