"""spark.source = "kafka" (Spark's own Kafka source): its config, the Java client properties
it is given, and which jars go to the session. The reading itself: tests/spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.config import load_settings
from runtime.errors import ConfigError
from runtime.java_client import java_properties
from runtime.spark import builtin_source

BASE = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["in"]
[kafka.consumer]
{consumer}
[workers]
plugin = "workers.fingerprint"
[spark]
{spark}
"""


def settings(tmp_path: Path, spark: str = 'source = "kafka"', consumer: str = "") -> Any:
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(spark=spark, consumer=consumer))
    return load_settings(path, check_plugin=False)


def test_security_properties_are_translated_and_local_tuning_left_out() -> None:
    props = java_properties({
        "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "u",
        "sasl.password": 'p"w', "ssl.ca.location": "/ca.pem", "ssl.endpoint.identification.algorithm": "none",
        "fetch.wait.max.ms": 100, "queued.max.messages.kbytes": 1, "group.protocol": "consumer",
        "enable.partition.eof": True})
    assert props == {
        "isolation.level": "read_committed", "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": "/ca.pem",
        "ssl.endpoint.identification.algorithm": "", "fetch.max.wait.ms": "100",
        "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                            'username="u" password="p\\"w";'}


def test_both_sources_read_committed_records_unless_told_otherwise() -> None:
    """librdkafka reads read_committed by default, the Java client read_uncommitted: the same
    records of a transactional topic reach the plugin from either source."""
    assert java_properties({})["isolation.level"] == "read_committed"
    assert java_properties({"isolation.level": "read_uncommitted"})["isolation.level"] == "read_uncommitted"


@pytest.mark.parametrize(("consumer", "needle"), [
    ('"ssl.key.location" = "/k.pem"', "kafka.consumer.ssl.key.location has no known equivalent"),
    ('"sasl.mechanisms" = "OAUTHBEARER"\n"sasl.username" = "u"', "only PLAIN and SCRAM logins"),
])
def test_a_property_without_a_java_equivalent_is_refused_by_name(tmp_path: Path, consumer: str,
                                                                 needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        settings(tmp_path, consumer=consumer)
    settings(tmp_path, spark='source = "python"', consumer=consumer)  # ours runs librdkafka: fine


@pytest.mark.parametrize(("spark", "needle"), [
    ('kafka_options = { "failOnDataLoss" = "false" }', "only apply to source = \"kafka\""),
    ('kafka_source_version = "4.2.0"', "only apply to source = \"kafka\""),
    ('source = "kafka"\nkafka_options = { "startingOffsets" = "earliest" }', "set by ringmaster"),
    ('source = "kafka"\nkafka_options = { "kafka.bootstrap.servers" = "x:1" }', "set by ringmaster"),
    ('source = "spark"', "source"),
])
def test_options_that_do_not_apply_are_refused(tmp_path: Path, spark: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        settings(tmp_path, spark=spark)


def test_patterns_are_refused_with_the_kafka_source(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(BASE.format(spark='source = "kafka"', consumer="").replace('["in"]', '["^in.*"]'))
    with pytest.raises(ConfigError, match="not by pattern"):
        load_settings(path, check_plugin=False)


def test_the_source_gets_the_user_options_over_the_translated_ones(tmp_path: Path) -> None:
    s = settings(tmp_path, spark='source = "kafka"\nkafka_options = { "failOnDataLoss" = false, '
                 '"kafka.isolation.level" = "read_uncommitted" }', consumer='"client.id" = "me"')
    opts = builtin_source.options(s)
    assert opts["kafka.bootstrap.servers"] == "127.0.0.1:1" and opts["subscribe"] == "in"
    assert opts["includeHeaders"] == "true" and opts["kafka.client.id"] == "me"
    assert opts["failOnDataLoss"] == "false" and opts["kafka.isolation.level"] == "read_uncommitted"


def test_pysparks_version_is_tried_first_then_the_nearest(tmp_path: Path) -> None:
    s = settings(tmp_path)
    assert builtin_source.candidates(s)[0] == builtin_source.pyspark_version()
    assert builtin_source.candidates(s)[-1] == builtin_source.NEAREST
    pinned = settings(tmp_path, spark='source = "kafka"\nkafka_source_version = "4.1.3"')
    assert builtin_source.candidates(pinned) == ["4.1.3"]


def test_jars_spark_ships_itself_are_not_added_again(tmp_path: Path) -> None:
    for name in ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "kafka-clients-3.9.2.jar", "commons-pool2-2.13.1.jar",
                 "scala-library-2.13.15.jar", "hadoop-client-api-3.5.0.jar", "snappy-java-1.1.10.5.jar"):
        (tmp_path / name).write_bytes(b"")
    kept = sorted(Path(j).name for j in builtin_source.jars(tmp_path))
    assert kept == ["commons-pool2-2.13.1.jar", "kafka-clients-3.9.2.jar",
                    "spark-sql-kafka-0-10_2.13-4.2.0.jar"]


def test_only_partitions_where_listoffsets_answers_short_are_named() -> None:
    listed = {"in": {"0": 1, "1": 50}}
    assert builtin_source.short_of_the_end(listed, {"in": {"0": 150, "1": 50}}) == "in[0] 1 < 150"
    assert builtin_source.short_of_the_end(listed, listed) == ""


ROOT = Path(__file__).resolve().parents[2]


def cli(tmp_path: Path, *args: str, spark: str = 'source = "kafka"', consumer: str = "") -> Any:
    import subprocess
    import sys

    path = tmp_path / "c.toml"
    path.write_text(BASE.format(spark=spark, consumer=consumer))
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args, "-c", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_check_says_where_the_offsets_of_the_kafka_source_live(tmp_path: Path) -> None:
    r = cli(tmp_path, "check", "--shallow")
    assert r.returncode == 0, r.stderr
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith('spark.source = "kafka"'))
    assert "keeps its offsets in the checkpoint" in line and "ringmaster commits the group's offsets" in line
    assert "operator pauses do not hold its partitions" in line


def test_source_kafka_on_the_command_line_is_validated_before_kafka_is_touched(tmp_path: Path) -> None:
    """--source kafka over a config that says python: the same refusal as in the file, one
    line and exit 2 (the bootstrap server is unreachable: nothing got that far)."""
    r = cli(tmp_path, "spark", "backfill", "--source", "kafka", spark='source = "python"',
            consumer='"ssl.key.location" = "/k.pem"')
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        line for line in r.stderr.strip().splitlines() if "ssl.key.location has no known equivalent" in line]


def test_source_python_on_the_command_line_refuses_options_of_the_kafka_source(tmp_path: Path) -> None:
    r = cli(tmp_path, "spark", "run", "--source", "python",
            spark='source = "kafka"\nkafka_options = { "failOnDataLoss" = "false" }')
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == ('ringmaster: error: --source python: spark.kafka_options only apply '
                                'to source = "kafka" (source is \'python\'): remove them, or set '
                                'source = "kafka"')
