"""Running a batch through the plugin: retry with backoff, then bisect to isolate the
failing records, so that good records go through and bad ones can be dead-lettered.

Shared by the local worker (runtime/worker/batch_runner.py), the Spark backend (runtime/spark/apply.py)
and the redrive (runtime/redrive/actions.py), so a plugin fails the same way on all three.
Each plugin call gets copies of its records (``copy_records``): what the plugin does to them
never reaches the records the caller passed, which retries, bisection and the failures (and
so the dead letters) are made of. It produces nothing itself: the caller may pass
``deliver``, called with the outputs of every plugin call that returned, inside the retry
path. ``deliver`` raising :class:`OutputRejected` (the broker refuses an output for what it
is) fails that call like a plugin exception; raising :class:`BatchDeferred` (an outage, a
plugin's ``Backoff``) abandons the whole batch untouched, to be tried again later.

Outputs the broker already acknowledged for these records, in an earlier call that failed
afterwards (a refused output, a plugin exception in a later part of a bisection, a deferred
batch run again with the same ``Acknowledged``), are not given to ``deliver`` again: the rule
and its limits are in runtime/execution/acked.py. Calls are named there by the positions of
their records in the list given to ``run_batch`` (bisection splits it into contiguous parts).

What counts as a failure of the records: any exception from ``process()`` or from iterating
what it returned, ``SystemExit`` (``sys.exit(n)`` in plugin code, whatever ``n``), an output
outside the contract (TypeError naming the type and the fix), and a refused output. What
does not: the process running out of a resource (file descriptors, memory: ``exhausted()``),
however the plugin or a library reports it, raised as :class:`WorkerExhausted` untouched.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.backoff import backoff_s
from runtime.errors import BatchDeferred, OutputRejected, WorkerExhausted
from runtime.execution.acked import Acknowledged
from runtime.execution.deadletter_format import DeadLetter, dead_letter_headers, fit_dead_letter
from runtime.plugin import Output, Plugin, Record, Reject, collect_outputs
from runtime.transport import speedups
from runtime.transport.board import PHASE_CALL, PHASE_DELIVER, PHASE_IDLE, PHASE_WAIT

log = logging.getLogger("ringmaster.execution")
REJECTED = "Rejected"  # the error type of a record the plugin turned down with Reject


@dataclass
class Failure:
    record: Record
    error_type: str
    message: str
    traceback: str
    attempts: int

    def dead_letter(self, worker: str, max_message_bytes: int,
                    plugin_version: str | None = None) -> DeadLetter:
        """The record's dead letter, with the reason in its headers, made to fit."""
        r = self.record
        headers = dead_letter_headers(r.headers, error_type=self.error_type, message=self.message,
                                      traceback=self.traceback, topic=r.topic, partition=r.partition,
                                      offset=r.offset, attempts=self.attempts, worker=worker,
                                      plugin_version=plugin_version, delivery_count=r.delivery_count)
        return fit_dead_letter(r.key, r.value, headers, max_message_bytes)


