"""Offset planning of the Spark source against a fake Kafka client: no Java, no broker, no
SparkSession. Partitions added to a running topic are only testable here: the test broker
(Tansu) does not support create_partitions."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from runtime.errors import RingmasterError
from runtime.execution.run import RetryPolicy
from runtime.spark import offsets as ko
from runtime.spark import source
from runtime.spark.apply import PluginJob, applier
from runtime.spark.source import KafkaRange, KafkaStreamReader


class FakeClient:
    """Partitions per topic, low/high watermarks and committed offsets, all changeable."""

    def __init__(self, partitions: dict[str, int], highs: dict[tuple[str, int], int],
                 lows: dict[tuple[str, int], int] | None = None,
                 commits: dict[tuple[str, int], int] | None = None) -> None:
        self.partitions = partitions
        self.highs = highs
        self.lows = lows or {}
        self.commits = commits or {}

    def list_topics(self, topic: str, timeout: float) -> Any:
        known = {topic: SimpleNamespace(partitions=dict.fromkeys(range(self.partitions[topic])), error=None)}
        return SimpleNamespace(topics=known if topic in self.partitions else {})

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0, cached: bool = False) -> Any:
        key = (tp.topic, tp.partition)
        return self.lows.get(key, 0), self.highs.get(key, 0)

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        return [TopicPartition(t.topic, t.partition, self.commits.get((t.topic, t.partition), OFFSET_INVALID))
                for t in tps]

    def close(self) -> None:
        pass


def tps(c: FakeClient) -> list[tuple[str, int]]:
    return ko.partitions_of(c, sorted(c.partitions))


# --- JSON offsets: strict and explicit -------------------------------------------------------

def test_json_offsets_resolve_spark_conventions() -> None:
    c = FakeClient({"in": 3}, highs={("in", 2): 40}, lows={("in", 1): 3})
    got = ko.parse(json.dumps({"in": {"0": 5, "1": -2, "2": -1}}), c, tps(c), "list")
    assert got == {"in": {"0": 5, "1": 3, "2": 40}}


@pytest.mark.parametrize(("ending", "fix"), [(False, "give -2 for earliest"), (True, "give -1 for latest")])
def test_json_offsets_missing_a_partition_are_an_error_naming_it(ending: bool, fix: str) -> None:
    c = FakeClient({"in": 3, "other": 1}, highs={})
    with pytest.raises(RingmasterError) as info:
        ko.parse(json.dumps({"in": {"0": 5}}), c, tps(c), "list", what="--from", ending=ending)
    msg = str(info.value)
    assert "in[1], in[2], other[0]" in msg and fix in msg and msg.startswith("--from")


@pytest.mark.parametrize(("given", "needle"), [
    ({"in": {"0": 1}, "nope": {"0": 1}}, "'nope' not in kafka.topics (in)"),
    ({"in": {"0": 1, "7": 1}}, "no such partition in[7]"),
    ({"in": {"0": -3}}, "in[0] must be -2 (earliest), -1 (latest) or an offset"),
    ({"in": {"0": "5"}}, "expected earliest, latest, committed or JSON"),
    ({"in": {"x": 5}}, "expected earliest, latest, committed or JSON"),
    (["in"], "expected earliest, latest, committed or JSON"),
])
def test_bad_json_offsets_are_refused(given: Any, needle: str) -> None:
    c = FakeClient({"in": 1}, highs={})
    with pytest.raises(RingmasterError) as info:
        ko.parse(json.dumps(given), c, tps(c), "list")
    assert needle in str(info.value)


def test_earliest_is_refused_as_an_end() -> None:
    c = FakeClient({"in": 1}, highs={})
    with pytest.raises(RingmasterError, match="must be -1"):
        ko.parse('{"in": {"0": -2}}', c, tps(c), "list", ending=True)


def test_committed_falls_back_to_earliest_per_partition_and_never_below_it() -> None:
    c = FakeClient({"in": 3}, highs={}, lows={("in", 0): 4, ("in", 1): 3, ("in", 2): 6},
                   commits={("in", 0): 7, ("in", 2): 2})  # in[2]: committed before retention
    assert ko.parse("committed", c, tps(c), "list") == {"in": {"0": 7, "1": 3, "2": 6}}


def test_committed_refuses_a_partition_the_coordinator_refused_rather_than_start_it_over() -> None:
    """A partition's own error in the answer (not authorised) is no offset: read as "none
    committed", the job would read it again from its starting offsets."""
    c = FakeClient({"in": 2}, highs={}, commits={("in", 0): 7, ("in", 1): 9})

    def refusing(tps: list[TopicPartition], timeout: float) -> list[Any]:
        refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
        return [SimpleNamespace(topic=t.topic, partition=t.partition, offset=-1001,
                                error=refused if t.partition else None) for t in tps]

    c.committed = refusing  # type: ignore[method-assign]
    with pytest.raises(RingmasterError, match=r"committed offsets: in\[1\]"):
        ko.parse("committed", c, tps(c), "list")


