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

Runs in: supervisor (feeding) and the admin server's thread (collecting).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from runtime.status import StatusSnapshot

_BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_REVOCATION_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RuntimeMetrics:
    """The daemon's registry: histograms fed by the loop, and the snapshot collector."""

    def __init__(self, snapshot: Callable[[], StatusSnapshot | None], partition_metrics: bool = True,
                 loop_age: Callable[[], float | None] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.batch_seconds = Histogram(
            "ringmaster_batch_duration_seconds", "Time a batch took in its worker (plugin and delivery)",
            buckets=_BATCH_BUCKETS, registry=self.registry)
        self.revocation_seconds = Histogram(
            "ringmaster_revocation_seconds", "Time a revocation took: fence, wait for the batch in "
            "progress, commit", buckets=_REVOCATION_BUCKETS, registry=self.registry)
        self.registry.register(SnapshotCollector(snapshot, partition_metrics, loop_age or (lambda: None)))

    def observe_batch(self, seconds: float) -> None:
        self.batch_seconds.observe(seconds)

    def observe_revocation(self, seconds: float) -> None:
        self.revocation_seconds.observe(seconds)


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], StatusSnapshot | None], partition_metrics: bool,
                 loop_age: Callable[[], float | None]) -> None:
        self._snapshot = snapshot
        self._per_partition = partition_metrics
        self._loop_age = loop_age

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        up = _gauge("ringmaster_up", "1 while the supervisor runs")
        up.add_metric([], 1.0)
        yield up
        # Read live, not from the snapshot: a stuck loop publishes no new snapshot.
        age = self._loop_age()
        if age is not None:
            g = _gauge("ringmaster_loop_tick_age_seconds", "Seconds since the supervisor's loop last "
                       "went round (a stuck loop grows this)")
            g.add_metric([], age)
            yield g
        if s is None:
            return
        ready = _gauge("ringmaster_ready", "1 once workers started and the group was joined")
        ready.add_metric([], 1.0 if s.ready else 0.0)
        yield ready
        yield from self._totals(s)
        yield from self._partitions(s)
        yield from self._workers(s)

    @staticmethod
    def _totals(s: StatusSnapshot) -> Iterator[Metric]:
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
                ("ringmaster_rebalances_total", "Rebalance callbacks (assignments, revocations, losses)",
                 s.rebalances)):
            c = _counter(name, doc)
            c.add_metric([], float(value))
            yield c
        waiting = _gauge("ringmaster_dead_letters_waiting", "Dead letters the supervisor has not had "
                         "acknowledged yet")
        waiting.add_metric([], float(s.dead_letters_waiting))
        yield waiting
        paused = _gauge("ringmaster_operator_pauses", "Operator pauses in force for the group, by scope",
                        ["scope"])
        for p in s.operator_pauses:
            paused.add_metric([p["scope"]], 1.0)
        yield paused

    def _partitions(self, s: StatusSnapshot) -> Iterator[Metric]:
        by_reason: dict[str, int] = {}
        for p in s.partitions:
            for r in p.pause_reasons:
                by_reason[r] = by_reason.get(r, 0) + 1
        paused = _gauge("ringmaster_paused_partitions", "Assigned partitions paused, by reason (flow "
                        "control, uncommitted, operator, backoff, delivery, blocked, seeking)", ["reason"])
        for reason in ("flow", "uncommitted", "operator", "backoff", "delivery", "blocked", "seeking"):
            paused.add_metric([reason], float(by_reason.get(reason, 0)))
        yield paused
        assigned = _gauge("ringmaster_assigned_partitions", "Partitions this member holds")
        assigned.add_metric([], float(len(s.partitions)))
        yield assigned
        lag_total = _gauge("ringmaster_lag", "Records not yet handled, all assigned partitions together")
        lag_total.add_metric([], float(s.lag))
        yield lag_total
        if not self._per_partition:
            return
        labels = ["group", "topic", "partition"]
        lag = _gauge("kafka_consumergroup_group_lag", "Records between what is handled and the end of the "
                     "partition (high watermark from fetch responses)", labels)
        offset = _gauge("kafka_consumergroup_group_offset", "Committed offset of the group", labels)
        latest = _gauge("kafka_partition_latest_offset", "High watermark (from fetch responses)",
                        ["topic", "partition"])
        processed = _counter("ringmaster_partition_records_processed_total", "Records processed, per "
                             "partition (since this member got it)", labels)
        consumed = _counter("ringmaster_partition_records_consumed_total", "Records fetched, per partition",
                            labels)
        outs = _counter("ringmaster_partition_outputs_total", "Outputs acknowledged, per partition", labels)
        dead = _counter("ringmaster_partition_dead_letters_total", "Dead letters, per partition", labels)
        pause = _gauge("ringmaster_partition_paused", "1 per reason a partition is paused",
                       [*labels, "reason"])
        for p in s.partitions:
            key = [s.group, p.topic, str(p.partition)]
            if p.lag is not None:
                lag.add_metric(key, float(p.lag))
            if p.committed is not None:
                offset.add_metric(key, float(p.committed))
            if p.high is not None:
                latest.add_metric([p.topic, str(p.partition)], float(p.high))
            processed.add_metric(key, float(p.records))
            consumed.add_metric(key, float(p.consumed))
            outs.add_metric(key, float(p.outputs))
            dead.add_metric(key, float(p.dead_letters))
            for r in p.pause_reasons:
                pause.add_metric([*key, r], 1.0)
        yield from (lag, offset, latest, processed, consumed, outs, dead, pause)

    @staticmethod
    def _workers(s: StatusSnapshot) -> Iterator[Metric]:
        fill = _gauge("ringmaster_ring_fill_ratio", "Bytes in a worker's ring / its capacity", ["worker"])
        beat = _gauge("ringmaster_worker_heartbeat_age_seconds", "Seconds since a worker's last heartbeat",
                      ["worker"])
        alive = _gauge("ringmaster_worker_up", "1 while a worker process runs", ["worker", "state"])
        records = _counter("ringmaster_worker_records_processed_total", "Records processed by a worker "
                           "slot (all its incarnations)", ["worker"])
        exits = _counter("ringmaster_worker_restarts_total", "Worker exits that led to a restart, by cause "
                         "(crashed, killed, recycled, start_failure)", ["worker", "cause"])
        rss = _gauge("ringmaster_worker_rss_bytes", "Resident memory of a worker", ["worker"])
        for w in s.workers:
            i = str(w.index)
            fill.add_metric([i], w.ring_fill)
            if w.heartbeat_age_s is not None:
                beat.add_metric([i], w.heartbeat_age_s)
            alive.add_metric([i, w.state], 1.0 if w.alive else 0.0)
            records.add_metric([i], float(w.records))
            for cause, n in w.exits.items():
                exits.add_metric([i, cause], float(n))
            if w.rss is not None:
                rss.add_metric([i], float(w.rss))
        yield from (fill, beat, alive, records, exits, rss)
        if s.supervisor_rss is not None:
            sup = _gauge("ringmaster_supervisor_rss_bytes", "Resident memory of the supervisor")
            sup.add_metric([], float(s.supervisor_rss))
            yield sup
        if s.librdkafka:
            for name, value in sorted(s.librdkafka.items()):
                g = _gauge(f"ringmaster_librdkafka_{name}", "From librdkafka's statistics "
                           "(statistics.interval.ms)")
                g.add_metric([], float(value))
                yield g
