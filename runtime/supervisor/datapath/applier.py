"""The one place effects (effects.py) are applied, each by the room that acts on it, and where
the workers' result pipes are read and each report's effects applied (``collect``, as arroyo's
strategy's poll does). Runs in: supervisor, at the loop's steps (runtime/supervisor/daemon/
loop.py) and inside a release's wait for the batches in progress (release.py).

Effects are applied in the order they were decided, each report's before the next report is
decided: the decisions read the partitions as the earlier effects left them.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Callable, Iterable, Sequence
from typing import Generic

from runtime.ops.metrics import Histograms
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.datapath.effects import (
    Block,
    Complete,
    Effect,
    GiveUp,
    Isolate,
    Letter,
    LetterDone,
    ReadyLetter,
    Requeue,
    Rewind,
    WorkerSaid,
)
from runtime.supervisor.datapath.intake import Sizing, batch_size
from runtime.supervisor.datapath.results import Results
from runtime.supervisor.partition.partition import PauseReason
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.pool import H
from runtime.supervisor.workers.workforce import Workforce
from runtime.transport.frames import ResultKind, decode_result

log = logging.getLogger("ringmaster.results")


class Applier(Generic[H]):

    def __init__(self, results: Results, workforce: Workforce[H], handles: Sequence[H], scheduler: Scheduler,
                 desk: DeadLetterDesk | None, histograms: Histograms | None, sizing: Sizing,
                 clock: Callable[[], float]) -> None:
        self.results = results
        self.workforce = workforce
        self.handles = handles
        self.scheduler = scheduler
        self.desk = desk
        self.histograms = histograms
        self.sizing = sizing
        self.clock = clock

    # ------------------------------------------------------------------ reading results
    def collect(self, timeout_s: float = 0.0) -> None:
        """Apply every result that has arrived; wait up to timeout_s for one if none has.
        One select() says which pipes to read: a read per worker per tick (EAGAIN, mostly)
        cost 9 % of the supervisor on trivial work."""
        pipes = [(h.results.fd, h) for h in self.handles if h.results is not None]
        real = [fd for fd, _ in pipes if fd >= 0]  # (test fakes have no descriptor)
        ready = set(select.select(real, [], [], timeout_s)[0]) if real else set()
        for fd, h in pipes:
            if fd < 0 or fd in ready:
                self.drain(h)

    def drain(self, h: H) -> None:
        """What the worker reported, read to the end of what is there, each report applied."""
        if h.results is None:
            return
        for message in h.results.read():  # at end of file the worker died: the workforce reaps it
            self.apply(self.results.apply(h.index, decode_result(message)))

    # ------------------------------------------------------------------ applying
    def apply(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            self._apply(effect)

    def _apply(self, effect: Effect) -> None:
        match effect:
            case WorkerSaid(worker, kind, detail, batch_id, fresh):
                h = self.handles[worker]
                if kind is ResultKind.FATAL:
                    self.workforce.on_fatal_report(h, detail)
                elif kind is ResultKind.HELLO:
                    self.workforce.on_hello(h, detail)
                else:  # not done, not the records' fault: run again when it exits
                    self.workforce.on_exhausted(h, batch_id, detail, fresh)
            case Complete():
                self._complete(effect)
            case Rewind(parts, reason, detail, until, deferred):
                if deferred is not None:
                    deferred.deferred()
                for p in parts:
                    p.rewind(reason, detail, until)
            case Block(p, detail):
                log.error("partition stopped at a failing record (no [dead_letter] topic); fix the "
                          "plugin or configure one, then restart", extra={"tp": p.label, "reason": detail})
                p.rewind(PauseReason.BLOCKED, detail)
            case Isolate(p, batch_id, halves):
                p.split(batch_id, list(halves))
            case GiveUp(p, batch_id, outcome):
                p.give_up(batch_id, outcome)
            case Letter(p, batch_id, row, error_type, message, attempts, version, count):
                assert self.desk is not None  # results.py blocks the partition when there is none
                self.desk.submit(p.tp, batch_id, row, error_type, message, attempts, version, count)
            case ReadyLetter(p, batch_id, offset, letter):
                assert self.desk is not None
                self.desk.submit_letter(p.tp, batch_id, offset, letter)
            case LetterDone(p, batch_id):
                p.letter_done(batch_id)
            case Requeue(batches):
                self.scheduler.requeue(batches)

    def _complete(self, c: Complete) -> None:
        self.workforce.on_batch_done(self.handles[c.worker])
        self.scheduler.learn(c.worker, c.busy_ms, c.processed)
        if self.histograms is not None:
            self.histograms.observe_batch(c.busy_ms / 1000)
        p = c.p
        if p is None:
            return
        p.done(c.batch_id, c.processed, c.outputs, c.dead_letters, c.discarded, self.clock())
        if p.learn_cost(c.busy_ms, c.processed):
            p.sized(batch_size(self.sizing, p))