# --- backfill plan: what is read is what is counted ------------------------------------------

def test_plan_counts_exactly_the_ranges_it_reads() -> None:
    c = FakeClient({"in": 3}, highs={("in", 0): 100, ("in", 1): 50, ("in", 2): 0}, lows={("in", 1): 20})
    start, end = ko.plan(c, tps(c), "list", json.dumps({"in": {"0": 10, "1": 0, "2": -2}}), "latest")
    planned = ko.ranges(start, end)
    # in[1] 0..20 was deleted by retention: it is not read, so not counted; in[2] is empty.
    assert planned == [("in", 0, 10, 100), ("in", 1, 20, 50)]
    assert ko.records(planned) == 120


def test_plan_refuses_a_start_past_its_end() -> None:
    c = FakeClient({"in": 2}, highs={})
    with pytest.raises(RingmasterError, match=r"--from is past --to for in\[1\] 30 > 20"):
        ko.plan(c, tps(c), "list", '{"in": {"0": 0, "1": 30}}', '{"in": {"0": 5, "1": 20}}')


def test_ranges_never_skip_a_partition_without_a_start() -> None:
    with pytest.raises(RingmasterError, match=r"no start offset for in\[1\]"):
        ko.ranges({"in": {"0": 0}}, {"in": {"0": 5, "1": 5}})


# --- the streaming reader ----------------------------------------------------------------------

def reader(c: FakeClient, **options: str) -> KafkaStreamReader:
    r = KafkaStreamReader({"topics": ",".join(sorted(c.partitions)), "bootstrap": "x", "group": "g",
                           "endoffsets": "list", **options})
    r._client = c
    return r


def test_partitions_added_while_running_are_read_from_their_beginning() -> None:
    c = FakeClient({"in": 2}, highs={("in", 0): 10, ("in", 1): 10})
    r = reader(c)
    start = r.initialOffset()
    first = r.latestOffset(start, ReadAllAvailable())
    assert first == {"in": {"0": 10, "1": 10}}
    c.partitions["in"] = 3  # a partition is added while the query runs
    c.highs[("in", 2)] = 50
    second = r.latestOffset(first, ReadAllAvailable())
    assert second == {"in": {"0": 10, "1": 10, "2": 50}}
    assert r.partitions(first, second) == [KafkaRange("in", 2, 0, 50)]


def test_a_partition_missing_from_the_checkpoint_starts_at_earliest_within_the_limit() -> None:
    c = FakeClient({"in": 2}, highs={("in", 0): 100, ("in", 1): 60}, lows={("in", 1): 5})
    r = reader(c)
    checkpoint = {"in": {"0": 90}}  # restart: in[1] is not in the checkpoint's offsets
    end = r.latestOffset(checkpoint, ReadMaxRows(40))
    assert end == {"in": {"0": 100, "1": 35}}, "in[1]'s backlog from its low watermark shares the budget"
    planned = r.partitions(checkpoint, end)
    assert planned == [KafkaRange("in", 0, 90, 100), KafkaRange("in", 1, 5, 35)]
    assert sum(p.end - p.start for p in planned) == 40
    assert r.latestOffset(end, ReadMaxRows(1000)) == {"in": {"0": 100, "1": 60}}


