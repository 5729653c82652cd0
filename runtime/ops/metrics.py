"""Prometheus metrics of a running daemon (prometheus_client: no hand-written exposition).

Two kinds of source, both read-only for the scraping thread:

* the **status snapshot** (status.py), built by the supervisor every ``status_interval_s``
  and replaced whole, never mutated: counters, per-partition lag and offsets, pauses by
  reason, ring fill, worker restarts by cause. A collector turns the latest one into metric
  families at each scrape.
* **histograms** the loop feeds as things happen (batch durations, revocation times):
  prometheus_client's own thread-safe Histogram.

Names and labels follow kafka-lag-exporter where they fit (``kafka_consumergroup_group_lag``,
``kafka_consumergroup_group_offset``, ``kafka_partition_latest_offset`` with ``group``,
``topic``, ``partition``), and ``ringmaster_*`` for the runtime's own. Per-partition series
can be turned off (``admin.partition_metrics = false``) where partitions are many.

The admin server answers /metrics with ``exposition()``: the snapshot's families and the
histograms rendered once per snapshot (so a scrape costs the loop next to nothing, however
many pollers there are), and the two live gauges (``ringmaster_up``,
``ringmaster_loop_tick_age_seconds``: a stuck loop publishes no new snapshot) rendered at
every scrape. Histograms are therefore as fresh as the snapshot (``status_interval_s``).

Every ``ringmaster_*`` series carries the consumer ``group`` label (a supervisor belongs to
one group, so it costs no cardinality), so that dashboards and alerts select a group the
same way for every series. Counters that can be zero are exported from the first scrape,
with 0 (worker restarts by every cause for every worker, operator pauses by every scope
kind, the histograms): ``increase()`` over a series that appears only with its first event
misses that event.

Runs in: supervisor (feeding) and the admin server's thread (collecting).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.ops.control_records import PauseScope, scope_kind
from runtime.ops.status import ExitCause, PauseReason, StatusSnapshot

_BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# kafka.group_type = "share": what became of the records this member acquired.
_SHARE_COUNTS = (("acquired", "Share group: records acquired (handed to this member under a lock)"),
                 ("accepted", "Share group: records accepted (their outputs were delivered)"),
                 ("released", "Share group: records released for redelivery (not run here)"),
                 ("rejected", "Share group: records rejected"),
                 ("lock_expiries", "Share group: acknowledgements refused because the record's lock "
                                   "had run out (another member has it)"))
_REVOCATION_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Histograms:
    """What the supervisor's loop feeds as things happen. Made before the supervisor, which
    feeds them, and read by the RuntimeMetrics made after it, which reads the supervisor."""

    def __init__(self, group: str) -> None:
        self.batches = Histogram(
            "ringmaster_batch_duration_seconds", "Time a batch took in its worker (plugin and delivery)",
            ["group"], buckets=_BATCH_BUCKETS, registry=None)
        self.revocations = Histogram(
            "ringmaster_revocation_seconds", "Time a revocation took: fence, wait for the batch in "
            "progress, commit", ["group"], buckets=_REVOCATION_BUCKETS, registry=None)
        # .labels() now: the series exist, with zero counts, from the first scrape.
        self._batch_seconds = self.batches.labels(group)
        self._revocation_seconds = self.revocations.labels(group)

    def observe_batch(self, seconds: float) -> None:
        self._batch_seconds.observe(seconds)

    def observe_revocation(self, seconds: float) -> None:
        self._revocation_seconds.observe(seconds)


class RuntimeMetrics:
    """The daemon's registry: histograms fed by the loop, and the snapshot collector.
    ``group``: the consumer group, a label of every ringmaster_* series; ``histograms``: the
    ones the loop feeds (new ones if none)."""

    def __init__(self, snapshot: Callable[[], StatusSnapshot | None], partition_metrics: bool = True,
                 loop_age: Callable[[], float | None] | None = None, *, group: str,
                 histograms: Histograms | None = None) -> None:
        self._snapshot = snapshot
        self.histograms = histograms or Histograms(group)
        batches, revocations = self.histograms.batches, self.histograms.revocations
        # Everything, in one registry: a full scrape (tests, tools).
        self.registry = CollectorRegistry(auto_describe=False)
        # What exposition() renders once per snapshot, and at every scrape.
        self._per_snapshot = CollectorRegistry(auto_describe=False)
        self._live = CollectorRegistry(auto_describe=False)
        live = LiveCollector(loop_age or (lambda: None), group)
        families = SnapshotCollector(snapshot, partition_metrics, group)
        # The supervisor's own process_* series (CPU seconds, memory, open fds, start time), as
        # every Prometheus client exports them, read from /proc at each scrape (cheap). Standard
        # names without the group label: dashboards join them on instance. The workers' CPU and
        # busy seconds come from the snapshot (ringmaster_worker_*_seconds_total).
        process = ProcessCollector(registry=None)
        for collector in (live, process, batches, revocations, families):
            self.registry.register(collector)
        for collector in (batches, revocations, families):
            self._per_snapshot.register(collector)
        self._live.register(live)
        self._live.register(process)
        self._rendered: tuple[StatusSnapshot | None, bytes] | None = None

    def exposition(self) -> bytes:
        """The /metrics document. Runs in: the admin server's one thread (the cache is its own)."""
        snap = self._snapshot()
        if self._rendered is None or self._rendered[0] is not snap:
            self._rendered = (snap, generate_latest(self._per_snapshot))
        return generate_latest(self._live) + self._rendered[1]


