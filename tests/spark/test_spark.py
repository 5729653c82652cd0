"""The same plugin on Spark (local mode) against the real broker, through the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    ROOT,
    TEST_BROKER,
    Ringmaster,
    base_config,
    committed,
    make_topics,
    produce,
    produce_rows,
    read_topic,
    to_toml,
    unique,
    wait_for,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(600)]


def orders(n: int, start: int = 0) -> list[str]:
    values = [json.dumps({"order_id": f"o{i}", "customer": f"c{i % 7}", "currency": "USD",
                          "items": [{"sku": "a", "qty": 1 + i % 3, "unit_price": 2.5}], "ts": i})
              for i in range(start, start + n)]
    for i in range(5, n, 97):
        values[i] = f"broken-{start + i}"
    return values


def spark_config(broker: Any, names: dict[str, str], tmp_path: Path, **spark: Any) -> dict[str, Any]:
    cfg = base_config(broker.bootstrap, names["in"], names["g"], tmp_path)
    cfg["workers"] = {"plugin": "workers.enrich"}
    cfg["output"] = {"topic": names["out"]}
    cfg["dead_letter"] = {"topic": names["dlq"]}
    # The embedded broker's ListOffsets is stale; the default end_offsets ("checked") corrects
    # it with a fetch, as it must on any broker.
    cfg["spark"] = {"master": "local[2]", "trigger": "availableNow",
                    "checkpoint_location": str(tmp_path / "checkpoint"), **spark}
    return cfg


def ringmaster(cfg: dict[str, Any], tmp_path: Path, *args: str, wait: bool = True, exit_code: int = 0) -> Any:
    path = tmp_path / f"spark-{len(list(tmp_path.glob('spark-*.toml')))}.toml"
    path.write_text(to_toml(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "plugins")]))
    cmd = [sys.executable, "-m", "runtime.cli", *args, "-c", str(path)]
    if not wait:
        return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert r.returncode == exit_code, r.stderr[-4000:]
    return r


@pytest.fixture
def names() -> dict[str, str]:
    return {k: unique(k) for k in ("in", "out", "dlq", "g")}


def values_of(broker: Any, topic: str, n: int) -> list[bytes]:
    return sorted(m.value() for m in read_topic(broker.bootstrap, topic, n, timeout_s=30))


def test_spark_run_gives_the_same_outputs_as_ringmaster_run_and_commits(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = orders(600)
    counts = produce(broker.bootstrap, names["in"], values, 2)
    bad = sum(v.startswith("broken") for v in values)
    ringmaster(spark_config(broker, names, tmp_path, max_records_per_trigger=250), tmp_path, "spark", "run")
    spark_out = values_of(broker, names["out"], 600 - bad)
    spark_dlq = values_of(broker, names["dlq"], bad)
    assert committed(broker.bootstrap, names["g"], names["in"], 2) == counts, "group offsets committed"

    local = dict(names, out=unique("out"), dlq=unique("dlq"), g=unique("g"))
    make_topics(broker.bootstrap, 1, local["out"], local["dlq"])
    cfg = spark_config(broker, local, tmp_path)
    cfg["workers"]["processes"] = 2
    rm = Ringmaster(cfg, tmp_path, "local", args=["--until-caught-up"])
    try:
        assert rm.wait(120) == 0, rm.log_tail()
    finally:
        rm.close()
    broken = sorted(v.encode() for v in values if v.startswith("broken"))
    assert spark_dlq == broken, "Spark's dead letters"
    assert spark_out == values_of(broker, local["out"], 600 - bad)
    assert values_of(broker, local["dlq"], bad) == broken, "the daemon's dead letters"


def test_a_batch_run_on_the_dev_broker_processes_every_record_and_says_so(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """Issue 28: on the dev broker (stale ListOffsets) `spark run --until-caught-up` processed
    13 of 16 records and exited 0 with no summary; `backfill --to latest` planned short."""
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = [json.dumps({"order_id": f"o{i}", "customer": "c", "currency": "USD",
                          "items": [{"sku": "a", "qty": 1, "unit_price": 1.0}], "ts": i}) for i in range(16)]
    counts: dict[int, int] = {}
    for part in (values[:5], values[5:9], values[9:13], values[13:]):  # several record batches each
        for p, n in produce(broker.bootstrap, names["in"], part, 2).items():
            counts[p] = counts.get(p, 0) + n
    cfg = spark_config(broker, names, tmp_path)
    cfg["spark"].pop("trigger")
    r = ringmaster(cfg, tmp_path, "spark", "run", "--until-caught-up")
    assert "spark run: 16 record(s) in" in r.stderr and "caught up" in r.stderr, r.stderr[-2000:]
    assert committed(broker.bootstrap, names["g"], names["in"], 2) == counts
    assert len(values_of(broker, names["out"], 16)) == 16
    plan = ringmaster(cfg, tmp_path, "spark", "backfill", "--from", "earliest", "--to", "latest",
                      "--parquet", str(tmp_path / "pq"))
    assert json.loads(plan.stdout)["records"] == 16


def test_restart_from_the_checkpoint_loses_nothing(broker: Any, names: dict[str, str],
                                                   tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    first = orders(300)
    produce(broker.bootstrap, names["in"], first, 2)
    cfg = spark_config(broker, names, tmp_path, max_records_per_trigger=100)
    ringmaster(cfg, tmp_path, "spark", "run")
    second = orders(300, 300)
    produce(broker.bootstrap, names["in"], second, 2)
    ringmaster(cfg, tmp_path, "spark", "run")
    good = [v for v in first + second if not v.startswith("broken")]
    ids = {json.loads(v)["order_id"] for v in values_of(broker, names["out"], len(good))}
    assert ids == {json.loads(v)["order_id"] for v in good}
    assert committed(broker.bootstrap, names["g"], names["in"], 2) == {0: 300, 1: 300}


def test_backfill_writes_exactly_the_range(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    values = [json.dumps({"order_id": f"o{i}", "customer": "c", "currency": "EUR",
                          "items": [{"sku": "a", "qty": 1, "unit_price": 1.0}]}) for i in range(200)]
    produce(broker.bootstrap, names["in"], values, 2)  # partition p gets values[p::2]
    cfg = spark_config(broker, names, tmp_path)
    start = json.dumps({names["in"]: {"0": 10, "1": 0}})
    end = json.dumps({names["in"]: {"0": 60, "1": 25}})
    r = ringmaster(cfg, tmp_path, "spark", "backfill", "--from", start, "--to", end)
    assert json.loads(r.stdout.strip().splitlines()[-1])["records"] == 75
    expected = {f"o{2 * i}" for i in range(10, 60)} | {f"o{2 * i + 1}" for i in range(0, 25)}
    got = [json.loads(v)["order_id"] for v in values_of(broker, names["out"], 75)]
    assert sorted(got) == sorted(expected), "exactly the range, each once"
    parquet = tmp_path / "parquet"
    ringmaster(cfg, tmp_path, "spark", "backfill", "--from", start, "--to", end, "--parquet", str(parquet))
    import pyarrow.parquet as pq
    assert pq.read_table(parquet).num_rows == 75


@pytest.mark.parametrize(("start", "end"), [("latest", "latest"), ("earliest", "earliest"), ("json", "json")])
def test_an_empty_backfill_is_a_summary_of_nothing(broker: Any, names: dict[str, str], tmp_path: Path,
                                                   start: str, end: str) -> None:
    """Issue 17.10: an empty range died with AttributeError: 'InputPartition' object has no
    attribute 'topic' and ~300 lines of JVM traces."""
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    produce(broker.bootstrap, names["in"], orders(20), 2)
    if start == "json":
        start = end = json.dumps({names["in"]: {"0": 4, "1": 4}})
    cfg = spark_config(broker, names, tmp_path)
    r = ringmaster(cfg, tmp_path, "spark", "backfill", "--from", start, "--to", end)
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["records"] == 0 and summary["target"] == names["out"], summary
    for noise in ("Traceback", "Exception", "py4j", "AttributeError"):
        assert noise not in r.stderr, r.stderr[-3000:]
    assert read_topic(broker.bootstrap, names["out"], 1, timeout_s=3, settle_s=0) == [], "nothing written"


def test_spark_reads_an_empty_range_as_no_rows(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """The source itself, as Spark calls it: a plan of no partitions reaches read() as one
    plain InputPartition(None). In a process of its own: its JVM ends with it."""
    make_topics(broker.bootstrap, 1, names["in"])
    produce(broker.bootstrap, names["in"], orders(5), 1)
    config = tmp_path / "empty.toml"
    config.write_text(to_toml(spark_config(broker, names, tmp_path)))
    script = (
        "import sys\n"
        "from runtime.config import load_settings\n"
        "from runtime.spark.job import session, source_options\n"
        "from runtime.spark.source import NAME\n"
        "settings = load_settings(sys.argv[1])\n"
        "spark = session(settings)\n"
        "opts = {**source_options(settings), 'startingOffsets': 'latest', 'endingOffsets': 'latest'}\n"
        "print('rows', spark.read.format(NAME).options(**opts).load().count())\n"
        "spark.stop()\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "plugins")]))
    r = subprocess.run([sys.executable, "-c", script, str(config)], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0 and "rows 0" in r.stdout, r.stderr[-3000:]
    assert "AttributeError" not in r.stderr


def test_parquet_backfill_without_an_output_topic_keeps_every_output(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 1, names["in"], names["dlq"])
    values = orders(40)
    produce(broker.bootstrap, names["in"], values, 1)
    cfg = spark_config(broker, names, tmp_path)
    del cfg["output"]  # in Parquet mode the directory is the destination
    parquet = tmp_path / "parquet"
    r = ringmaster(cfg, tmp_path, "spark", "backfill", "--from", json.dumps({names["in"]: {"0": -2}}),
                   "--to", json.dumps({names["in"]: {"0": -1}}), "--parquet", str(parquet))
    assert json.loads(r.stdout.strip().splitlines()[-1])["records"] == 40
    import pyarrow.parquet as pq
    rows = pq.read_table(parquet).to_pylist()
    bad = sorted(v.encode() for v in values if v.startswith("broken"))
    assert sorted(r["value"] for r in rows if r["topic"] == names["dlq"]) == bad, "dead letters"
    outputs = [r for r in rows if r["topic"] is None]
    assert len(outputs) == 40 - len(bad) and len(rows) == 40


def test_key_ordering_on_spark_keeps_each_key_in_offset_order(broker: Any, names: dict[str, str],
                                                              tmp_path: Path) -> None:
    """workers.ordering = "key" means the same on Spark: records spread over tasks by key,
    each key's records reaching one task in offset order (rows of one task keep their order
    in its Parquet file)."""
    make_topics(broker.bootstrap, 2, names["in"], names["dlq"])
    rows = [(f"k{i % 20}".encode(), f"r{i}".encode(), None) for i in range(400)]
    produce_rows(broker.bootstrap, names["in"], rows, 2)
    cfg = spark_config(broker, names, tmp_path, ordering_tasks=3)
    cfg["workers"] = {"plugin": "probe", "ordering": "key"}
    del cfg["output"]
    parquet = tmp_path / "parquet"
    r = ringmaster(cfg, tmp_path, "spark", "backfill", "--parquet", str(parquet))
    assert json.loads(r.stdout.strip().splitlines()[-1])["records"] == 400
    import pyarrow.parquet as pq
    out = [(row["key"], json.loads(row["value"])) for row in pq.read_table(parquet).to_pylist()]
    assert sorted(body["id"] for _, body in out) == sorted(f"r{i}" for i in range(400)), "each record once"
    by_key: dict[tuple[int, bytes], list[int]] = {}
    for key, body in out:
        by_key.setdefault((body["p"], key), []).append(body["o"])
    for key, offsets in by_key.items():
        assert offsets == sorted(offsets), f"{key}: {offsets}"


def test_streaming_run_stops_cleanly_on_sigterm(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    counts = produce(broker.bootstrap, names["in"], orders(200), 2)
    proc = ringmaster(spark_config(broker, names, tmp_path, trigger="1 second"), tmp_path, "spark", "run",
                      wait=False)
    try:
        def done() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"exit {proc.returncode}: {proc.stderr.read()[-3000:]}")
            return committed(broker.bootstrap, names["g"], names["in"], 2) == counts
        try:
            wait_for(done, 180, "the Spark job to commit the group's offsets", interval_s=1)
        except AssertionError:
            proc.kill()
            raise AssertionError(proc.communicate(timeout=30)[1][-4000:]) from None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


# --- Spark's own Kafka source (spark.source = "kafka") beside ours ----------------------------

def outputs_of(broker: Any, topic: str, n: int) -> list[tuple[bytes | None, bytes]]:
    return sorted((m.key(), m.value()) for m in read_topic(broker.bootstrap, topic, n, timeout_s=30))


@pytest.mark.timeout(1200)  # two Spark applications, one per source
def test_both_sources_give_the_same_backfill(broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """The same plugin over the same range, read by our source and by Spark's (--source kafka
    over a config that says python): the same outputs, the same records dead-lettered."""
    make_topics(broker.bootstrap, 2, names["in"])
    values = orders(400)
    produce(broker.bootstrap, names["in"], values, 2)
    bad = sorted(v.encode() for v in values if v.startswith("broken"))
    got = {}
    for source in ("python", "kafka"):
        dest = dict(names, out=unique("out"), dlq=unique("dlq"))
        make_topics(broker.bootstrap, 1, dest["out"], dest["dlq"])
        r = ringmaster(spark_config(broker, dest, tmp_path), tmp_path, "spark", "backfill",
                       "--source", source)
        assert json.loads(r.stdout.strip().splitlines()[-1])["records"] == 400
        got[source] = (outputs_of(broker, dest["out"], 400 - len(bad)),
                       values_of(broker, dest["dlq"], len(bad)))
    assert got["kafka"] == got["python"]
    assert got["kafka"][1] == bad, "the poison records dead-lettered"


@pytest.mark.timeout(1200)  # two Spark applications, one per source
def test_both_sources_give_the_same_stream_and_both_commit_the_group(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """`spark run --until-caught-up` with each source, a group each: the same outputs and dead
    letters, and the group's offsets committed to the end by ringmaster's listener with either
    (Spark's source keeps its own in the checkpoint). On a broker whose ListOffsets answers
    short of the end (Tansu), Spark's source stops there: the run warns and exits 9 naming
    what is left, never 0."""
    make_topics(broker.bootstrap, 2, names["in"])
    values = orders(400)
    counts = produce(broker.bootstrap, names["in"], values, 2)
    bad = sorted(v.encode() for v in values if v.startswith("broken"))
    got = {}
    for source in ("python", "kafka"):
        dest = dict(names, out=unique("out"), dlq=unique("dlq"), g=unique("g"))
        make_topics(broker.bootstrap, 1, dest["out"], dest["dlq"])
        cfg = spark_config(broker, dest, tmp_path, source=source, max_records_per_trigger=150,
                           checkpoint_location=str(tmp_path / f"checkpoint-{source}"))
        if source == "kafka" and TEST_BROKER == "tansu":
            r = ringmaster(cfg, tmp_path, "spark", "run", exit_code=9)
            assert "ListOffsets answers short of the end" in r.stderr, r.stderr[-3000:]
            assert "did not catch up" in r.stderr, r.stderr[-3000:]
            return
        ringmaster(cfg, tmp_path, "spark", "run")
        assert committed(broker.bootstrap, dest["g"], names["in"], 2) == counts, f"{source}: group committed"
        got[source] = (outputs_of(broker, dest["out"], 400 - len(bad)),
                       values_of(broker, dest["dlq"], len(bad)))
    assert got["kafka"] == got["python"]
    assert got["kafka"][1] == bad, "the poison records dead-lettered"
