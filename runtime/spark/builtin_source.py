"""Spark's own Kafka source (``spark.source = "kafka"``: format ``kafka``, spark-sql-kafka-0-10).

Runs in: the driver. The same plugin, sink, outputs and dead letters as with ringmaster's
source (runtime/spark/source.py); only the reading differs:

* its jars (and kafka-clients, commons-pool2, spark-token-provider-kafka-0-10) are resolved
  with Maven on first use and cached like Apache Kafka's (runtime/dev/maven.py);
* it runs the Java client, given the user's connection and security properties translated
  from librdkafka's (runtime/java_client.py) plus ``spark.kafka_options`` as they are;
* it keeps its offsets in the checkpoint and never commits to the consumer group; the
  query listener in job.py commits each micro-batch's end to the group, as for our source.
  ``startingOffsets`` (used only without a checkpoint) is the group's committed offsets,
  earliest where there are none, read here with our client;
* a streaming micro-batch ends where the broker's ListOffsets says (``end_offsets`` does not
  apply there: it still plans backfills and the ``--until-caught-up`` target);
* operator pauses (``ringmaster pause``) do not hold its partitions.
"""

from __future__ import annotations

import json
import logging
import re
from importlib import metadata
from pathlib import Path
from typing import Any

from runtime.config import Settings
from runtime.dev import maven
from runtime.errors import ArtifactMissing, RingmasterError
from runtime.java_client import java_properties

log = logging.getLogger("ringmaster.spark")

SCALA = "2.13"
# The newest spark-sql-kafka-0-10 on Maven Central when PySpark 4.3.0 was current, which was
# not there yet: used when PySpark's own version is missing (tests/spark run it with 4.3.0).
NEAREST = "4.2.0"
_JAR = re.compile(r"^(.+)-\d[\w.]*\.jar$")


def pyspark_version() -> str | None:
    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def candidates(settings: Settings) -> list[str]:
    """The versions to try, in order: ``kafka_source_version``, else PySpark's then NEAREST."""
    if settings.spark.kafka_source_version:
        return [settings.spark.kafka_source_version]
    own = pyspark_version()
    return list(dict.fromkeys([v for v in (own, NEAREST) if v]))


def _home(version: str) -> Path:
    return maven.cache_root() / f"spark-sql-kafka-{SCALA}-{version}"


def _marker(version: str) -> str:
    return f"spark-sql-kafka-0-10_{SCALA}-{version}.jar"


def _missing_mark(version: str) -> Path:
    return _home(version) / "not-on-maven-central"


def resolve(settings: Settings) -> tuple[str, Path]:
    """The version used and its jar directory, resolved with Maven the first time. A version
    Central does not have is remembered (a file in its cache dir: delete it to try again) and
    the next candidate is used, with a warning."""
    versions = candidates(settings)
    for i, version in enumerate(versions):
        last = i == len(versions) - 1
        if _missing_mark(version).exists() and not last:
            continue
        try:
            libs = maven.resolve(_home(version), [maven.Artifact(
                "org.apache.spark", f"spark-sql-kafka-0-10_{SCALA}", version)], _marker(version),
                f"Spark's Kafka source {version}")
        except ArtifactMissing:
            if last:
                raise
            _missing_mark(version).write_text("Maven Central had no spark-sql-kafka-0-10 of this version\n")
            log.warning("spark-sql-kafka-0-10 is not on Maven Central in PySpark's version; using the "
                        "nearest", extra={"wanted": version, "using": versions[i + 1]})
            continue
        if version != pyspark_version():
            log.info("Spark's Kafka source is of another version than PySpark",
                     extra={"kafka_source": version, "pyspark": pyspark_version()})
        return version, libs
    raise RingmasterError("no spark-sql-kafka-0-10 version to try")  # candidates() is never empty


def jars(libs: Path) -> list[str]:
    """The jars to add to the session: the resolved ones, less those Spark ships itself (its
    own Scala library, Hadoop client, compression codecs), whose copy must win."""
    import pyspark

    shipped = {_artifact(j.name) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    return [str(j) for j in sorted(libs.glob("*.jar")) if _artifact(j.name) not in shipped]


def _artifact(name: str) -> str:
    m = _JAR.match(name)
    return m.group(1) if m else name


def describe(settings: Settings) -> str:
    """What ``ringmaster check`` says of the source (without resolving anything)."""
    versions = candidates(settings)
    if not versions:
        return 'spark.source = "kafka" needs PySpark: pip install \'kafka-ringmaster[spark]\''
    ready = [v for v in versions if maven.resolved(_home(v), _marker(v))]
    jars_at = (f"{ready[0]}, resolved in {_home(ready[0])}" if ready else
               f"{' or '.join(versions)}, resolved with Maven at the first spark command")
    pauses = "; operator pauses do not hold its partitions" if settings.control.enabled else ""
    return (f'spark.source = "kafka": Spark\'s own Kafka source (spark-sql-kafka-0-10_{SCALA} {jars_at}); '
            "it keeps its offsets in the checkpoint and commits nothing itself: ringmaster commits the "
            "group's offsets after each micro-batch, as with source \"python\"; a micro-batch ends "
            "where ListOffsets says" + pauses)


def short_of_the_end(listed: dict[str, dict[str, int]], checked: dict[str, dict[str, int]]) -> str:
    """The partitions (as text; "" for none) where ListOffsets, which Spark's source trusts,
    answers short of the end that a fetch finds."""
    return ", ".join(f"{t}[{p}] {listed[t][p]} < {end}" for t, ps in sorted(checked.items())
                     for p, end in sorted(ps.items(), key=lambda x: int(x[0])) if listed[t][p] < end)


def options(settings: Settings) -> dict[str, str]:
    """Options of format("kafka") common to streaming and batch reads."""
    opts = {"kafka.bootstrap.servers": settings.kafka.bootstrap_servers,
            "subscribe": ",".join(settings.kafka.topics), "includeHeaders": "true"}
    opts.update({f"kafka.{k}": v for k, v in java_properties(settings.kafka.consumer).items()})
    opts.update({k: str(v).lower() if isinstance(v, bool) else str(v)
                 for k, v in settings.spark.kafka_options.items()})
    return opts


def as_records(df: Any) -> Any:
    """Spark's Kafka rows in the columns of our source (source.INPUT_SCHEMA), which the plugin's
    Records are made from. Spark's timestampType is the Java client's (-1 none, 0 create
    time, 1 log-append time); ours is librdkafka's, one higher."""
    from pyspark.sql import functions as F

    return df.select(F.col("topic"), F.col("partition"), F.col("offset"), F.col("key"), F.col("value"),
                     F.col("headers"), (F.col("timestampType") + 1).alias("timestamp_type"),
                     F.unix_millis(F.col("timestamp")).alias("timestamp"))


def stream(spark: Any, settings: Settings, starting: dict[str, dict[str, int]]) -> Any:
    """A streaming DataFrame; ``starting`` (every partition) is used only without a checkpoint."""
    reader = spark.readStream.format("kafka").options(**options(settings)).option(
        "startingOffsets", json.dumps(starting))
    if settings.spark.max_records_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(settings.spark.max_records_per_trigger))
    return as_records(reader.load())


def batch(spark: Any, settings: Settings, first: dict[str, dict[str, int]],
          last: dict[str, dict[str, int]]) -> Any:
    """Exactly the planned offsets (every partition in both), as the backfill planned them."""
    return as_records(spark.read.format("kafka").options(**options(settings))
                      .option("startingOffsets", json.dumps(first)).option("endingOffsets", json.dumps(last))
                      .load())
