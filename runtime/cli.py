"""The ``ringmaster`` command: run, check, broker.

Errors the user can fix (config, plugin, shared memory) print one line on stderr and exit
non-zero, without a traceback, before anything touches Kafka.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import click

from runtime.config import Settings, load_settings, redacted
from runtime.errors import RingmasterError
from runtime.logs import configure_logging

log = logging.getLogger("ringmaster")


def _fail(exc: RingmasterError) -> None:
    click.echo(f"ringmaster: error: {exc}", err=True)
    sys.exit(exc.exit_code)


def _load(config: str | None) -> Settings:
    # Like gunicorn, the current directory comes first on the import path, so a plugin module
    # next to where `ringmaster` is started is found (a console script's sys.path[0] is the
    # script's own directory instead). Workers inherit the path (spawn and forkserver).
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        settings = load_settings(config)
        from runtime.config import consumer_properties, producer_properties
        from runtime.kafka import check_client_properties

        check_client_properties(consumer_properties(settings), producer_properties(settings))
        return settings
    except RingmasterError as exc:
        _fail(exc)
        raise  # unreachable


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafka-ringmaster")
def main() -> None:
    """Turn a Kafka topic into CPU-bound work on every core, without losing a record."""


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True,
              help="TOML config file (RINGMASTER__SECTION__KEY variables override it).")
@click.option("--progress/--no-progress", default=None,
              help="Live progress display (default: on when stderr is a terminal).")
@click.option("--until-caught-up", is_flag=True,
              help="Stop by itself once every assigned partition is processed and committed.")
@click.option("--summary", "summary", is_flag=True, help="Print a summary table at the end.")
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="Write the final status snapshot as JSON to this file.")
@click.option("--expect-records", type=int, default=None, hidden=True,
              help="Total shown in the progress display.")
def run(config: str, progress: bool | None, until_caught_up: bool, summary: bool,
        summary_json: str | None, expect_records: int | None) -> None:
    """Run the supervisor daemon."""
    settings = _load(config)
    if until_caught_up:
        settings = settings.model_copy(update={"supervisor": settings.supervisor.model_copy(
            update={"stop_when_caught_up": True})})
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    from runtime.progress import ProgressDisplay, summary_table
    from runtime.supervisor import run_daemon

    display = None
    if progress or (progress is None and sys.stderr.isatty()):
        display = ProgressDisplay(expect_records)
    try:
        result = run_daemon(settings, on_status=display.update if display else None)
    except Exception:
        # A bug, not a condition the user caused: the traceback goes to the log, one line here.
        log.critical("internal error", exc_info=True)
        click.echo("ringmaster: internal error (a bug); the log above has the traceback", err=True)
        _exit(1, False)
        return
    finally:
        # a second Ctrl-C during cleanup must not leave segments behind
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if display:
            display.close()
    if result.error is not None:
        log.critical(str(result.error))
        click.echo(f"ringmaster: error: {result.error}", err=True)
    final = result.final_status
    if summary and final is not None:
        from rich.console import Console
        Console().print(summary_table(final))
    if summary_json and final is not None:
        Path(summary_json).write_text(json.dumps(final.to_dict(), indent=2))
    _exit(result.exit_code, result.consumer_abandoned)


def _exit(code: int, consumer_abandoned: bool) -> None:
    """sys.exit, unless leaving the group was abandoned (GroupConsumer.close): then the
    Kafka client is still busy on a helper thread and interpreter teardown could wait on it
    or free it under its feet, so flush what we print and end the process at once."""
    if consumer_abandoned:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
def check(config: str) -> None:
    """Validate a config (and import its plugin); print the effective settings, secrets
    redacted."""
    settings = _load(config)
    from runtime import kafka, speedups, worker

    click.echo(json.dumps(redacted(settings), indent=2))
    click.echo(f"config {config!r} is valid; plugin {settings.workers.plugin!r} imports",
               err=True)
    click.echo(f"hot paths: {speedups.describe([kafka.PACK, worker.BUILD_RECORDS])}", err=True)


def _scope_option(fn: Any) -> Any:
    fn = click.option("--partition", type=int, default=None, help="One partition of --topic.")(fn)
    fn = click.option("--topic", default=None, help="One of the group's topics (default: all of them).")(fn)
    return click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)(fn)


def _check_scope(settings: Settings, topic: str | None, partition: int | None) -> None:
    from runtime.errors import ConfigError

    if topic is not None and topic not in settings.kafka.topics:
        topics = ", ".join(settings.kafka.topics)
        _fail(ConfigError(f"--topic {topic!r} is not one of the group's topics ({topics})"))
    if partition is not None and (topic is None or partition < 0):
        _fail(ConfigError("--partition needs --topic and a partition number >= 0"))


@main.command()
@_scope_option
@click.option("--reason", default="", help="Shown in status and logs of every member.")
@click.option("--for", "duration", default=None,
              help="The pause ends by itself after this: 90s, 10m, 2h, 1d.")
def pause(config: str, topic: str | None, partition: int | None, reason: str, duration: str | None) -> None:
    """Pause processing group-wide and durably: every member on every host stops within about
    2 s (batches in progress finish and commit), across rebalances, restarts and new members,
    until `ringmaster resume` (or --for) ends it. Stored in the group's control topic."""
    import time as _time

    from runtime import control

    settings = _load(config)
    _check_scope(settings, topic, partition)
    try:
        until = None if duration is None else int((_time.time() + control.parse_duration(duration)) * 1000)
        p = control.Pause(control.scope_key(topic, partition), True, reason, control.who(),
                          int(_time.time() * 1000), until)
        control.write(settings, [p])
    except RingmasterError as exc:
        _fail(exc)
    click.echo(f"paused {control.describe_scope(p.scope)} for group {settings.kafka.group_id!r}: "
               f"{p.describe()}; every member stops processing it within about 2 s")