def test_a_lower_end_never_moves_a_partition_back() -> None:
    c = FakeClient({"in": 1}, highs={("in", 0): 40})  # e.g. a stale ListOffsets answer
    r = reader(c)
    assert r.latestOffset({"in": {"0": 50}}, ReadAllAvailable()) == {"in": {"0": 50}}
    assert r.latestOffset({"in": {"0": 50}}, ReadMaxRows(10)) == {"in": {"0": 50}}


def test_available_now_reads_to_the_target_including_partitions_new_since_the_checkpoint() -> None:
    c = FakeClient({"in": 2}, highs={("in", 0): 30, ("in", 1): 20})
    r = reader(c)
    r.prepareForTriggerAvailableNow()
    c.highs[("in", 0)] = 1000  # arrives after the run started: not part of it
    end = r.latestOffset({"in": {"0": 10}}, ReadMaxRows(1000))
    assert end == {"in": {"0": 30, "1": 20}}


def test_admission_shares_the_budget_fairly() -> None:
    got = ko.admit({"a": {"0": 0, "1": 0}, "b": {"0": 0}}, {"a": {"0": 5, "1": 100}, "b": {"0": 100}}, 61)
    assert got == {"a": {"0": 5, "1": 28}, "b": {"0": 28}}
    assert sum(got["a"].values()) + got["b"]["0"] == 61


# --- plugin outputs for a Parquet backfill ------------------------------------------------------

def apply_probe(to_parquet: bool, output_topic: str | None) -> list[dict[str, Any]]:
    rows = [{"topic": "in", "partition": 0, "offset": i, "key": b"k", "value": v, "headers": [],
             "timestamp_type": 0, "timestamp": 0} for i, v in enumerate([b"a", b"reject:b", b"c"])]
    job = PluginJob("probe", {}, output_topic, "dlq", RetryPolicy(1, 0, 0), to_parquet)
    out = list(applier(job)(iter([pa.RecordBatch.from_pylist(rows)])))
    return [r for rb in out for r in rb.to_pylist()]


def test_parquet_backfill_keeps_outputs_without_an_output_topic() -> None:
    rows = apply_probe(to_parquet=True, output_topic=None)
    assert [r["topic"] for r in rows] == [None, None, "dlq"]
    assert [json.loads(r["value"])["id"] for r in rows[:2]] == ["a", "c"]
    assert rows[2]["value"] == b"reject:b"


def test_kafka_sink_rows_need_a_topic() -> None:
    assert [r["topic"] for r in apply_probe(to_parquet=False, output_topic=None)] == ["dlq"]
    assert [r["topic"] for r in apply_probe(to_parquet=False, output_topic="out")] == ["out", "out", "dlq"]


class FakePauses:
    def __init__(self, paused: set[tuple[str, int]]) -> None:
        self.paused = paused

    def poll(self) -> bool:
        return True

    def pause_for(self, tp: tuple[str, int]) -> Any:
        return object() if tp in self.paused else None


def test_an_operator_pause_holds_its_partitions_where_they_are_under_spark() -> None:
    c = FakeClient({"in": 2}, highs={("in", 0): 100, ("in", 1): 100})
    r = reader(c, control=json.dumps({"topic": "ctl", "props": {}, "load_timeout_s": 1}))
    pauses = FakePauses({("in", 1)})
    r._pauses = pauses  # as loaded from the control topic
    start = {"in": {"0": 10, "1": 20}}
    assert r.latestOffset(start, ReadAllAvailable()) == {"in": {"0": 100, "1": 20}}
    assert r.latestOffset(start, ReadMaxRows(30)) == {"in": {"0": 40, "1": 20}}, "the budget goes elsewhere"
    pauses.paused.clear()
    assert r.latestOffset(start, ReadAllAvailable()) == {"in": {"0": 100, "1": 100}}, "resumed: read again"


