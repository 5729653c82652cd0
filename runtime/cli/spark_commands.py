"""``ringmaster spark run`` and ``spark backfill``: the same plugin on Apache Spark
(runtime/spark/). The group is also what ``spark-submit`` runs (runtime/spark/submit.py)."""

from __future__ import annotations

import json

import click

from runtime.cli.loading import load
from runtime.cli.outcome import fail
from runtime.config import Settings
from runtime.errors import ConfigError, NotCaughtUp, RingmasterError
from runtime.ops.logs import configure_logging


@click.group()
def spark() -> None:
    """Run the same plugin on Apache Spark (PySpark; needs Java 17+)."""


# The modules of the `spark` extra; an ImportError of anything else is a bug and keeps its traceback.
_SPARK_EXTRA = ("pyspark", "pyarrow", "pandas")


def _missing_spark_module(exc: BaseException) -> str | None:
    """The module of the `spark` extra whose import failed, if that is what `exc` says. PySpark
    reports a missing pandas or pyarrow as its own ImportError raised from the original one."""
    seen: BaseException | None = exc
    while seen is not None:
        top = (getattr(seen, "name", None) or "").split(".")[0]
        if isinstance(seen, ImportError) and top in _SPARK_EXTRA:
            return top
        seen = seen.__cause__
    return None


def _refuse_exactly_once_on_spark(settings: Settings) -> None:
    """Spark runs are at-least-once (docs/spark.md): a config that asks for more is refused
    rather than run with less."""
    if settings.output.guarantee == "exactly-once":
        from runtime.errors import ConfigError

        fail(ConfigError('output.guarantee = "exactly-once" is not supported by the Spark backend: '
                         "its runs are at-least-once (docs/spark.md); run it with ringmaster run, or "
                         'set guarantee = "at-least-once" for Spark'))


def _fail_if_spark_extra_missing(exc: ImportError) -> None:
    """One line and exit 1 when the `spark` extra is not installed; otherwise return (the
    caller re-raises)."""
    missing = _missing_spark_module(exc)
    if missing is not None:
        what = "PySpark" if missing == "pyspark" else missing
        fail(RingmasterError(f"the Spark backend needs {what}, which is not installed: "
                             "pip install 'kafka-ringmaster[spark]'"))


_SOURCE = click.option("--source", type=click.Choice(["python", "kafka"]), default=None,
                       help="What reads the input topics (overrides spark.source): ringmaster's own "
                            "Python source, or Spark's own Kafka source (docs/spark.md).")


def _with_source(settings: Settings, source: str | None) -> Settings:
    """``--source`` over ``spark.source``, validated as the config file would be."""
    if source is None or source == settings.spark.source:
        return settings
    from pydantic import ValidationError

    from runtime.config import ConfigError, check_kafka_source

    raw = settings.spark.model_dump()
    raw["source"] = source
    try:
        spark_settings = type(settings.spark).model_validate(raw)
    except ValidationError as exc:
        why = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        fail(ConfigError(f"--source {source}: spark.{why}"))
        raise
    settings = settings.model_copy(update={"spark": spark_settings})
    if source == "kafka":
        try:
            check_kafka_source(settings)
        except RingmasterError as exc:
            fail(exc)
    return settings


def _spark_settings(config: str, source: str | None) -> Settings:
    settings = _with_source(load(config), source)
    _refuse_exactly_once_on_spark(settings)
    if settings.kafka.group_type == "share":  # docs/spark.md: Spark reads by offsets, per partition
        fail(ConfigError('kafka.group_type = "share" is for `ringmaster run`; Spark reads offset ranges of '
                         'each partition: set kafka.group_type = "consumer" for ringmaster spark'))
    return settings


@spark.command("run")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@_SOURCE
@click.option("--until-caught-up", is_flag=True,
              help='Use trigger "availableNow" and stop at the end of every partition as it was at the '
                   "start: exit 0 once the group has committed it, exit "
                   f"{NotCaughtUp.exit_code} (one line says what is left) otherwise.")
def spark_run(config: str, source: str | None, until_caught_up: bool) -> None:
    """Structured Streaming over the input topics; commits the group's offsets per batch.
    Prints a summary at the end (records read, micro-batches)."""
    settings = _spark_settings(config, source)
    if until_caught_up:
        settings = settings.model_copy(update={"spark": settings.spark.model_copy(
            update={"trigger": "availableNow"})})
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    try:
        from runtime.spark.job import run_stream

        result = run_stream(settings)
    except RingmasterError as exc:
        fail(exc)
        return
    except ImportError as exc:
        _fail_if_spark_extra_missing(exc)
        raise
    done = "; caught up: the group committed the end of every partition" \
        if settings.spark.trigger == "availableNow" and result.error is None else ""
    click.echo(result.line() + done, err=True)
    if result.error is not None:
        fail(result.error)


@spark.command("backfill")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--from", "start", default="earliest", show_default=True,
              help='earliest, committed, or JSON offsets like \'{"in": {"0": 100}}\'.')
@click.option("--to", "end", default="latest", show_default=True,
              help="latest, or JSON offsets (exclusive).")
@click.option("--parquet", type=click.Path(file_okay=False), default=None,
              help="Write outputs as Parquet here instead of to [output] topic.")
@_SOURCE
def spark_backfill(config: str, start: str, end: str, parquet: str | None, source: str | None) -> None:
    """Reprocess an offset range of the input topics in one batch job."""
    settings = _spark_settings(config, source)
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    if parquet is None and settings.output.topic is None:
        fail(RingmasterError("backfill needs [output] topic or --parquet PATH"))
    try:
        from runtime.spark.job import backfill

        summary = backfill(settings, start, end, parquet)
    except RingmasterError as exc:
        fail(exc)
        return
    except ImportError as exc:
        _fail_if_spark_extra_missing(exc)
        raise
    click.echo(json.dumps(summary))