@dataclass
class Outcome:
    # (highest input offset of the plugin call, its outputs): bisection calls cover
    # contiguous offset ranges, so "outputs of records before offset X" is exact.
    outputs: list[tuple[int, list[Output]]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    stopped_early: bool = False  # stop_at_first_failure: records after the failure were not run

    def outputs_before(self, offset: int | None = None) -> list[Output]:
        return [o for last, outs in self.outputs if offset is None or last < offset for o in outs]

    @property
    def output_count(self) -> int:
        return sum(len(outs) for _, outs in self.outputs)

    @property
    def first_failure(self) -> Failure | None:
        return min(self.failures, key=lambda f: f.record.offset) if self.failures else None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_s: float = 0.1
    backoff_max_s: float = 5.0


Deliver = Callable[[list[Output]], None]


class _Run:
    def __init__(self, plugin: Plugin, policy: RetryPolicy, who: str, deliver: Deliver | None,
                 stop_at_first_failure: bool, phase: Callable[[int], None],
                 sleep: Callable[[float], None], acked: Acknowledged) -> None:
        self.plugin, self.policy, self.who = plugin, policy, who
        self.acked = acked
        self.deliver, self.stop_first = deliver, stop_at_first_failure
        self.phase, self.sleep = phase, sleep
        self.pid = os.getpid()
        self.outcome = Outcome()

    def call(self, records: list[Record], start: int) -> None:
        self.phase(PHASE_CALL)
        # INVARIANT (8): the plugin gets copies, in a list of their own; ``records`` stay the
        # runtime's. A plugin may change what it was given (``r.value = json.loads(...)``,
        # ``r.headers.append(...)``, ``r.offset = 0``, ``batch.sort()``), and retries,
        # bisection, dead letters and redrive must still see the bytes and coordinates read
        # from Kafka: a changed value would fail good records on the retry, a changed offset
        # would name another record in the dead letter, an int header would make it unwritable.
        batch = copy_records(records)
        try:
            items = collect_outputs(self.plugin.process(batch))
        finally:
            # A plugin that forked: the child returned here with the parent's memory, rings
            # and producer (whose threads it does not have). It must not go on as a second
            # worker; only the process that called the plugin continues.
            if os.getpid() != self.pid:
                os._exit(0)
        outputs = [o for o in items if isinstance(o, Output)]
        # collect_outputs gives Outputs and Rejects only: all Outputs, no second pass.
        rejects = [o for o in items if isinstance(o, Reject)] if len(outputs) < len(items) else []
        rejected = _originals(rejects, batch, records) if rejects else []
        if self.deliver is not None and outputs:
            self.phase(PHASE_DELIVER)
            self.acked.deliver(start, start + len(records) - 1, outputs, self.deliver)
        # Only a call that returned (and whose outputs were delivered) contributes.
        self.outcome.outputs.append((records[-1].offset, outputs))
        self.outcome.failures.extend(Failure(r, REJECTED, reason, "", 1) for r, reason in rejected)

    def run(self, records: list[Record], start: int = 0) -> None:
        """``start``: the position of ``records[0]`` in the batch (names the call's span)."""
        if self.outcome.stopped_early:
            return
        for attempt in range(1, self.policy.max_attempts + 1):
            try:
                self.call(records, start)
                if self.stop_first and self.outcome.failures:
                    self.outcome.stopped_early = True
                return
            except (BatchDeferred, WorkerExhausted):
                raise  # not the records' fault: the caller tries the whole batch again later
            except BaseException as exc:  # SystemExit too: sys.exit() in plugin code fails the batch
                why = exhausted(exc)
                if why is not None:
                    raise WorkerExhausted(why) from exc
                if attempt == self.policy.max_attempts:
                    if len(records) == 1:
                        self.outcome.failures.append(Failure(
                            records[0], type(exc).__name__, _message(exc), traceback.format_exc(), attempt))
                        if self.stop_first:
                            self.outcome.stopped_early = True
                        return
                    break
                fields: dict[str, object] = {"records": len(records), "attempt": attempt,
                                             "error": f"{type(exc).__name__}: {_message(exc)}"}
                if self.who:  # a local worker's lines carry worker= and incarnation= already
                    fields["worker"] = self.who
                log.warning("plugin failed; retrying", extra=fields)
                self.phase(PHASE_WAIT)
                self.sleep(backoff_s(self.policy.backoff_s, attempt - 1, self.policy.backoff_max_s))
        mid = len(records) // 2
        self.run(records[:mid], start)
        self.run(records[mid:], start + mid)


_new_record = Record.__new__


def _copy_records_py(_type: type[Record], records: list[Record]) -> list[Record]:
    out: list[Record] = []
    append = out.append
    for r in records:
        c = _new_record(Record)
        c.topic, c.partition, c.offset, c.key, c.value, c.timestamp = \
            r.topic, r.partition, r.offset, r.key, r.value, r.timestamp
        h = r.headers
        c.headers = None if h is None else list(h)
        append(c)
    return out


def _same_copies(a: list[Record], b: list[Record]) -> bool:
    def fields(r: Record) -> tuple[Any, ...]:
        return type(r), r.topic, r.partition, r.offset, r.key, r.value, r.headers, r.timestamp
    return len(a) == len(b) and all(fields(x) == fields(y) for x, y in zip(a, b, strict=True))


# speedups.native is None when the extension is absent or built from older source (speedups._load).
COPY_RECORDS: speedups.HotPath[list[Record]] = speedups.HotPath(
    "copy_records", speedups.native.copy_records if speedups.native is not None else None,
    _copy_records_py, _same_copies)


def copy_records(records: list[Record]) -> list[Record]:
    """Copies of ``records`` for the plugin: new Record objects with the same fields and a
    list of headers of their own (the fields themselves are immutable: str, int, bytes,
    tuples). Per record and plugin call, ~0.05 µs in C, ~0.4 µs in Python
    (scripts/bench_record_copy.py)."""
    copies = COPY_RECORDS.call(Record, records)
    if records and records[0].delivery_count is not None:  # a share group's batch: not a slot they copy
        for c, r in zip(copies, records, strict=True):
            c.delivery_count = r.delivery_count
    return copies


def _originals(rejects: list[Reject], batch: list[Record], records: list[Record]) -> list[tuple[Record, str]]:
    """The runtime's record behind each ``Reject(given)``: the one whose copy the plugin
    rejects, whatever the plugin changed in it. A Reject of a record that was not in this
    call's batch cannot be dead-lettered truthfully: a TypeError that fails the call."""
    by_copy = {id(c): r for c, r in zip(batch, records, strict=True)}  # ``batch`` keeps the ids alive
    out = []
    for rej in rejects:
        original = by_copy.get(id(rej.record))
        if original is None:
            raise TypeError("Reject.record must be one of the records of the batch process() was "
                            f"called with, not {rej.record!r:.80} (reject the record itself, not one "
                            "built or kept from another batch)")
        out.append((original, rej.reason))
    return out


_RESOURCE_ERRNOS = {errno.EMFILE: "file descriptors", errno.ENFILE: "the system's file table",
                    errno.ENOMEM: "memory"}


def exhausted(exc: BaseException) -> str | None:
    """What the process ran out of, if that is what ``exc`` (or an exception it was raised
    from, or while handling: a library may wrap it) says: MemoryError, or an OSError with
    EMFILE, ENFILE or ENOMEM. None for anything else."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen or len(seen) > 20:
            continue
        seen.add(id(e))
        if isinstance(e, MemoryError):
            return f"memory (MemoryError: {e})" if str(e) else "memory (MemoryError)"
        if isinstance(e, OSError) and e.errno in _RESOURCE_ERRNOS:
            return f"{_RESOURCE_ERRNOS[e.errno]} ({type(e).__name__}: {e})"
        todo += [e.__cause__, e.__context__]
    return None


def _message(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"plugin code called sys.exit({exc.code!r})"
    if isinstance(exc, OutputRejected):
        return str(exc)
    return str(exc) or repr(exc)


def run_batch(plugin: Plugin, records: list[Record], policy: RetryPolicy, who: str = "", *,
              deliver: Deliver | None = None, stop_at_first_failure: bool = False,
              phase: Callable[[int], None] = lambda _p: None,
              sleep: Callable[[float], None] = time.sleep,
              acked: Acknowledged | None = None) -> Outcome:
    """Run records through the plugin; return their outputs and the records that failed.

    ``stop_at_first_failure``: stop at the first record that fails for good (used when no
    dead-letter topic exists: nothing after a failing record may be processed).
    ``acked``: what earlier runs of these same records (the same list, or one it begins with)
    had acknowledged, to be carried on (a deferred batch run again); filled in as this run
    delivers. A new one when None."""
    run = _Run(plugin, policy, who, deliver, stop_at_first_failure, phase, sleep,
               Acknowledged() if acked is None else acked)
    try:
        run.run(records)
    finally:
        phase(PHASE_IDLE)
    return run.outcome