def test_spark_progress_reports_become_the_status_snapshot_even_when_offsets_are_missing() -> None:
    from fakes import settings as make_settings

    from runtime.spark.progress import SparkStatus

    status = SparkStatus(make_settings())
    status.update({"batchId": 0, "numInputRows": 0, "sources": [{"endOffset": "", "latestOffset": None}]})
    status.update({"batchId": 1, "numInputRows": 30, "processedRowsPerSecond": 12.5,
                   "sources": [{"endOffset": '{"in": {"0": 30}}', "latestOffset": '{"in": {"0": 50}}'}]})
    status.update({"batchId": 1, "numInputRows": 30})  # the same batch again (listener + lastProgress)
    snap = status.snapshot
    assert snap is not None and snap.records == 30 and snap.rate == 12.5
    (part,) = snap.partitions
    assert (part.committed, part.high, part.lag) == (30, 50, 20)


def test_a_plan_of_no_partitions_reads_nothing() -> None:
    """Spark turns an empty partition list into one plain InputPartition(None) (issue 17.10)."""
    from pyspark.sql.datasource import InputPartition

    from runtime.spark.source import read_range

    assert list(read_range({"bootstrap": "127.0.0.1:1", "group": "g"}, InputPartition(None))) == []


def test_a_plugin_that_changes_its_records_fails_them_as_read_on_spark_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import probe

    from runtime.spark import apply as apply_mod

    monkeypatch.setattr(apply_mod, "_loaded", {})  # a probe of its own, with these settings
    monkeypatch.setattr(probe, "_mutate", probe._mutate)  # setup() sets it: restored after the test
    rows = [{"topic": "in", "partition": 3, "offset": 40 + i, "key": b"k", "value": v,
             "headers": [{"key": "trace", "value": b"t"}], "timestamp_type": 0, "timestamp": 0}
            for i, v in enumerate([b"a", b"raise:b", b"c"])]
    mutate = {"mutate": ["value", "headers", "coordinates"]}
    job = PluginJob("probe", mutate, "out", "dlq", RetryPolicy(2, 0, 0))
    out = [r for rb in applier(job)(iter([pa.RecordBatch.from_pylist(rows)])) for r in rb.to_pylist()]
    assert [json.loads(r["value"])["id"] for r in out if r["topic"] == "out"] == ["a", "c"]
    (dead,) = [r for r in out if r["topic"] == "dlq"]
    h = {x["key"]: x["value"] for x in dead["headers"]}
    assert dead["value"] == b"raise:b" and h["trace"] == b"t" and "probe.int" not in h
    source = [h[f"ringmaster.source.{f}"] for f in ("topic", "partition", "offset")]
    assert source == [b"in", b"3", b"41"]


# --- the end of a partition: never short, whatever the broker answers ---------------------------

class StaleListOffsets(FakeClient):
    """A broker like Tansu: ListOffsets answers short of the end (``listed``); a fetch's
    response carries the true high watermark (``highs``), cached once a partition answered."""

    def __init__(self, listed: dict[tuple[str, int], int], highs: dict[tuple[str, int], int]) -> None:
        super().__init__({"in": len(highs)}, highs)
        self.listed = listed
        self.assigned: list[TopicPartition] = []
        self.answered: set[tuple[str, int]] = set()

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0, cached: bool = False) -> Any:
        key = (tp.topic, tp.partition)
        if cached:
            assert key in self.answered, "the cached watermark is read only after a fetch answered"
            return 0, self.highs[key]
        return 0, self.listed[key]

    def assign(self, parts: list[TopicPartition]) -> None:
        self.assigned = parts

    def unassign(self) -> None:
        self.assigned = []

    def consume(self, n: int, timeout: float) -> list[Any]:
        out = []
        for tp in self.assigned:
            key = (tp.topic, tp.partition)
            self.answered.add(key)  # a record at tp.offset, or an EOF event: either names it
            out.append(SimpleNamespace(topic=lambda t=tp.topic: t, partition=lambda p=tp.partition: p))
        return out


