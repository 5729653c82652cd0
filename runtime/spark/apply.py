"""The plugin on Spark: a mapInArrow function over input rows.

Runs in: Spark Python workers. The plugin module is imported and ``setup(context)`` runs
once per Python worker process (workers are reused across tasks), ``teardown()`` at its
exit. Records of a task are grouped per Kafka partition, in offset order, and go through
the same retry/bisect path as in a local worker. Outputs and dead letters become rows for
the Kafka sink, or for a Parquet directory (backfill --parquet): there an output with no
topic is kept with a null topic, and a dead letter is a row whose topic is the dead-letter
topic's name.

The same failure model as a local worker, where Spark allows it:

* a wrong output type, ``sys.exit()``, a ``Reject``: the same dead letters (runtime.execution.run);
* an output larger than ``message.max.bytes`` is refused here, before the sink, so the
  record that made it is dead-lettered as ``OutputRejected`` as it is locally; a dead letter
  is made to fit the same way (runtime.execution.deadletter_format);
* ``Backoff`` raised by the plugin: the task waits and runs the same records again, in
  order (doubling the wait if raised again). Spark has no partition to pause, so
  ``scope="all"`` only holds this task; other tasks of the micro-batch go on. An outage of
  the sink fails the task and Spark retries it (``spark.task.maxFailures``).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from runtime.errors import BatchDeferred, OutputRejected, RingmasterError
from runtime.execution.routing import OutputRoute
from runtime.execution.run import Outcome, RetryPolicy, run_batch
from runtime.plugin import Context, Output, Plugin, Record, backoff_wait, load_plugin

log = logging.getLogger("ringmaster.spark")

OUTPUT_ARROW = pa.schema([("topic", pa.string()), ("key", pa.binary()), ("value", pa.binary()),
                          ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))])


@dataclass(frozen=True)
class PluginJob:
    plugin: str
    settings: dict[str, Any]
    output_topic: str | None
    dead_letter_topic: str | None
    policy: RetryPolicy
    # Rows go to a Parquet directory, not to Kafka: outputs without a topic are kept (topic null).
    to_parquet: bool = False
    max_message_bytes: int = 1_000_000  # the producer's message.max.bytes


_loaded: dict[str, Plugin] = {}
_routes: dict[tuple[str | None, bool], OutputRoute] = {}  # one per Python worker process and sink


def _plugin(job: PluginJob) -> Plugin:
    plugin = _loaded.get(job.plugin)
    if plugin is None:
        plugin = load_plugin(job.plugin)
        if plugin.setup is not None:
            plugin.setup(Context(f"spark-{os.getpid()}", job.settings, job.output_topic))
        if plugin.teardown is not None:
            atexit.register(plugin.teardown)
        _loaded[job.plugin] = plugin
    return plugin


def _route(job: PluginJob) -> OutputRoute:
    key = (job.output_topic, job.to_parquet)
    route = _routes.get(key)
    if route is None:
        route = _routes[key] = OutputRoute(job.output_topic, keep_unrouted=job.to_parquet)
    return route


def _headers(h: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in (h or [])]


def applier(job: PluginJob) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        plugin = _plugin(job)
        route = _route(job)
        who = f"spark-{os.getpid()}"
        for rb in batches:
            groups: dict[tuple[str, int], list[Record]] = {}
            for r in rb.to_pylist():
                rec = Record(r["topic"], r["partition"], r["offset"], r["key"], r["value"],
                             [(h["key"], h["value"]) for h in r["headers"] or []],
                             (r["timestamp_type"], r["timestamp"]))
                groups.setdefault((rec.topic, rec.partition), []).append(rec)
            rows: list[dict[str, Any]] = []
            for records in groups.values():
                records.sort(key=lambda x: x.offset)
                outcome = _run(plugin, records, job, who)
                if outcome.failures and job.dead_letter_topic is None:
                    f = outcome.first_failure
                    assert f is not None
                    raise RingmasterError(
                        f"{f.record.topic}[{f.record.partition}] offset {f.record.offset}: "
                        f"{f.error_type}: {f.message} (no [dead_letter] topic: the job stops here)")
                for out in outcome.outputs_before():
                    topic = route.topic(out)
                    if topic is not None or route.keep_unrouted:
                        rows.append({"topic": topic, "key": out.key, "value": out.value,
                                     "headers": _headers(out.headers)})
                for f in outcome.failures:
                    letter = f.dead_letter(who, job.max_message_bytes)
                    rows.append({"topic": job.dead_letter_topic, "key": letter.key, "value": letter.value,
                                 "headers": _headers(letter.headers)})
            yield pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)
    return apply


def _run(plugin: Plugin, records: list[Record], job: PluginJob, who: str) -> Outcome:
    """run_batch, with outputs checked against message.max.bytes inside the retry path, and
    the plugin's Backoff honoured by waiting in the task. A Python worker out of descriptors
    or memory (WorkerExhausted) fails the task, never its records: Spark retries the task
    (spark.task.maxFailures) and nothing is dead-lettered for it."""
    def check_sizes(outputs: list[Output]) -> None:
        for out in outputs:
            size = len(out.key or b"") + len(out.value or b"") + sum(
                len(k) + len(v or b"") for k, v in out.headers or [])
            if size > job.max_message_bytes:
                raise OutputRejected(f"an output of {size} bytes is larger than kafka.producer "
                                     f"message.max.bytes ({job.max_message_bytes})")

    waits = 0
    while True:
        try:
            return run_batch(plugin, records, job.policy, who, deliver=check_sizes)
        except BatchDeferred as d:
            delay = backoff_wait(d.delay_s if d.delay_s is not None else job.policy.backoff_s, waits)
            waits += 1
            log.warning("plugin backing off; the task waits and runs the records again",
                        extra={"worker": who, "reason": d.reason, "wait_s": delay})
            time.sleep(delay)