class _Family:
    """A ringmaster_* metric family whose every sample carries the group label first."""

    def __init__(self, family: CounterMetricFamily | GaugeMetricFamily, group: str) -> None:
        self.family, self.group = family, group

    def add(self, labels: list[str], value: float) -> None:
        self.family.add_metric([self.group, *labels], value)


class _Grouped:
    """Families whose every sample carries the group label first."""

    _group: str

    def _counter(self, name: str, doc: str, labels: list[str] | None = None) -> _Family:
        return _Family(CounterMetricFamily(name, doc, labels=["group", *(labels or [])]), self._group)

    def _gauge(self, name: str, doc: str, labels: list[str] | None = None) -> _Family:
        return _Family(GaugeMetricFamily(name, doc, labels=["group", *(labels or [])]), self._group)


class LiveCollector(_Grouped, Collector):
    """What must be read at each scrape, not from the snapshot."""

    def __init__(self, loop_age: Callable[[], float | None], group: str) -> None:
        self._loop_age = loop_age
        self._group = group

    def collect(self) -> Iterator[Metric]:
        up = self._gauge("ringmaster_up", "1 while the supervisor runs")
        up.add([], 1.0)
        yield up.family
        # Read live, not from the snapshot: a stuck loop publishes no new snapshot.
        age = self._loop_age()
        if age is not None:
            g = self._gauge("ringmaster_loop_tick_age_seconds", "Seconds since the supervisor's loop last "
                            "went round (a stuck loop grows this)")
            g.add([], age)
            yield g.family