def test_by_default_the_end_is_checked_by_a_fetch_and_a_stale_listoffsets_is_corrected() -> None:
    """Issue 28: `spark run --until-caught-up` on the dev broker processed 13 of 16 records and
    exited 0; `backfill --to latest` planned an end short of the true one."""
    c = StaleListOffsets(listed={("in", 0): 3, ("in", 1): 5}, highs={("in", 0): 8, ("in", 1): 5})
    assert ko.latest(c, tps(c), "checked") == {"in": {"0": 8, "1": 5}}  # type: ignore[arg-type]
    assert [(t.partition, t.offset) for t in c.assigned] == [], "unassigned after"
    assert ko.latest(c, tps(c), "list") == {"in": {"0": 3, "1": 5}}, "list trusts ListOffsets"  # type: ignore[arg-type]
    from runtime.config import SparkSettings

    assert SparkSettings().end_offsets == "checked", "the honest end is the default"
    start, end = ko.plan(c, tps(c), SparkSettings().end_offsets, "earliest", "latest")  # type: ignore[arg-type]
    assert ko.records(ko.ranges(start, end)) == 13


def test_checked_fetches_at_the_listed_end_not_from_the_beginning() -> None:
    c = StaleListOffsets(listed={("in", 0): 1_000_000}, highs={("in", 0): 1_000_000})
    seen: list[list[tuple[int, int]]] = []
    assign = c.assign
    c.assign = lambda parts: (seen.append([(t.partition, t.offset) for t in parts]), assign(parts))[1]  # type: ignore[method-assign]
    assert ko.latest(c, tps(c), "checked") == {"in": {"0": 1_000_000}}  # type: ignore[arg-type]
    assert seen == [[(0, 1_000_000)]], "one small fetch at the end: nothing before it is read"


def test_a_partition_that_never_answers_a_fetch_is_an_error_naming_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = StaleListOffsets(listed={("in", 0): 3, ("in", 1): 5}, highs={("in", 0): 8, ("in", 1): 5})
    c.consume = lambda n, timeout: []  # type: ignore[method-assign]
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(ko.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(RingmasterError, match=r"no fetch response within 30 s for in\[0\], in\[1\]"):
        ko.latest(c, tps(c), "checked")  # type: ignore[arg-type]


class StaleClient(FakeClient):
    """A client whose metadata names a leader that is gone: every ask of offsets fails, as the
    driver's client did on a three-node cluster with a partition's leader killed."""

    closed = False

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float = 0, cached: bool = False) -> Any:
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to get watermark offsets"))

    def close(self) -> None:
        self.closed = True


def test_a_question_the_drivers_client_fails_is_asked_again_on_a_new_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A micro-batch is planned on a new client when the driver's fails to answer (source.py,
    _ask); the one that failed is closed. Only when ASK_ATTEMPTS clients in a row fail does the
    question fail the query."""
    monkeypatch.setattr(source, "ASK_AGAIN_AFTER_S", 0.0)
    stale = StaleClient({"in": 2}, highs={})
    fresh = FakeClient({"in": 2}, highs={("in", 0): 10, ("in", 1): 7})
    made: list[FakeClient] = [fresh]
    monkeypatch.setattr(source.ko, "client", lambda props: made.pop(0))
    r = reader(stale)
    assert r.latestOffset({"in": {"0": 0, "1": 0}}, ReadAllAvailable()) == {"in": {"0": 10, "1": 7}}
    assert stale.closed and r._client is fresh

    failing = [StaleClient({"in": 2}, highs={}) for _ in range(source.ASK_ATTEMPTS - 1)]
    made[:] = list(failing)
    r = reader(StaleClient({"in": 2}, highs={}))
    with pytest.raises(KafkaException):
        r.latestOffset({"in": {"0": 0, "1": 0}}, ReadAllAvailable())
    assert not made and all(c.closed for c in failing), f"{source.ASK_ATTEMPTS} clients, each closed"
