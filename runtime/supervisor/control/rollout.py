"""The rollout room: **reload** (new plugin code replaces the workers, one at a time) and
**resize** (more or fewer workers), while records flow. The supervisor is the group's only
member, so its workers can change under it without a rebalance: the group's generation does
not move, no partition is revoked. Runs in: supervisor, once per tick (through commands.py).

    reload ─▶ re-read the config file ─▶ canary: one new worker in a spare slot, on probation
                                          │ dies before it finished a batch (import, setup(),
                                          │ a crash on its first batch, setup_timeout_s)
                                          │   ─▶ rolled back: no old worker was touched; the
                                          │      daemon keeps its old code; reported as failed
                                          ▼ ready, and its first batch done (an idle topic:
                                            it waits for one; the old workers run meanwhile)
              one at a time, until every worker runs the new code:
              start a new worker in a spare slot ─▶ ready ─▶ retire an old one (it takes no more
              batches, finishes those in its ring, exits; its lanes move to other workers)
    resize ─▶ start the missing workers (on probation: one that cannot start is not retried,
              and the resize reports it), or retire the extra ones (they drain first)

What a reload applies: ``workers.plugin`` and ``workers.settings``, as new workers import and
set up the plugin again. Anything else that changed in the file needs a restart; the reply
names it. ``workers.processes`` is the resize's business (``ringmaster scale``).

"Crashes on start", the condition for a rollback, is: the canary dies before it has finished
a batch. Ready is not enough: with no traffic, the canary waits for its first batch (however
long: the old workers serve every other lane meanwhile), so a plugin that imports and sets up
but crashes on its first record is rolled back before it reaches any other worker. A new
version that fails later (a crash on a record after its first batch, after the switch) goes
the existing crash path: restart, isolation. A resize's new workers run the daemon's current
code: ready with nothing to do passes them.

Owns: the target (how many workers, which code), the operation in progress and the outcome
of the last ones. The workforce starts and retires workers; the scheduler keeps each lane on
one code generation at a time and never moves it back to an older one (scheduler.py); flow
control's budget follows the number of workers. One operation at a time: commands.py queues.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.config import Settings
from runtime.errors import RingmasterError
from runtime.ops.status import OperationStatus
from runtime.supervisor.datapath.flowcontrol import FlowControl
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import PluginCode
from runtime.supervisor.workers.workforce import State, Workforce

log = logging.getLogger("ringmaster.rollout")


class OpKind(enum.StrEnum):
    RELOAD = "reload"
    SCALE = "scale"


class OpState(enum.StrEnum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(eq=False)
class Operation:
    """One reload or resize. Written by Rollout only."""

    kind: OpKind
    requested_by: str  # "SIGHUP", "control socket", ...
    started_at: float  # clock
    started_ms: int  # wall clock, for people
    processes_from: int
    processes_to: int
    from_version: str | None
    to_version: str | None = None
    state: OpState = OpState.RUNNING
    message: str = ""
    finished_ms: int | None = None
    code: PluginCode | None = None  # reload: the new code
    canary: int | None = None  # reload: the first new worker's slot, until it passed
    started: set[int] = field(default_factory=set)  # slots this operation started
    probation: set[int] = field(default_factory=set)  # resize: started, not yet passed
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # reload: changed settings it does not apply

    @property
    def ok(self) -> bool:
        return self.state is OpState.SUCCEEDED

    def status(self) -> OperationStatus:
        return OperationStatus(self.kind.value, self.state.value, self.requested_by, self.started_ms,
                               self.finished_ms, self.message, self.from_version, self.to_version,
                               self.processes_from, self.processes_to)


@dataclass(frozen=True)
class RolloutView:
    """What the rollout reports (runtime/supervisor/daemon/report.py): the code the daemon
    runs, how many workers it aims at, the last reload and resize."""

    plugin: str
    plugin_version: str | None
    workers_target: int
    workers_max: int
    reload: OperationStatus | None
    scale: OperationStatus | None
    operations: dict[str, int]


# What a reload applies (the workers' plugin and its settings); anything else needs a restart.
_RELOADED = {"workers.plugin", "workers.settings"}


def not_applied(running: Settings, new: Settings, target: int) -> list[str]:
    """Keys whose value in the re-read config differs from what runs and a reload does not apply."""
    old_keys, new_keys = _leaves(running.model_dump()), _leaves(new.model_dump())
    notes = []
    for key in sorted(old_keys.keys() | new_keys.keys()):
        if key in _RELOADED or old_keys.get(key) == new_keys.get(key):
            continue
        if key == "workers.processes":
            if new.workers.processes != target:
                notes.append(f"workers.processes (use ringmaster scale; {target} run now)")
            continue
        notes.append(key)
    return notes


def _leaves(dump: dict[str, Any]) -> dict[str, Any]:
    """section.key -> value (tables like kafka.consumer or workers.settings count as one value)."""
    return {f"{section}.{key}": value for section, keys in dump.items() for key, value in keys.items()}


class Rollout:
    def __init__(self, settings: Settings, workforce: Workforce[Any], scheduler: Scheduler, flow: FlowControl,
                 reread: Callable[[], Settings] | None, clock: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        """``reread``: the daemon's config, read again (None: not started from a file)."""
        self.s = settings
        self.workforce = workforce
        self.scheduler = scheduler
        self.flow = flow
        self.reread = reread
        self.clock = clock
        self.wall = wall
        self.limit = settings.workers.process_limit
        self.target = settings.workers.processes
        self.code = workforce.code  # what the daemon runs: what restarts and new workers get
        self._generations = self.code.generation
        self._versions: dict[int, str] = {}  # generation -> the version its workers reported
        self.current: Operation | None = None
        self.last: dict[OpKind, Operation] = {}
        self.outcomes: dict[str, int] = {}  # "reload succeeded", "scale failed", ... (metrics)
        for i in range(settings.workers.processes):
            scheduler.new_worker(i, self.code.generation)

    # ------------------------------------------------------------------ questions
    @property
    def busy(self) -> bool:
        return self.current is not None

    def version_of(self, generation: int) -> str | None:
        """The plugin version workers of this generation reported (None before any did)."""
        if generation not in self._versions:
            for life in self.workforce.lives:
                if life.code is not None and life.code.generation == generation and life.version:
                    self._versions[generation] = life.version
                    break
        return self._versions.get(generation)

    @property
    def version(self) -> str | None:
        """The plugin version the daemon runs (a reload in progress changes it once its canary passed)."""
        return self.version_of(self.code.generation)

    def snapshot(self) -> RolloutView:
        last = {kind: op.status() for kind, op in self.last.items()}
        return RolloutView(self.code.plugin, self.version, self.target, self.limit, last.get(OpKind.RELOAD),
                           last.get(OpKind.SCALE), dict(self.outcomes))

    # ------------------------------------------------------------------ operations
    def reload(self, requested_by: str) -> Operation:
        """Begin a reload; the operation comes back finished (failed) if it cannot begin."""
        op = self._begin(OpKind.RELOAD, requested_by, self.target)
        if not self.workforce.started_once:
            return self._finish(op, False, "the daemon is still starting; reload once it is ready")
        if self.reread is None:
            return self._finish(op, False, "this daemon was not started from a config file")
        try:
            new = self.reread()
        except RingmasterError as exc:
            return self._finish(op, False, f"the config cannot be used, nothing changed: {exc}")
        op.notes = not_applied(self.s, new, self.target)
        self._generations += 1
        op.code = PluginCode(self._generations, new.workers.plugin, dict(new.workers.settings))
        slot = self.workforce.free_slot()
        assert slot is not None, "a spare slot is always there: max_processes + 1 slots"
        try:
            self._start(op, slot, op.code, probation=True)
        except RingmasterError as exc:
            return self._finish(op, False, f"cannot start the new code's first worker, nothing changed: "
                                           f"{exc}")
        op.canary = slot
        log.info("reload: first new worker started", extra={"worker": slot, "plugin": op.code.plugin,
                                                             "generation": op.code.generation})
        return op

    def scale(self, processes: int, requested_by: str) -> Operation:
        """Begin a resize to ``processes`` workers; comes back finished if refused (or nothing to do)."""
        op = self._begin(OpKind.SCALE, requested_by, processes)
        if processes < 1:
            return self._finish(op, False, f"cannot run {processes} workers: at least 1")
        if processes > self.limit:
            return self._finish(op, False, (
                f"cannot run {processes} workers: workers.max_processes is {self.limit} (raise it in the "
                f"config and restart; each worker slot holds a {self.s.workers.ring_bytes / 2**20:g} MiB "
                f"ring in {self.s.supervisor.shm_dir})"))
        if not self.workforce.started_once:
            return self._finish(op, False, "the daemon is still starting; resize once it is ready")
        self._set_target(processes)
        return op

    def _begin(self, kind: OpKind, requested_by: str, processes_to: int) -> Operation:
        assert self.current is None, "one operation at a time (commands.py queues)"
        op = Operation(kind, requested_by, self.clock(), int(self.wall() * 1000), self.target, processes_to,
                       self.version)
        self.current = self.last[kind] = op
        return op

    def _set_target(self, processes: int) -> None:
        self.target = processes
        self.flow.resize(processes)

    # ------------------------------------------------------------------ the tick
    def step(self) -> Operation | None:
        """Move the operation in progress on; return it once it is finished."""
        op = self.current
        if op is None:
            return None
        if op.canary is not None and not self._canary(op):
            return op if op.state is not OpState.RUNNING else None
        self._probation(op)
        if not self._converge(op):
            return None
        text = self._reloaded(op) if op.kind is OpKind.RELOAD else self._resized(op)
        return self._finish(op, not op.failures, text)

    def _canary(self, op: Operation) -> bool:
        """True once the reload's first new worker passed: the daemon runs the new code from
        then on. Rolls back (finishing the operation) if it failed."""
        assert op.canary is not None and op.code is not None
        life = self.workforce.lives[op.canary]
        if life.state is State.SPARE:
            # Nothing else changed: the old workers never stopped taking batches. The lanes
            # that ran on the canary go back to them.
            self.scheduler.lower_floors(self.code.generation)
            if self.workforce.pool.code_held(self.code.generation):
                holds = ("the workers it starts from now on (restarts, recycling, scale) run it too, from "
                         "the copy of its source taken when it started; fix the files, then reload")
            else:
                holds = ("its workers hold the old code in memory, but a worker that restarts or is added "
                         "imports the files on disk (no copy of the plugin's source could be kept: the log "
                         "says why): revert or fix them, then reload")
            self._finish(op, False, (
                f"the new plugin code cannot start: {life.start_failure}; rolled back: the daemon keeps "
                f"plugin {self.code.plugin!r} version {self.version}; {holds}"))
            return False
        # INVARIANT: the canary passes on a real batch finished, never on being idle: with no
        # traffic, setup() is all it proved, and a plugin that crashes on its first record must
        # not reach every worker before it met one. Meanwhile the old workers keep running.
        if not self._passed(op.canary, idle_passes=False):
            if life.state is State.READY and not op.message:
                op.message = (f"the new code (version {life.version}) started in worker {op.canary}, which "
                              "waits for its first batch: the old workers keep running until it has "
                              "finished one")
                log.info("reload: the canary is ready and waits for its first batch", extra={
                    "worker": op.canary, "version": life.version})
            return False
        op.to_version = life.version
        self.code = op.code
        op.canary = None
        log.info("reload: the new code runs; replacing the old workers one at a time", extra={
            "version": op.to_version, "previous": op.from_version})
        return True

    def _probation(self, op: Operation) -> None:
        """A resize's new workers: one that failed is not retried; the pool aims at one fewer."""
        for i in sorted(op.probation):
            life = self.workforce.lives[i]
            if life.state is State.SPARE:
                op.probation.discard(i)
                op.failures.append(f"worker {i} could not start: {life.start_failure}")
                self._set_target(self.target - 1)
            elif self._passed(i):
                op.probation.discard(i)

    def _passed(self, i: int, idle_passes: bool = True) -> bool:
        """A new worker on probation passes once ready and its first batch is done, or (a
        resize's, ``idle_passes``: it runs the code the daemon already runs) ready with nothing
        to do (an idle topic: no batch waits). The scheduler gives it a lane as soon as it is
        ready (its probe), so under load the first batch comes at once."""
        life = self.workforce.lives[i]
        if not life.probation:
            return life.state is State.READY
        if life.state is not State.READY or life.version is None:
            return False
        idle = idle_passes and not self.scheduler.count(i) and not self.scheduler.waiting_for_room()
        if self.workforce.finished_batches(i) > 0 or idle:
            self.workforce.confirm(i)
            return True
        return False

    def _converge(self, op: Operation) -> bool:
        """One step towards ``target`` workers all running ``self.code``; True when there."""
        lives = self.workforce.lives
        starting = [i for i in op.started if lives[i].state not in (State.READY, State.SPARE)]
        leaving = [i for i, life in enumerate(lives) if life.retiring and life.state is not State.SPARE]
        if starting or leaving or op.probation:
            return False  # one change at a time: the last one settles first (a new worker passes)
        in_use = self.workforce.in_use()
        old = [i for i in in_use if (lives[i].code or self.code).generation != self.code.generation]
        try:
            if len(in_use) > self.target:
                excess = len(in_use) - self.target if op.kind is OpKind.SCALE else 1
                for i in self._to_retire(in_use, old)[:excess]:
                    why = "replaced by the new plugin code" if i in old else "the pool is smaller now"
                    self.workforce.retire(i, why)
                    log.info("retiring worker", extra={"worker": i, "why": why})
            elif len(in_use) < self.target:
                for _ in range(self.target - len(in_use)):
                    self._start_spare(op, probation=op.kind is OpKind.SCALE)
            elif old:
                self._start_spare(op, probation=False)  # first the new one, then an old one goes
            else:
                return True
        except RingmasterError as exc:  # no room for another ring in shm_dir
            op.failures.append(str(exc))
            self._set_target(len(self.workforce.in_use()))
        return False

    def _to_retire(self, in_use: list[int], old: list[int]) -> list[int]:
        """Old code first; then workers that are not running (waiting for a restart); then the
        one with the least work queued."""
        lives = self.workforce.lives

        def key(i: int) -> tuple[bool, bool, int, int]:
            not_running = lives[i].state is State.RESTARTING
            return (i not in old, not not_running, self.scheduler.queued_records(i), -i)
        return sorted(in_use, key=key)

    def _start_spare(self, op: Operation, probation: bool) -> None:
        slot = self.workforce.free_slot()
        if slot is None:
            raise RingmasterError("no spare worker slot")
        self._start(op, slot, self.code, probation)

    def _start(self, op: Operation, slot: int, code: PluginCode, probation: bool) -> None:
        self.workforce.start(slot, code, probation)
        self.scheduler.new_worker(slot, code.generation, probe=probation)
        op.started.add(slot)
        if probation and op.kind is OpKind.SCALE:
            op.probation.add(slot)

    # ------------------------------------------------------------------ outcomes
    def _reloaded(self, op: Operation) -> str:
        n = len(self.workforce.in_use())
        same = " (unchanged)" if op.to_version == op.from_version else f" (was {op.from_version})"
        text = f"reloaded: {n} workers run plugin {self.code.plugin!r} version {op.to_version}{same}"
        if op.failures:
            text += "; but: " + "; ".join(op.failures)
        if op.notes:
            text += "; changed in the config but not applied until a restart: " + ", ".join(op.notes)
        return text

    def _resized(self, op: Operation) -> str:
        n = len(self.workforce.in_use())
        if op.failures:
            return (f"resized from {op.processes_from} to {n} workers, not {op.processes_to}: "
                    + "; ".join(op.failures))
        return f"resized from {op.processes_from} to {n} workers"

    def _finish(self, op: Operation, ok: bool, message: str) -> Operation:
        op.state = OpState.SUCCEEDED if ok else OpState.FAILED
        op.message = message
        op.finished_ms = int(self.wall() * 1000)
        op.processes_to = self.target
        self.current = None
        key = f"{op.kind.value} {op.state.value}"
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        (log.info if ok else log.error)(f"{op.kind.value} {op.state.value}: {message}", extra={
            "requested_by": op.requested_by, "took_s": round(self.clock() - op.started_at, 3)})
        return op