class SnapshotCollector(_Grouped, Collector):
    def __init__(self, snapshot: Callable[[], StatusSnapshot | None], partition_metrics: bool,
                 group: str) -> None:
        self._snapshot = snapshot
        self._per_partition = partition_metrics
        self._group = group

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        if s is None:
            return
        ready = self._gauge("ringmaster_ready", "1 once workers started and the group was joined")
        ready.add([], 1.0 if s.ready else 0.0)
        yield ready.family
        yield from self._totals(s)
        yield from self._rollout(s)
        yield from self._partitions(s)
        yield from self._workers(s)

    def _totals(self, s: StatusSnapshot) -> Iterator[Metric]:
        for name, doc, value in (
                ("ringmaster_records_consumed_total", "Records fetched from Kafka", s.consumed),
                ("ringmaster_records_processed_total", "Records processed by the plugin (batches done)",
                 s.records),
                ("ringmaster_outputs_total", "Outputs produced and acknowledged by the broker", s.outputs),
                ("ringmaster_dead_letters_total", "Records dead-lettered (acknowledged)", s.dead_letters),
                ("ringmaster_outputs_discarded_total", "Outputs without a topic (no [output] topic)",
                 s.discarded),
                ("ringmaster_batches_total", "Batches done", s.batches),
                ("ringmaster_batches_deferred_total", "Batches deferred (delivery outage, plugin Backoff)",
                 s.deferred),
                ("ringmaster_transactions_committed_total", "Exactly-once: batches committed in their "
                 "transaction", s.transactions_committed),
                ("ringmaster_transactions_aborted_total", "Exactly-once: batches whose transaction was not "
                 "committed (deferred, blocked, or their worker died in it)", s.transactions_aborted),
                ("ringmaster_rebalances_total", "Rebalance callbacks (assignments, revocations, losses)",
                 s.rebalances)):
            c = self._counter(name, doc)
            c.add([], float(value))
            yield c.family
        for key, doc in _SHARE_COUNTS:
            if s.share is not None:  # kafka.group_type = "share" only
                c = self._counter(f"ringmaster_share_records_{key}_total", doc)
                c.add([], float(s.share.get(key, 0)))
                yield c.family
        waiting = self._gauge("ringmaster_dead_letters_waiting", "Dead letters the supervisor has not had "
                              "acknowledged yet")
        waiting.add([], float(s.dead_letters_waiting))
        yield waiting.family
        paused = self._gauge("ringmaster_operator_pauses", "Operator pauses in force for the group, by the "
                             "kind of scope (group: every topic, topic, partition)", ["scope"])
        by_scope = dict.fromkeys(PauseScope, 0)
        for p in s.operator_pauses:
            # Past the first 50 pauses, one entry of the snapshot counts the rest (its key is "":
            # counted as the group's, as a key that is no scope is).
            by_scope[scope_kind(str(p.get("key", "*")))] += int(p.get("count", 1))
        for kind, n in by_scope.items():
            paused.add([kind], float(n))
        yield paused.family

    def _rollout(self, s: StatusSnapshot) -> Iterator[Metric]:
        """Which plugin version runs, and how reloads and resizes went (`ringmaster reload`)."""
        info = self._gauge("ringmaster_plugin_info", "The plugin the daemon runs, and its version "
                           "(__version__ or a hash of its source): new and restarted workers run this",
                           ["plugin", "version"])
        info.add([s.plugin, s.plugin_version or "unknown"], 1.0)
        yield info.family
        ops = self._counter("ringmaster_operations_total", "Reloads and resizes of the running daemon, by "
                            "outcome; 0 from the start", ["operation", "result"])
        done = dict.fromkeys((f"{k} {r}" for k in ("reload", "scale") for r in ("succeeded", "failed")), 0)
        for key, n in sorted({**done, **s.operations}.items()):
            kind, _, result = key.partition(" ")
            ops.add([kind, result], float(n))
        yield ops.family
        last = self._gauge("ringmaster_reload_last_successful", "0 when the last reload failed (rolled back: "
                           "the daemon runs its old code), else 1")
        last.add([], 0.0 if s.reload is not None and s.reload.state == "failed" else 1.0)
        yield last.family
        for name, doc, value in (
                ("ringmaster_workers_target", "Workers the pool aims at (workers.processes, or the last "
                 "resize)", s.workers_target),
                ("ringmaster_workers_max", "workers.max_processes", s.workers_max)):
            g = self._gauge(name, doc)
            g.add([], float(value))
            yield g.family

    def _partitions(self, s: StatusSnapshot) -> Iterator[Metric]:
        by_reason: dict[str, int] = {}
        for p in s.partitions:
            for r in p.pause_reasons:
                by_reason[r] = by_reason.get(r, 0) + 1
        paused = self._gauge("ringmaster_paused_partitions", "Assigned partitions paused, by reason (flow "
                             "control, uncommitted, operator, backoff, delivery, blocked, seeking)",
                             ["reason"])
        for reason in PauseReason:
            paused.add([reason], float(by_reason.get(reason, 0)))
        yield paused.family
        assigned = self._gauge("ringmaster_assigned_partitions", "Partitions this member holds")
        assigned.add([], float(len(s.partitions)))
        yield assigned.family
        over = self._gauge("ringmaster_partitions_over_capacity", "Partitions the group assigned to this "
                           "member beyond supervisor.max_partitions: paused and not read, their lag grows "
                           "(not in ringmaster_assigned_partitions)")
        over.add([], float(len(s.over_capacity)))
        yield over.family
        lag_total = self._gauge("ringmaster_lag", "Records not yet handled, all assigned partitions together")
        lag_total.add([], float(s.lag))
        yield lag_total.family
        # Fairness (issue 16): a partition no worker serves shows here while the others look
        # busy and healthy. The worst one is always exported; per partition below.
        ages = [p.oldest_unprocessed_s for p in s.partitions if p.oldest_unprocessed_s is not None]
        oldest = self._gauge("ringmaster_oldest_unprocessed_seconds", "Age of the oldest record fetched and "
                             "not yet handled, over every assigned partition (0: none waiting)")
        oldest.add([], max(ages, default=0.0))
        yield oldest.family
        if not self._per_partition:
            return
        labels = ["topic", "partition"]  # after "group", which every family here has first
        lag = self._gauge("kafka_consumergroup_group_lag", "Records between what is handled and the end of "
                          "the partition (high watermark from fetch responses; for paused partitions also "
                          "from a ListOffsets query every few seconds)", labels)
        offset = self._gauge("kafka_consumergroup_group_offset", "Committed offset of the group", labels)
        latest = self._gauge("kafka_partition_latest_offset", "High watermark (as for the lag)", labels)
        processed = self._counter("ringmaster_partition_records_processed_total", "Records processed, per "
                                  "partition (since this member got it)", labels)
        consumed = self._counter("ringmaster_partition_records_consumed_total", "Records fetched, per "
                                 "partition", labels)
        outs = self._counter("ringmaster_partition_outputs_total", "Outputs acknowledged, per partition",
                             labels)
        dead = self._counter("ringmaster_partition_dead_letters_total", "Dead letters, per partition", labels)
        pause = self._gauge("ringmaster_partition_paused", "1 per reason a partition is paused",
                            [*labels, "reason"])
        age = self._gauge("ringmaster_partition_oldest_unprocessed_seconds", "Age of the partition's oldest "
                          "record fetched and not yet handled (absent: none waiting)", labels)
        for p in s.partitions:
            key = [p.topic, str(p.partition)]
            if p.lag is not None:
                lag.add(key, float(p.lag))
            if p.committed is not None:
                offset.add(key, float(p.committed))
            if p.high is not None:
                latest.add(key, float(p.high))
            processed.add(key, float(p.records))
            consumed.add(key, float(p.consumed))
            outs.add(key, float(p.outputs))
            dead.add(key, float(p.dead_letters))
            for r in p.pause_reasons:
                pause.add([*key, r], 1.0)
            if p.oldest_unprocessed_s is not None:
                age.add(key, p.oldest_unprocessed_s)
        yield from (f.family for f in (lag, offset, latest, processed, consumed, outs, dead, pause, age))

    def _workers(self, s: StatusSnapshot) -> Iterator[Metric]:
        fill = self._gauge("ringmaster_ring_fill_ratio", "Bytes in a worker's ring / its capacity",
                           ["worker"])
        beat = self._gauge("ringmaster_worker_heartbeat_age_seconds", "Seconds since a worker's last "
                           "heartbeat", ["worker"])
        alive = self._gauge("ringmaster_worker_up", "1 while a worker process runs", ["worker", "state"])
        records = self._counter("ringmaster_worker_records_processed_total", "Records processed by a worker "
                                "slot (all its incarnations)", ["worker"])
        exits = self._counter("ringmaster_worker_restarts_total", "Worker exits that led to a restart, by "
                              f"cause ({', '.join(ExitCause)}); 0 from the start", ["worker", "cause"])
        rss = self._gauge("ringmaster_worker_rss_bytes", "Resident memory of a worker", ["worker"])
        version = self._gauge("ringmaster_worker_plugin_info", "The plugin version a worker runs",
                              ["worker", "version"])
        # CPU over busy says where a worker's time goes: near 1, the plugin computes; well below,
        # it waits (on I/O, on the broker's acknowledgements).
        cpu = self._counter("ringmaster_worker_cpu_seconds_total", "CPU time (user and system) of a "
                            "worker's process; from 0 again when the worker is replaced (rate() takes "
                            "that as a counter reset)", ["worker"])
        busy = self._counter("ringmaster_worker_busy_seconds_total", "Time a worker's batches took, plugin "
                             "and delivery (all its incarnations)", ["worker"])
        for w in s.workers:
            i = str(w.index)
            fill.add([i], w.ring_fill)
            if w.heartbeat_age_s is not None:
                beat.add([i], w.heartbeat_age_s)
            alive.add([i, w.state], 1.0 if w.alive else 0.0)
            records.add([i], float(w.records))
            for cause in dict.fromkeys([*ExitCause, *w.exits]):
                exits.add([i, cause], float(w.exits.get(cause, 0)))
            if w.rss is not None:
                rss.add([i], float(w.rss))
            if w.plugin_version is not None:
                version.add([i, w.plugin_version], 1.0)
            if w.cpu_s is not None:
                cpu.add([i], w.cpu_s)
            busy.add([i], w.busy_s)
        yield from (f.family for f in (fill, beat, alive, records, exits, rss, version, cpu, busy))
        if s.supervisor_rss is not None:
            sup = self._gauge("ringmaster_supervisor_rss_bytes", "Resident memory of the supervisor")
            sup.add([], float(s.supervisor_rss))
            yield sup.family
        if s.librdkafka:
            for name, value in sorted(s.librdkafka.items()):
                g = self._gauge(f"ringmaster_librdkafka_{name}", "From librdkafka's statistics "
                                "(statistics.interval.ms)")
                g.add([], float(value))
                yield g.family
