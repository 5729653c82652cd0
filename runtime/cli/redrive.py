"""``ringmaster redrive``: send dead letters back to their source topic or through the plugin
(runtime/redrive/)."""

from __future__ import annotations

import json
import sys

import click

from runtime.cli.loading import load
from runtime.cli.outcome import exit_process, fail, internal_error
from runtime.errors import RingmasterError
from runtime.ops.logs import configure_logging

_REDRIVE_EPILOG = """\b
Exit codes:
  0  done: the end of the dead-letter topic as seen at the start (or --to) was reached, or the
     group's cursor was there already
  1  an internal error (a bug: the log has the traceback)
  2  invalid config or option (no [dead_letter] topic, a bad --from)
  3  --through-plugin: the plugin cannot be imported or its setup() failed
  5  Kafka: a fatal client error, a delivery that failed (an outage), a source record that
     could not be read, or a refused final commit; progress is committed: run it again
  8  the cluster did not answer within kafka.connect_timeout_s
  9  stopped before the end (SIGTERM, Ctrl-C), or another redrive of the group holds the
     partitions; progress is committed: run it again to go on
  14 the cluster refused the credentials or its certificate is not trusted (kafka.security)

\b
Examples:
  ringmaster redrive -c my.toml --dry-run                  # what would go, by error type
  ringmaster redrive -c my.toml --error-type ValueError --rate 200
  ringmaster redrive -c my.toml --from 2h --through-plugin
  ringmaster redrive -c my.toml --from 2026-11-21T14:00:00Z --to 2026-11-21T15:00:00Z
"""


@click.command(epilog=_REDRIVE_EPILOG)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True,
              help="TOML config file: [dead_letter] topic is read, kafka.topics say which letters "
                   "are this config's.")
@click.option("--from", "start", default=None, metavar="WHEN",
              help="Pass over letters before this: an offset of the dead-letter topic (1200), offsets "
                   "per partition (0:1200,3:80), a time ago (90s, 15m, 1h30m, 2d, 1w) or an ISO-8601 time. "
                   "Times are when the record failed (its ringmaster.failed_at_ms header).")
@click.option("--to", "end", default=None, metavar="WHEN",
              help="End the run at this letter (exclusive), same forms as --from; later letters "
                   "stay for a later run. Default: the end of the topic as seen at the start.")
@click.option("--error-type", "error_types", multiple=True, metavar="TYPE",
              help="Only letters of this ringmaster.error.type (ValueError, Rejected, WorkerCrashed, "
                   "...); repeat for several. Others are passed over.")
@click.option("--rate", type=float, default=None, metavar="R",
              help="At most R records per second (a token bucket). Default: as fast as the broker "
                   "acknowledges.")
@click.option("--max-redrives", type=int, default=3, show_default=True, metavar="N",
              help="A letter whose record was redriven N times already (ringmaster.redrive.count) "
                   "is passed over.")
@click.option("--to-source/--through-plugin", "to_source", default=True,
              help="--to-source (default): produce each record back to its source topic and "
                   "partition, for the daemon to process. --through-plugin: run the configured "
                   "plugin in this process on it (retries, bisection and Backoff as in a worker), "
                   "outputs to [output] topic, records that fail again back to the dead-letter "
                   "topic; letters of records that crashed a worker (WorkerCrashed) are passed over.")
@click.option("--dry-run", is_flag=True,
              help="Read and count what would be redriven (by error type and source topic) and "
                   "passed over (by reason); send and commit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--group", default=None, metavar="NAME",
              help="The redrive's own consumer group, its cursor through the dead-letter topic "
                   "(default: <kafka.group_id>.redrive).")
def redrive(config: str, start: str | None, end: str | None, error_types: tuple[str, ...],
            rate: float | None, max_redrives: int, to_source: bool, dry_run: bool, as_json: bool,
            group: str | None) -> None:
    """Send dead letters back: read [dead_letter] topic and produce each record (original key,
    value and headers, plus a raised ringmaster.redrive.count header) to the topic and
    partition it came from, or run it through the plugin.

    The redrive commits its progress in a consumer group of its own: a letter is committed
    once its copy (or its new dead letter) is acknowledged by the broker, so Ctrl-C or
    SIGTERM stops it cleanly and the next run goes on from there, and no letter is redriven
    twice by runs of one group. A letter the selection does not take (--from, --error-type,
    --max-redrives, ...) is passed over: it stays in the topic, the group moves past it, and
    the summary counts it by reason (use another --group to go over the topic again). The run
    ends by itself at the end of the topic as seen at its start. A truncated or reference
    dead letter is redriven from its source record if the source topic still holds it.
    Only letters of the config's kafka.topics are taken.
    """
    from runtime.errors import RedriveIncomplete
    from runtime.redrive.command import Options, run_redrive
    from runtime.redrive.report import Ending

    settings = load(config, check_plugin=not to_source and not dry_run)
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    options = Options(start, end, error_types, rate, max_redrives, not to_source, dry_run, group)
    try:
        result = run_redrive(settings, options)
    except RingmasterError as exc:
        fail(exc)
        return
    except KeyboardInterrupt:  # before the loop took over the signals: nothing was sent yet
        click.echo("ringmaster: redrive interrupted before it started; nothing was sent", err=True)
        sys.exit(RedriveIncomplete.exit_code)
    except Exception:
        internal_error()
    summary = result.summary
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        if dry_run:
            from rich.console import Console

            console = Console()
            for table in summary.tables():
                console.print(table)
        click.echo(summary.line())
    code = {Ending.END: 0, Ending.NOTHING: 0, Ending.FAILED: 5, Ending.STOPPED: RedriveIncomplete.exit_code,
            Ending.NO_PARTITIONS: RedriveIncomplete.exit_code}[summary.ending]
    if code == 0 and not summary.committed:
        code = 5
    exit_process(code, result.consumer_abandoned)
