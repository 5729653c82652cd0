"""The admin endpoint and the metrics, over a hand-built status snapshot: every path answers
what it promises, metric values are the snapshot's, the Grafana dashboard and the alert rules
only use metrics that exist, and `status`/`top` render a snapshot."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from runtime.config import Settings, parse_listen
from runtime.errors import ConfigError
from runtime.kafka.consumer import librdkafka_summary
from runtime.ops.admin_server import AdminServer, Health
from runtime.ops.metrics import RuntimeMetrics
from runtime.ops.status import OperationStatus, PartitionStatus, StatusSnapshot, WindowCpu, WorkerStatus
from runtime.ops.views import Reading, render, status_url

ROOT = Path(__file__).resolve().parents[2]


def snapshot(records: int = 1000, lag: int = 7) -> StatusSnapshot:
    parts = [PartitionStatus(tp="in[0]", topic="in", partition=0, worker=0, paused=True,
                             pause_reasons=["operator", "flow"], holds={"operator": "deploy"}, blocked=None,
                             committed=500, done_through=500, high=500 + lag, lag=lag, pending_batches=0,
                             records=records, consumed=records + lag, outputs=records - 3, dead_letters=3,
                             oldest_unprocessed_s=2.5),
             PartitionStatus(tp="in[1]", topic="in", partition=1, worker=1, paused=False, pause_reasons=[],
                             holds={}, blocked=None, committed=None, done_through=None, high=None, lag=None,
                             pending_batches=0, records=0, consumed=0, outputs=0, dead_letters=0)]
    workers = [WorkerStatus(index=0, pid=11, alive=True, state="ready", cpu_s=1.0, records=records,
                            in_flight=2, ring_fill=0.25, restarts=2, rss=2**20, heartbeat_age_s=0.3,
                            exits={"crashed": 1, "recycled": 1}),
               WorkerStatus(index=1, pid=12, alive=True, state="ready", cpu_s=1.0, records=0, in_flight=0,
                            ring_fill=0.0, restarts=0, rss=2**20, heartbeat_age_s=0.2)]
    return StatusSnapshot(
        pid=10, group="g", ordering="partition", elapsed_s=10.0, window_s=9.0, join_s=1.0,
        supervisor_cpu_s=2.0, window_cpu_s=WindowCpu(1.0, 2.0), supervisor_rss=2**22, records=records,
        rate=100.0, outputs=records - 3, dead_letters=3, discarded=0, batches=10, consumed=records + lag,
        deferred=1, restarts=2, paused=1, lag=lag, partitions=parts, workers=workers, revocations=[],
        committed={"in[0]": 500}, ready=True, rebalances=2,
        operator_pauses=[{"scope": "every topic of the group", "key": "*", "reason": "deploy", "by": "me@h",
                          "since_ms": 1, "until_ms": None}])


def scrape(metrics: RuntimeMetrics) -> dict[str, list[Any]]:
    from prometheus_client import generate_latest

    out: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in fam.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def value(samples: dict[str, list[Any]], name: str, **labels: str) -> float:
    (s,) = [s for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    return float(s.value)


def test_metrics_are_the_snapshots_values() -> None:
    m = RuntimeMetrics(lambda: snapshot(), loop_age=lambda: 0.5, group="g")
    m.histograms.observe_batch(0.2)
    m.histograms.observe_revocation(0.05)
    s = scrape(m)
    assert value(s, "ringmaster_records_processed_total") == 1000
    assert value(s, "ringmaster_dead_letters_total") == 3
    assert value(s, "kafka_consumergroup_group_lag", group="g", topic="in", partition="0") == 7
    assert value(s, "kafka_consumergroup_group_offset", topic="in", partition="0") == 500
    assert value(s, "ringmaster_paused_partitions", reason="operator") == 1
    assert value(s, "ringmaster_partition_paused", partition="0", reason="flow") == 1
    assert value(s, "ringmaster_worker_restarts_total", worker="0", cause="crashed") == 1
    assert value(s, "ringmaster_ring_fill_ratio", worker="0") == 0.25
    assert value(s, "ringmaster_loop_tick_age_seconds") == 0.5
    assert value(s, "ringmaster_batch_duration_seconds_count") == 1
    assert value(s, "ringmaster_operator_pauses", scope="group") == 1
    assert value(s, "ringmaster_operator_pauses", scope="topic") == 0
    assert "kafka_consumergroup_group_lag" in s and not [
        x for x in s["kafka_consumergroup_group_lag"] if x.labels["partition"] == "1"], "unknown lag: none"
    assert value(s, "ringmaster_oldest_unprocessed_seconds") == 2.5, "the worst partition's wait"
    assert value(s, "ringmaster_partition_oldest_unprocessed_seconds", partition="0") == 2.5
    ages = s["ringmaster_partition_oldest_unprocessed_seconds"]
    assert [x.labels["partition"] for x in ages] == ["0"], "none waiting: absent"


def test_the_plugin_version_and_reload_outcomes_are_metrics() -> None:
    """A failed reload (rolled back) shows on /metrics: an alert can fire on it."""
    failed = OperationStatus("reload", "failed", "SIGHUP", 1, 2, "the new plugin code cannot start: ...",
                             "v1", None, 2, 2)
    base = snapshot()
    workers = [w.__class__(**{**w.__dict__, "plugin_version": "v1"}) for w in base.workers]
    snap = base.__class__(**{**base.__dict__, "plugin": "probe", "plugin_version": "v1", "workers": workers,
                             "workers_target": 2, "workers_max": 4, "reload": failed,
                             "operations": {"reload succeeded": 2, "reload failed": 1, "scale succeeded": 1}})
    s = scrape(RuntimeMetrics(lambda: snap, group="g"))
    assert value(s, "ringmaster_plugin_info", plugin="probe", version="v1") == 1
    assert value(s, "ringmaster_worker_plugin_info", worker="1", version="v1") == 1
    assert value(s, "ringmaster_reload_last_successful") == 0
    assert value(s, "ringmaster_operations_total", operation="reload", result="failed") == 1
    assert value(s, "ringmaster_operations_total", operation="reload", result="succeeded") == 2
    assert value(s, "ringmaster_workers_target") == 2 and value(s, "ringmaster_workers_max") == 4
    ok = base.__class__(**{**snap.__dict__, "reload": OperationStatus("reload", "succeeded", "x", 1, 2, "")})
    assert value(scrape(RuntimeMetrics(lambda: ok, group="g")), "ringmaster_reload_last_successful") == 1


def test_per_partition_series_can_be_turned_off() -> None:
    s = scrape(RuntimeMetrics(lambda: snapshot(), partition_metrics=False, group="g"))
    assert "kafka_consumergroup_group_lag" not in s and value(s, "ringmaster_lag") == 7


def test_before_the_first_snapshot_only_liveness_metrics_are_there() -> None:
    s = scrape(RuntimeMetrics(lambda: None, group="g"))
    assert value(s, "ringmaster_up") == 1 and "ringmaster_records_processed_total" not in s


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_the_admin_endpoint_answers_each_path() -> None:
    state: dict[str, Any] = {"health": Health(True, []), "ready": False, "snap": None}
    m = RuntimeMetrics(lambda: state["snap"], group="g")
    server = AdminServer("127.0.0.1:0", False, m, lambda: state["snap"], lambda: state["health"],
                         lambda: state["ready"]).start()
    base = f"http://{server.address}"
    try:
        assert _get(base + "/readyz")[0] == 503
        assert _get(base + "/status")[0] == 503, "no snapshot yet"
        state.update(ready=True, snap=snapshot())
        assert _get(base + "/readyz")[0] == 200
        code, body = _get(base + "/status")
        assert code == 200 and json.loads(body)["records"] == 1000
        assert _get(base + "/healthz") == (200, b'{"ok": true, "reasons": []}')
        state["health"] = Health(False, ["worker 0 silent for 9 s"])
        code, body = _get(base + "/healthz")
        assert code == 503 and json.loads(body)["reasons"] == ["worker 0 silent for 9 s"]
        code, body = _get(base + "/metrics")
        assert code == 200 and b'ringmaster_records_processed_total{group="g"} 1000.0' in body
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()


@pytest.mark.parametrize(("listen", "remote", "expect"), [
    ("9464", False, ("127.0.0.1", 9464)), (":9464", False, ("127.0.0.1", 9464)),
    ("localhost:9464", False, ("127.0.0.1", 9464)), ("[::1]:9464", False, ("::1", 9464)),
    ("0.0.0.0:9464", True, ("0.0.0.0", 9464))])
def test_listen_addresses(listen: str, remote: bool, expect: tuple[str, int]) -> None:
    assert parse_listen(listen, remote) == expect


def test_a_remote_listen_address_needs_allow_remote() -> None:
    with pytest.raises(ConfigError, match="allow_remote"):
        parse_listen("0.0.0.0:9464", False)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_listen("host:port", False)


@pytest.mark.parametrize(("listen", "url"), [
    ("9464", "http://127.0.0.1:9464/status"), ("localhost:9464", "http://127.0.0.1:9464/status"),
    ("0.0.0.0:9464", "http://127.0.0.1:9464/status"), ("[::]:9464", "http://127.0.0.1:9464/status"),
    ("[::1]:9464", "http://[::1]:9464/status"), ("10.1.2.3:9464", "http://10.1.2.3:9464/status")])
def test_status_and_top_find_the_daemon_where_it_listens(listen: str, url: str) -> None:
    settings = Settings.model_validate({
        "kafka": {"bootstrap_servers": "b:1", "group_id": "g", "topics": ["t"]}, "workers": {"plugin": "p"},
        "admin": {"listen": listen, "allow_remote": True}})
    assert status_url(settings) == url


def _names_in(expr_text: str) -> set[str]:
    return set(re.findall(r"\b((?:ringmaster|kafka)_[a-z_]+)\b", expr_text))


def test_the_dashboard_and_alerts_use_only_metrics_that_exist() -> None:
    m = RuntimeMetrics(lambda: snapshot(), loop_age=lambda: 0.5, group="g")
    m.histograms.observe_batch(0.1)
    m.histograms.observe_revocation(0.1)
    exported = set(scrape(m))
    dashboard = json.loads((ROOT / "config" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [t["query"] for t in dashboard["templating"]["list"] if isinstance(t.get("query"), str)]
    alerts = (ROOT / "config" / "prometheus-alerts.yml").read_text()
    used = set().union(*map(_names_in, exprs)) | _names_in(alerts)
    assert used, "the files use metrics"
    missing = sorted(used - exported)
    assert not missing, f"dashboard/alerts refer to metrics /metrics does not export: {missing}"


def test_librdkafka_statistics_are_summed_up() -> None:
    stats = {"replyq": 3, "msg_cnt": 0, "rxmsgs": 10, "rxmsg_bytes": 100,
             "topics": {"t": {"partitions": {"0": {"fetchq_cnt": 5}, "1": {"fetchq_cnt": 7}, "-1": {}}}},
             "brokers": {"b": {"state": "UP", "rtt": {"avg": 2000, "cnt": 3}}}, "cgrp": {"rebalance_cnt": 4}}
    out = librdkafka_summary(stats)
    assert out["fetch_queue_messages"] == 12 and out["broker_rtt_avg_seconds"] == 0.002
    assert out["rebalances_total"] == 4


def test_status_and_top_render_a_snapshot_with_its_rates() -> None:
    snap = snapshot(records=1500).to_dict()
    snap["recent_rate"] = 250.0
    snap["partitions"][0]["rate"] = 248.0
    console = Console(width=160, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(Reading(snap, "http://x/status", True, "ready")))
    text = console.export_text()
    assert "in[0]" in text and "operator: deploy" in text and "248" in text and "250/s" in text
    assert "every topic" in text and "ready" in text



def _panel_exprs() -> list[str]:
    dashboard = json.loads((ROOT / "config" / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def _alert_exprs() -> list[str]:
    text = (ROOT / "config" / "prometheus-alerts.yml").read_text()
    return [line.split("expr:", 1)[1].strip() for line in text.splitlines()
            if line.strip().startswith("expr:")]


_SELECTOR = re.compile(r"\b((?:ringmaster|kafka)_[a-z_]+)\b(\{[^}]*\})?")


def test_every_ringmaster_series_carries_the_group_label() -> None:
    m = RuntimeMetrics(lambda: snapshot(), loop_age=lambda: 0.5, group="g")
    for name, samples in scrape(m).items():
        if name.startswith("process_"):  # the process collector's standard series: joined on instance
            continue
        for sample in samples:
            assert sample.labels.get("group") == "g", (name, sample.labels)


def test_worker_cpu_and_busy_seconds_and_the_supervisors_process_series_are_scraped() -> None:
    """Issue 28: where a worker's time goes (CPU over busy) and the supervisor's own CPU."""
    import os

    snap = snapshot()
    workers = [WorkerStatus(**{**w.__dict__, "cpu_s": 3.5 + w.index, "busy_s": 7.25 + w.index})
               for w in snap.workers]
    m = RuntimeMetrics(lambda: StatusSnapshot(**{**snap.__dict__, "workers": workers}), group="g")
    got: dict[str, list[Any]] = {}
    for fam in text_string_to_metric_families(m.exposition().decode()):  # what /metrics answers
        for sample in fam.samples:
            got.setdefault(sample.name, []).append(sample)
    assert value(got, "ringmaster_worker_cpu_seconds_total", group="g", worker="0") == 3.5
    assert value(got, "ringmaster_worker_cpu_seconds_total", group="g", worker="1") == 4.5
    assert value(got, "ringmaster_worker_busy_seconds_total", group="g", worker="1") == 8.25
    if os.path.exists("/proc/self/stat"):  # prometheus_client reads /proc (Linux)
        assert got["process_cpu_seconds_total"][0].value > 0
        assert got["process_resident_memory_bytes"][0].value > 0


def test_counters_that_can_be_zero_are_there_with_zero_from_the_first_scrape() -> None:
    from runtime.ops.status import EXIT_CAUSES

    snap = snapshot()
    snap = StatusSnapshot(**{**snap.__dict__, "operator_pauses": []})
    s = scrape(RuntimeMetrics(lambda: snap, group="g"))
    for worker in ("0", "1"):
        for cause in EXIT_CAUSES:
            expect = 1 if (worker, cause) in (("0", "crashed"), ("0", "recycled")) else 0
            assert value(s, "ringmaster_worker_restarts_total", worker=worker, cause=cause) == expect
    for scope in ("group", "topic", "partition"):
        assert value(s, "ringmaster_operator_pauses", scope=scope) == 0
    assert value(s, "ringmaster_batch_duration_seconds_count") == 0, "histograms exist before a batch"
    assert value(s, "ringmaster_revocation_seconds_count") == 0


def test_every_dashboard_panel_selects_the_chosen_group() -> None:
    exprs = _panel_exprs()
    assert exprs
    for expr in exprs:
        selectors = _SELECTOR.findall(expr)
        assert selectors, expr
        for name, matchers in selectors:
            assert 'group=~"$group"' in matchers, f"{name} in {expr!r} ignores the $group variable"


def test_the_alerts_do_not_depend_on_the_scrape_jobs_name() -> None:
    exprs = _alert_exprs()
    assert len(exprs) >= 8
    for expr in exprs:
        assert not re.search(r"\bjob\s*=~?", expr), f"{expr!r} needs a scrape job of a given name"
    (down,) = [e for e in exprs if e.startswith("(up == 0)")]
    assert "ringmaster_up" in down, "RingmasterDown knows a ringmaster target by what it exported"


def test_the_labels_the_dashboard_and_alerts_use_are_on_the_scraped_series() -> None:
    m = RuntimeMetrics(lambda: snapshot(), loop_age=lambda: 0.5, group="g")
    m.histograms.observe_batch(0.1)
    labels = {k for samples in scrape(m).values() for s in samples for k in s.labels}
    labels |= {"instance", "job"}  # what Prometheus adds to every scraped series
    used: set[str] = set()
    for expr in _panel_exprs() + _alert_exprs():
        for clause in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr):
            used |= {x.strip() for x in clause.split(",") if x.strip()}
        for matchers in re.findall(r"\{([^}]*)\}", expr):
            used |= {x.split("=")[0].strip(" !~") for x in matchers.split(",") if "=" in x}
    assert used and not used - labels, f"labels no scraped series has: {sorted(used - labels)}"


def test_a_share_groups_counts_are_metrics_and_in_the_view_and_absent_otherwise() -> None:
    import dataclasses

    counts = {"acquired": 10, "accepted": 7, "released": 2, "rejected": 0, "lock_expiries": 1}
    shared = dataclasses.replace(snapshot(), share=counts)
    s = scrape(RuntimeMetrics(lambda: shared, loop_age=lambda: 0.5, group="g"))
    for key, n in counts.items():
        assert value(s, f"ringmaster_share_records_{key}_total") == n
    assert not [k for k in scrape(RuntimeMetrics(lambda: snapshot(), group="g")) if "share" in k]
    console = Console(width=120, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render(Reading(shared.to_dict(), "status file", True, "ready")))
    text = console.export_text()
    assert "lock expiries" in text and "acquired" in text
