"""`ringmaster spark run` and `ringmaster spark backfill`.

Runs in: the Spark driver (this process). Executors run runtime.spark.apply and the
source/sink; they need the project installed (see docs/spark.md).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config import Settings, max_message_bytes
from runtime.errors import NotCaughtUp, RingmasterError
from runtime.execution.run import RetryPolicy
from runtime.kafka.properties import consumer_properties, producer_properties
from runtime.ops.cluster import refuse_early
from runtime.spark.progress import SparkStatus

log = logging.getLogger("ringmaster.spark")


def require_java() -> None:
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise RingmasterError("Java 17+ is required for the Spark backend and 'java' is not on PATH "
                              "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)")


def session(settings: Settings) -> Any:
    require_java()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines are per callback
    # Executors' Python must be this environment, and must find what the driver finds.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from runtime.spark.source import KafkaSource

    sp = settings.spark
    paths = os.pathsep.join(p for p in sys.path if p and Path(p).is_dir())
    builder = (SparkSession.builder.master(sp.master).appName(sp.app_name)
               .config("spark.executorEnv.PYTHONPATH", paths)
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.ui.enabled", "false")
               # The source and sink options carry the Kafka clients' properties, the SASL
               # password too: Spark shows an option whose name or value matches this as
               # *********(redacted) in plans, explain() and the event log (default: "(?i)url").
               .config("spark.sql.redaction.options.regex", SPARK_REDACTION))
    for k, v in sp.conf.items():
        builder = builder.config(k, str(v))
    if sp.source == "kafka":
        from runtime.spark import builtin_source

        version, libs = builtin_source.resolve(settings)
        given = [str(sp.conf["spark.jars"])] if sp.conf.get("spark.jars") else []
        builder = builder.config("spark.jars", ",".join(given + builtin_source.jars(libs)))
        log.info("reading with Spark's own Kafka source; it keeps its offsets in the checkpoint, and "
                 "ringmaster commits them to the group after each micro-batch",
                 extra={"kafka_source": version, "jars": str(libs)})
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(KafkaSource)
    return spark


SPARK_REDACTION = r"(?i)url|password|secret|token|jaas|credential"


def source_options(settings: Settings) -> dict[str, str]:
    props = {k: v for k, v in consumer_properties(settings).items()
             if k not in ("bootstrap.servers", "group.id", "partition.assignment.strategy")}
    sp = settings.spark
    opts = {"bootstrap": settings.kafka.bootstrap_servers, "group": settings.kafka.group_id,
            "topics": ",".join(settings.kafka.topics), "kafka": json.dumps(props),
            "endOffsets": sp.end_offsets}
    if sp.max_records_per_trigger:
        opts["maxRecordsPerTrigger"] = str(sp.max_records_per_trigger)
    if settings.control.enabled:
        from runtime.ops.control import control_topic, ensure_control_topic, reader_properties

        ensure_control_topic(settings)
        opts["control"] = json.dumps({"topic": control_topic(settings), "props": reader_properties(settings),
                                      "load_timeout_s": settings.control.load_timeout_s})
    return opts


def sink_options(settings: Settings) -> dict[str, str]:
    props = {k: v for k, v in producer_properties(settings).items() if k != "bootstrap.servers"}
    return {"bootstrap": settings.kafka.bootstrap_servers, "kafka_producer": json.dumps(props)}


def input_stream(spark: Any, settings: Settings) -> Any:
    """The input topics as a streaming DataFrame of source.INPUT_SCHEMA, read by the source
    ``spark.source`` names."""
    if settings.spark.source == "kafka":
        from runtime.spark import builtin_source
        from runtime.spark import offsets as ko

        if settings.control.enabled:
            log.warning("operator pauses do not hold partitions with spark.source = \"kafka\"")
        c = driver_client(settings)
        try:
            tps = ko.partitions_of(c, settings.kafka.topics)
            starting = ko.parse("committed", c, tps, settings.spark.end_offsets)
            short = builtin_source.short_of_the_end(ko.latest(c, tps, "list"), ko.latest(c, tps, "checked"))
        finally:
            c.close()
        if short:
            log.warning("this broker's ListOffsets answers short of the end (the embedded Tansu does): "
                        "Spark's own Kafka source ends its micro-batches there and does not reach the "
                        "last records; use spark.source = \"python\" with this broker",
                        extra={"partitions": short})
        return builtin_source.stream(spark, settings, starting)
    from runtime.spark.source import NAME

    return spark.readStream.format(NAME).options(**source_options(settings)).load()


def plugin_job(settings: Settings, to_parquet: bool = False) -> Any:
    from runtime.spark.apply import PluginJob

    dl = settings.dead_letter
    return PluginJob(settings.workers.plugin, dict(settings.workers.settings), settings.output.topic,
                     dl.topic, RetryPolicy(dl.max_attempts, dl.retry_backoff_s, dl.retry_backoff_max_s),
                     to_parquet, max_message_bytes(settings))


def driver_client(settings: Settings) -> Any:
    """A client of the driver for offsets and commits, with the user's consumer properties
    (security settings included)."""
    from runtime.spark import offsets as ko

    props = {**consumer_properties(settings), "group.id": settings.kafka.group_id}
    props.pop("partition.assignment.strategy", None)
    return ko.client(props)


class GroupCommitter:
    """Commits each finished micro-batch's end offsets to the consumer group, so lag tools
    see the Spark job. Runs in: the driver, on Spark's listener thread (and once more after
    the query stops, for the last batch)."""

    def __init__(self, settings: Settings) -> None:
        from runtime.spark import offsets as ko

        self._ko = ko
        self._c = driver_client(settings)
        self._lock = threading.Lock()
        self.committed: dict[str, dict[str, int]] = {}
        self.rows: dict[Any, int] = {}  # input rows by micro-batch id, for the summary

    def commit_progress(self, progress: Any) -> None:
        if progress is None:
            return
        self.rows[progress.batchId] = int(progress.numInputRows or 0)  # the last one comes twice
        for src in progress.sources:
            end = src.endOffset
            offsets = json.loads(end) if isinstance(end, str) else end
            if not offsets or offsets == self.committed:
                continue
            with self._lock:
                self._ko.commit(self._c, offsets)
                self.committed = offsets
            log.info("group offsets committed", extra={
                "records": progress.numInputRows, "batch": progress.batchId,
                "rows_per_s": round(getattr(progress, "processedRowsPerSecond", 0) or 0)})

    def close(self) -> None:
        self._c.close()


def arrange(df: Any, settings: Settings) -> Any:
    """``workers.ordering`` means the same on Spark as in the local runtime:

    * ``partition``: one task per Kafka partition range, as the source reads it; the plugin
      sees each partition's records in offset order;
    * ``key``: records are shuffled by (topic, partition, key) over ``spark.ordering_tasks``
      tasks (default: Spark's default parallelism) and sorted by offset within each task, so a
      partition's keys are spread over tasks and each key's records reach one task, in offset
      order (records without a key stay together, in partition order);
    * ``unordered``: records are spread round-robin, and each task's share of a partition is
      still run in offset order (run_batch groups by partition)."""
    ordering = settings.workers.ordering
    if ordering == "partition":
        return df
    tasks = settings.spark.ordering_tasks or df.sparkSession.sparkContext.defaultParallelism
    if ordering == "key":
        return df.repartition(tasks, "topic", "partition", "key").sortWithinPartitions(
            "topic", "partition", "offset")
    return df.repartition(tasks).sortWithinPartitions("topic", "partition", "offset")


@dataclass(frozen=True)
class StreamResult:
    """How `ringmaster spark run` ended: the records its micro-batches read, and for an
    availableNow run (``--until-caught-up``) whether the group's committed offsets reached the
    end of every partition as it was when the run began (``error`` says what is left)."""

    records: int
    batches: int
    error: RingmasterError | None = None

    @property
    def exit_code(self) -> int:
        return 0 if self.error is None else self.error.exit_code

    def line(self) -> str:
        return f"spark run: {self.records:,} record(s) in {self.batches} micro-batch(es)"


def batch_target(settings: Settings) -> dict[str, dict[str, int]]:
    """The end of every partition of the input topics now, as ``spark.end_offsets`` finds it:
    what an availableNow run must have committed to say it caught up."""
    from runtime.spark import offsets as ko

    c = driver_client(settings)
    try:
        return ko.latest(c, ko.partitions_of(c, settings.kafka.topics), settings.spark.end_offsets)
    finally:
        c.close()


def caught_up(settings: Settings, target: dict[str, dict[str, int]],
              stopped_by: str | None) -> NotCaughtUp | None:
    """None when the group's committed offsets (as the broker answers now) reach ``target`` on
    every partition; else the error naming each partition left and the records left in it."""
    from runtime.spark import offsets as ko

    c = driver_client(settings)
    try:
        tps = [(t, int(p)) for t, ps in target.items() for p in ps]
        done = ko.committed(c, tps)
    finally:
        c.close()
    left = []
    for t, ps in sorted(target.items()):
        for p, end in sorted(ps.items(), key=lambda x: int(x[0])):
            at = done.get(t, {}).get(p)
            if at is None or at < end:
                got = "nothing committed" if at is None else f"committed up to offset {at:,}"
                more = f" ({end - at:,} records left)" if at is not None else ""
                left.append(f"{t}[{p}] {got} of {end:,}{more}")
    if not left:
        return None
    why = f"stopped by {stopped_by}" if stopped_by else \
        "the query ended short of the end (an operator pause holds a partition, or the source stopped)"
    shown = left[:10] + ([f"and {len(left) - 10} more"] if len(left) > 10 else [])
    return NotCaughtUp(f"--until-caught-up did not catch up: {why}; {len(left)} partition(s) left: "
                       + "; ".join(shown) + ". Nothing past what is committed counts as done: run again to "
                       "finish")


def run_stream(settings: Settings) -> StreamResult:
    from pyspark.sql.streaming import StreamingQueryListener

    from runtime.spark.apply import applier
    from runtime.spark.source import NAME, OUTPUT_SCHEMA

    # Before any client or JVM starts: credentials the cluster refuses are one line and exit
    # 14, not a driver and tasks that retry the login for ever.
    refuse_early(settings)
    sp = settings.spark
    # INVARIANT: an availableNow run reports success only when the group has committed the
    # end of every partition as it was before the query started (checked with the broker
    # afterwards), whatever the source or the broker's ListOffsets said meanwhile.
    target = batch_target(settings) if sp.trigger == "availableNow" else None
    spark = session(settings)
    checkpoint = sp.checkpoint_location or str(Path("run") / "spark" / settings.kafka.group_id)
    committer = GroupCommitter(settings)

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            try:
                committer.commit_progress(event.progress)
            except Exception:
                log.exception("group commit failed; it is retried after the next batch")
            try:
                status.update(event.progress)
            except Exception:  # metrics must never cost a commit
                log.exception("could not read the query's progress for the admin endpoint")

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    status = SparkStatus(settings)
    admin = _admin(settings, status)
    spark.streams.addListener(Listener())
    df = arrange(input_stream(spark, settings), settings)
    out = df.mapInArrow(applier(plugin_job(settings)), OUTPUT_SCHEMA)
    writer = (out.writeStream.format(NAME).options(**sink_options(settings))
              .option("checkpointLocation", checkpoint).queryName(sp.app_name))
    writer = writer.trigger(availableNow=True) if sp.trigger == "availableNow" \
        else writer.trigger(processingTime=f"{sp.trigger_ms()} milliseconds")
    stop: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.append(s))
    query = writer.start()
    status.query_active = True
    log.info("spark query started", extra={"master": sp.master, "trigger": sp.trigger,
                                           "checkpoint": checkpoint})
    try:
        try:
            while query.isActive and not stop:
                query.awaitTermination(0.5)
            if stop:
                log.info("stop requested; stopping the query")
                query.stop()
            query.awaitTermination()
        except Exception as exc:
            # awaitTermination raises the query's failure (StreamingQueryException): one line
            # and exit 1, as below, not a traceback through the CLI.
            if type(exc).__name__ != "StreamingQueryException":
                raise
        status.query_active = False
        failure = query.exception()  # each of these is a call into Spark's JVM: once
        if failure is not None:
            status.failure = str(failure)
            first = str(failure).strip().splitlines()[0] if str(failure).strip() else repr(failure)
            log.error("the Spark query failed", extra={"failure": str(failure)})
            raise RingmasterError(f"the Spark query failed: {first} (the log above has the whole of it)")
        # The listener is asynchronous: make sure the last batch's offsets are committed.
        last = query.lastProgress
        committer.commit_progress(last and _Progress(last))
        if last:
            status.update(last)
    finally:
        if admin is not None:
            admin.close()
        committer.close()
        spark.stop()
    error = None
    if target is not None:
        error = caught_up(settings, target, signal.Signals(stop[0]).name if stop else None)
    return StreamResult(sum(committer.rows.values()), len(committer.rows), error)


def _admin(settings: Settings, status: SparkStatus) -> Any:
    """The same admin endpoint as the local daemon: /metrics from the query's progress."""
    if not settings.admin.listen:
        return None
    from runtime.ops.admin_server import AdminServer
    from runtime.ops.metrics import RuntimeMetrics

    metrics = RuntimeMetrics(lambda: status.snapshot, settings.admin.partition_metrics,
                             group=settings.kafka.group_id)
    return AdminServer(settings.admin.listen, settings.admin.allow_remote, metrics, lambda: status.snapshot,
                       status.health, status.ready, max_connections=settings.admin.max_connections,
                       request_timeout_s=settings.admin.request_timeout_s).start()


class _Progress:
    """query.lastProgress is a dict; the listener gets an object. Same fields."""

    def __init__(self, d: dict[str, Any]) -> None:
        self.sources = [type("S", (), {"endOffset": s.get("endOffset")}) for s in d.get("sources", [])]
        self.numInputRows = d.get("numInputRows", 0)
        self.processedRowsPerSecond = d.get("processedRowsPerSecond", 0)
        self.batchId = d.get("batchId")


def backfill(settings: Settings, start: str, end: str, parquet: str | None) -> dict[str, Any]:
    from rich.progress import Progress

    from runtime.spark import offsets as ko
    from runtime.spark.apply import applier
    from runtime.spark.source import NAME, OUTPUT_SCHEMA

    refuse_early(settings)  # as in run_stream
    # Planned once, here, before Spark starts: the job reads exactly these ranges and the
    # summary counts them, so a bad --from/--to fails in seconds and nothing moves in between.
    c = driver_client(settings)
    try:
        tps = ko.partitions_of(c, settings.kafka.topics)
        first, last = ko.plan(c, tps, settings.spark.end_offsets, start, end)
    finally:
        c.close()
    planned = ko.ranges(first, last)
    if not planned:
        # Nothing between --from and --to (--from latest with nothing new, --to earliest, equal
        # offsets): a summary of nothing, without starting Spark for it.
        log.info("nothing to backfill: the range is empty", extra={"from": json.dumps(first),
                                                                  "to": json.dumps(last)})
        return {"records": 0, "seconds": 0.0, "from": first, "to": last,
                "target": parquet or settings.output.topic}
    spark = session(settings)
    try:
        if settings.spark.source == "kafka":
            from runtime.spark import builtin_source

            df = builtin_source.batch(spark, settings, first, last)
        else:
            opts = {**source_options(settings), "ranges": json.dumps(planned)}
            df = spark.read.format(NAME).options(**opts).load()
        df = arrange(df, settings)
        out = df.mapInArrow(applier(plugin_job(settings, to_parquet=parquet is not None)), OUTPUT_SCHEMA)
        status = spark.sparkContext.statusTracker()
        done = threading.Event()

        def show_progress() -> None:
            # The write must run on the main thread: Python data sources are registered with
            # the session that is active there. Progress polls Spark's status tracker instead.
            with Progress(transient=True) as bar:
                task = bar.add_task("backfill (Spark tasks)", total=None)
                while not done.wait(0.5):
                    stages = [status.getStageInfo(s) for s in status.getActiveStageIds()]
                    stages = [s for s in stages if s is not None]
                    if stages:
                        bar.update(task, total=sum(s.numTasks for s in stages),
                                   completed=sum(s.numCompletedTasks for s in stages))

        t0 = time.monotonic()
        shower = threading.Thread(target=show_progress, daemon=True)
        shower.start()
        try:
            if parquet:
                out.write.mode("append").parquet(parquet)
            else:
                out.write.format(NAME).options(**sink_options(settings)).mode("append").save()
        except Exception as exc:
            raise RingmasterError(f"backfill failed: {exc}") from None
        finally:
            done.set()
            shower.join(2)
        return {"records": ko.records(planned), "seconds": round(time.monotonic() - t0, 2),
                "from": first, "to": last, "target": parquet or settings.output.topic}
    finally:
        spark.stop()
