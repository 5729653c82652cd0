"""``ringmaster run``: the supervisor daemon in the foreground, or with ``--members N`` the
parent of N of them (runtime/supervisor/daemon/members.py)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runtime.cli.loading import load
from runtime.cli.outcome import exit_process, fail, internal_error
from runtime.config import Settings, load_settings
from runtime.errors import (
    AdminListenFailed,
    ConfigError,
    KafkaAccessRefused,
    KafkaError,
    KafkaUnreachable,
    NotCaughtUp,
    PartitionsBlocked,
    PluginError,
    RingmasterError,
    SharedMemoryError,
    WorkerCrashLoop,
)
from runtime.ops.logs import configure_logging

if TYPE_CHECKING:
    from runtime.supervisor.control.signals import SignalQueue

_RUN_EXIT_CODES = "\b\nExit status:\n" + "\n".join(f"  {code!s:<5} {meaning}" for code, meaning in (
    (0, "stopped cleanly (TERM, INT, QUIT; with --until-caught-up: caught up and committed)"),
    (1, "an internal error (a bug: the log has the traceback)"),
    (ConfigError.exit_code, "the configuration is invalid (not restarted by the systemd unit)"),
    (PluginError.exit_code, "the plugin cannot start: import or setup() failed (not restarted)"),
    (SharedMemoryError.exit_code, "a resource of the host cannot be used: too little shared memory "
                                  "(supervisor.shm_dir), a CPU other than x86-64 without the C speedups, "
                                  "or the control socket's directory is another user's or not private"),
    (KafkaError.exit_code, "the Kafka client reported a fatal error"),
    (WorkerCrashLoop.exit_code, "workers die during start-up without saying why"),
    (PartitionsBlocked.exit_code, "--until-caught-up: partitions blocked at a failing record"),
    (KafkaUnreachable.exit_code, "--until-caught-up: the cluster did not answer within "
                                 "kafka.connect_timeout_s; a daemon waits for it as long as it takes (exit 8 "
                                 "only if it goes away between answering and the control topic being read)"),
    (NotCaughtUp.exit_code, "--until-caught-up ended before it caught up (one line says what is left)"),
    (AdminListenFailed.exit_code, "admin.listen cannot be bound (the port is in use): restarted"),
    (KafkaAccessRefused.exit_code, "the cluster refused the credentials or its certificate is not "
                                   "trusted (kafka.security; not restarted)"),
    ("128+N", "--members: a member was killed by signal N (else a member's first non-zero status)"),
))


@click.command(epilog=_RUN_EXIT_CODES)
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True,
              help="TOML config file (RINGMASTER__SECTION__KEY variables override it).")
@click.option("--progress/--no-progress", default=None,
              help="Live progress display (default: on when stderr is a terminal), drawn only while "
                   "the daemon is the terminal's foreground job (not after & or Ctrl-Z, bg).")
@click.option("--until-caught-up", is_flag=True,
              help="Stop by itself once every partition it holds is processed to the end its first "
                   "fetch saw and committed (the broker acknowledged it): exit 0. Exit "
                   f"{NotCaughtUp.exit_code} (one line says what is left) if a partition is lost and "
                   "not back, a commit is refused, nothing moves for supervisor.caught_up_timeout_s, "
                   f"or a signal comes first; exit {PartitionsBlocked.exit_code} if partitions are "
                   "blocked at a failing record.")
@click.option("--summary", "summary", is_flag=True, help="Print a summary table at the end.")
@click.option("--summary-json", type=click.Path(dir_okay=False), default=None,
              help="Write the final status snapshot as JSON to this file.")
@click.option("--expect-records", type=int, default=None, hidden=True,
              help="Total shown in the progress display.")
@click.option("--members", type=click.IntRange(1, 64), default=None,
              help="Supervisors of the group to run on this host (default supervisor.members, 1): "
                   "each a daemon with its own consumer, rings, control socket and workers, sharing "
                   "workers.processes and workers.max_processes (split evenly, at least 1 each). "
                   "Member 0 serves admin.listen and the status file. TERM/INT/QUIT stop all, HUP and "
                   "USR1 go to all, TTIN/TTOU move one worker on one member, round-robin. None is "
                   "restarted: a member that exits stops the others, and the exit status is the "
                   "first non-zero one a member had (128+N: killed by signal N); with "
                   "--until-caught-up, 0 only when every member caught up.")
def run(config: str, progress: bool | None, until_caught_up: bool, summary: bool,
        summary_json: str | None, expect_records: int | None, members: int | None) -> None:
    """Run the supervisor daemon.

    Signals: TERM, INT and QUIT stop it gracefully (the batches in progress finish, what is
    done is committed, exit 0; with --until-caught-up before the end, the exit status for
    not caught up); HUP reloads the plugin (as `ringmaster reload`); TTIN and TTOU add and
    remove one worker (as `ringmaster scale -n +1`/`-n -1`, up to workers.max_processes);
    USR1 logs a one-line status; USR2, WINCH and PIPE are ignored. Workers ignore all but
    TERM."""
    from runtime.supervisor.control.signals import SignalQueue

    signals = SignalQueue().install()  # before anything else: no signal finds its default action
    from runtime.supervisor.daemon.members import MEMBER_ENV, die_with_parent

    member_of = os.environ.get(MEMBER_ENV)
    if member_of is not None and not die_with_parent():
        sys.exit(0)  # the parent of `run --members` is gone already: nothing to start for
    settings = load(config)
    if until_caught_up:  # the flag is not in the file that load_settings checked
        from runtime.config import guarantee_problem
        from runtime.errors import ConfigError

        problem = guarantee_problem(settings.model_copy(update={
            "supervisor": settings.supervisor.model_copy(update={"stop_when_caught_up": True})}))
        if problem is not None:
            fail(ConfigError(problem))
    count = members if members is not None else settings.supervisor.members
    if member_of is None and count > 1:
        _run_members(settings, config, count, progress, until_caught_up, summary, summary_json, signals)
        return
    if until_caught_up:
        settings = settings.model_copy(update={"supervisor": settings.supervisor.model_copy(
            update={"stop_when_caught_up": True})})
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format,
                      role="supervisor" if member_of is None else f"supervisor.{member_of}")
    from runtime.ops.progress import ProgressDisplay, summary_table
    from runtime.supervisor.daemon.run import run_daemon

    display = None
    if progress or (progress is None and sys.stderr.isatty()):
        display = ProgressDisplay(expect_records)

    def reread() -> Settings:
        """The config file again, for a reload (the plugin is not imported here: new workers do)."""
        again = load_settings(config, check_plugin=False)
        return again.model_copy(update={"supervisor": again.supervisor.model_copy(
            update={"stop_when_caught_up": settings.supervisor.stop_when_caught_up})})

    try:
        result = run_daemon(settings, on_status=display.update if display else None, reread=reread,
                            signals=signals, member=None if member_of is None else int(member_of))
    except Exception:
        internal_error()
    finally:
        # a second Ctrl-C during cleanup must not leave segments behind
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if display:
            display.close()
    if result.error is not None:
        # Once, here, and nowhere before: the rooms return the error rather than log it.
        click.echo(f"ringmaster: error: {result.error}", err=True)
    final = result.final_status
    if summary and final is not None:
        from rich.console import Console
        Console().print(summary_table(final))
    if summary_json and final is not None:
        Path(summary_json).write_text(json.dumps(final.to_dict(), indent=2))
    exit_process(result.exit_code, result.consumer_abandoned)


def _run_members(settings: Settings, config: str, count: int, progress: bool | None,
                 until_caught_up: bool, summary: bool, summary_json: str | None,
                 signals: SignalQueue) -> None:
    """``run --members N``: the parent of N daemons (runtime/supervisor/daemon/members.py)."""
    from runtime.supervisor.daemon.members import run_members

    if progress:
        fail(ConfigError("--progress draws one daemon: with --members, watch the group with "
                         "`ringmaster top` or `ringmaster status`"))
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format, role="members")
    try:
        code = run_members(settings, config, count, until_caught_up, summary, summary_json, signals)
    except RingmasterError as exc:
        fail(exc)
        return
    sys.exit(code)

