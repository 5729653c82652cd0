"""The plugin on Spark: a mapInArrow function over input rows.

Runs in: Spark Python workers. The plugin module is imported and ``setup(context)`` runs
once per Python worker process (workers are reused across tasks), ``teardown()`` at its
exit. Records of a task are grouped per Kafka partition, in offset order, and go through
the same retry/bisect path as in a local worker. Outputs and dead letters become rows for
the Kafka sink, or for a Parquet directory (backfill --parquet): there an output with no
topic is kept with a null topic, and a dead letter is a row whose topic is the dead-letter
topic's name.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from runtime.deadletter import dead_letter_headers
from runtime.errors import RingmasterError
from runtime.execution import RetryPolicy, run_batch
from runtime.plugin import Context, Plugin, Record, load_plugin

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


_loaded: dict[str, Plugin] = {}


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


def _headers(h: Any) -> list[dict[str, Any]]:
    return [{"key": k, "value": v} for k, v in (h or [])]


def applier(job: PluginJob) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def apply(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        plugin = _plugin(job)
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
                outcome = run_batch(plugin, records, job.policy, who)
                if outcome.failures and job.dead_letter_topic is None:
                    f = outcome.first_failure
                    assert f is not None
                    raise RingmasterError(
                        f"{f.record.topic}[{f.record.partition}] offset {f.record.offset}: "
                        f"{f.error_type}: {f.message} (no [dead_letter] topic: the job stops here)")
                for out in outcome.outputs_before():
                    topic = out.topic or job.output_topic
                    if topic is not None or job.to_parquet:
                        rows.append({"topic": topic, "key": out.key, "value": out.value,
                                     "headers": _headers(out.headers)})
                for f in outcome.failures:
                    r = f.record
                    rows.append({"topic": job.dead_letter_topic, "key": r.key, "value": r.value,
                                 "headers": _headers(dead_letter_headers(
                                     r.headers, error_type=f.error_type, message=f.message,
                                     traceback=f.traceback, topic=r.topic, partition=r.partition,
                                     offset=r.offset, attempts=f.attempts, worker=who))})
            yield pa.RecordBatch.from_pylist(rows, schema=OUTPUT_ARROW)
    return apply
