"""Running a batch through the plugin: retry with backoff, then bisect to isolate the
failing records, so that good records go through and bad ones can be dead-lettered.

Shared by the local worker (runtime/worker.py) and the Spark backend (runtime/spark/apply.py),
so a plugin fails the same way on both. Produces nothing itself: it returns outputs and
failures, and the caller decides where they go.
"""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field

from runtime.plugin import Output, Plugin, Record, Reject, normalize_output

log = logging.getLogger("ringmaster.execution")


@dataclass
class Failure:
    record: Record
    error_type: str
    message: str
    traceback: str
    attempts: int


@dataclass
class Outcome:
    # (highest input offset of the plugin call, its outputs): bisection calls cover
    # contiguous offset ranges, so "outputs of records before offset X" is exact.
    outputs: list[tuple[int, list[Output]]] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)

    def outputs_before(self, offset: int | None = None) -> list[Output]:
        return [o for last, outs in self.outputs if offset is None or last < offset for o in outs]

    @property
    def first_failure(self) -> Failure | None:
        return min(self.failures, key=lambda f: f.record.offset) if self.failures else None


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_s: float = 0.1
    backoff_max_s: float = 5.0


def run_batch(plugin: Plugin, records: list[Record], policy: RetryPolicy, who: str = "") -> Outcome:
    outcome = Outcome()
    _run(plugin, records, outcome, policy, who)
    return outcome


def _call(plugin: Plugin, records: list[Record], outcome: Outcome) -> None:
    produced = plugin.process(records)
    outputs: list[Output] = []
    rejects: list[Reject] = []
    for item in produced or ():
        out = normalize_output(item, None)
        if isinstance(out, Reject):
            rejects.append(out)
        else:
            outputs.append(out)
    # Only a call that returned completely contributes: a raise discards its outputs.
    outcome.outputs.append((records[-1].offset, outputs))
    outcome.failures.extend(Failure(r.record, "Rejected", r.reason, "", 1) for r in rejects)


def _run(plugin: Plugin, records: list[Record], outcome: Outcome, policy: RetryPolicy, who: str) -> None:
    delay = policy.backoff_s
    for attempt in range(1, policy.max_attempts + 1):
        try:
            _call(plugin, records, outcome)
            return
        except Exception as exc:
            if attempt == policy.max_attempts:
                if len(records) == 1:
                    outcome.failures.append(Failure(records[0], type(exc).__name__, str(exc),
                                                    traceback.format_exc(), attempt))
                    return
                break
            log.warning("plugin failed; retrying", extra={
                "worker": who, "records": len(records), "attempt": attempt,
                "error": f"{type(exc).__name__}: {exc}"})
            time.sleep(delay)
            delay = min(delay * 2, policy.backoff_max_s)
    mid = len(records) // 2
    _run(plugin, records[:mid], outcome, policy, who)
    _run(plugin, records[mid:], outcome, policy, who)