@main.command()
@_scope_option
def resume(config: str, topic: str | None, partition: int | None) -> None:
    """End pauses. Without --topic, every pause of the group; with --topic (and --partition),
    that scope only (a wider pause still in force is reported)."""
    import time as _time

    from runtime import control

    settings = _load(config)
    _check_scope(settings, topic, partition)
    try:
        state = control.OperatorPauses.for_settings(settings)
        state.load()
        state.close()
        now = int(_time.time() * 1000)
        if topic is None:
            keys = sorted({control.ALL, *(p.scope for p in state.active())})
        else:
            keys = [control.scope_key(topic, partition)]
            if partition is None:  # the topic's partition pauses go with it
                keys += [p.scope for p in state.active() if p.scope.startswith(f"partition:{topic}:")]
        control.write(settings, [control.Pause(k, False, "resumed", control.who(), now) for k in keys])
        wider = [] if topic is None else [p for p in state.active() if p.scope in (
            control.ALL, f"topic:{topic}") and p.scope not in keys]
    except RingmasterError as exc:
        _fail(exc)
    click.echo(f"resumed {', '.join(control.describe_scope(k) for k in keys)} for group "
               f"{settings.kafka.group_id!r}")
    for p in wider:
        click.echo(f"note: {control.describe_scope(p.scope)} is still paused ({p.describe()})", err=True)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--json", "as_json", is_flag=True, help="The snapshot as JSON (the same document as /status).")
def status(config: str, as_json: bool) -> None:
    """One snapshot of a running daemon: partitions, lag, pauses with reasons, workers. Reads
    [admin] listen's /status, or the status file."""
    from runtime.views import read_snapshot, render

    settings = _load(config)
    try:
        snap, source = read_snapshot(settings)
    except RingmasterError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(json.dumps(snap, indent=2))
        return
    from rich.console import Console

    Console().print(render(snap, source))


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
def top(config: str, interval: float) -> None:
    """A live view of a running daemon (Ctrl-C to leave): rates, lag, pauses, workers."""
    import time as _time

    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from runtime.views import NoDaemon, rates_between, read_snapshot, render

    settings = _load(config)
    console = Console()
    prev: tuple[float, dict[str, Any]] | None = None
    try:
        with Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                try:
                    snap, source = read_snapshot(settings)
                    now = _time.monotonic()
                    rates = rates_between(prev[1] if prev else None, snap, now - prev[0] if prev else 0.0)
                    prev = (now, snap)
                    live.update(render(snap, source, rates), refresh=True)
                except NoDaemon as exc:
                    live.update(Text(f"waiting for the daemon: {exc}", style="yellow"), refresh=True)
                _time.sleep(interval)
    except KeyboardInterrupt:
        pass


@main.group()
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


def _fail_if_spark_extra_missing(exc: ImportError) -> None:
    """One line and exit 1 when the `spark` extra is not installed; otherwise return (the
    caller re-raises)."""
    missing = _missing_spark_module(exc)
    if missing is not None:
        what = "PySpark" if missing == "pyspark" else missing
        _fail(RingmasterError(f"the Spark backend needs {what}, which is not installed: "
                              "pip install 'kafka-ringmaster[spark]'"))


@spark.command("run")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--until-caught-up", is_flag=True, help='Use trigger "availableNow": stop at the end.')
def spark_run(config: str, until_caught_up: bool) -> None:
    """Structured Streaming over the input topics; commits the group's offsets per batch."""
    settings = _load(config)
    if until_caught_up:
        settings = settings.model_copy(update={"spark": settings.spark.model_copy(
            update={"trigger": "availableNow"})})
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    try:
        from runtime.spark.job import run_stream

        sys.exit(run_stream(settings))
    except RingmasterError as exc:
        _fail(exc)
    except ImportError as exc:
        _fail_if_spark_extra_missing(exc)
        raise


@spark.command("backfill")
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--from", "start", default="earliest", show_default=True,
              help='earliest, committed, or JSON offsets like \'{"in": {"0": 100}}\'.')
@click.option("--to", "end", default="latest", show_default=True,
              help="latest, or JSON offsets (exclusive).")
@click.option("--parquet", type=click.Path(file_okay=False), default=None,
              help="Write outputs as Parquet here instead of to [output] topic.")
def spark_backfill(config: str, start: str, end: str, parquet: str | None) -> None:
    """Reprocess an offset range of the input topics in one batch job."""
    settings = _load(config)
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    if parquet is None and settings.output.topic is None:
        _fail(RingmasterError("backfill needs [output] topic or --parquet PATH"))
    try:
        from runtime.spark.job import backfill

        summary = backfill(settings, start, end, parquet)
    except RingmasterError as exc:
        _fail(exc)
        return
    except ImportError as exc:
        _fail_if_spark_extra_missing(exc)
        raise
    click.echo(json.dumps(summary))


@main.command()
@click.option("--port", type=int, default=9092, show_default=True)
def broker(port: int) -> None:
    """Run the embedded development broker (Tansu, memory-only) in the foreground."""
    import time

    from runtime.devbroker import DevBroker

    try:
        b = DevBroker(port).start()
    except RingmasterError as exc:
        _fail(exc)
        return
    click.echo(f"embedded broker listening on {b.bootstrap} (memory-only; Ctrl-C stops it)",
               err=True)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    try:
        while not stop and b.proc is not None and b.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


if __name__ == "__main__":
    main()
