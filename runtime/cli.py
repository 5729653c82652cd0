"""The ``ringmaster`` command: run, check, broker, produce, tail; the operator commands pause,
resume, status and top; redrive; spark.

Errors the user can fix (config, plugin, shared memory) print one line on stderr and exit
non-zero, without a traceback, before anything touches Kafka. The operator commands never
import the plugin (a broken deploy must not keep an operator from pausing the group) and
log only warnings, on stderr, so their own output comes first and alone.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from runtime.config import Settings, load_settings, redacted
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
from runtime.ops.logs import configure_command_logging, configure_logging

if TYPE_CHECKING:
    from runtime.supervisor.control.signals import SignalQueue

log = logging.getLogger("ringmaster")


def _fail(exc: RingmasterError) -> None:
    click.echo(f"ringmaster: error: {exc}", err=True)
    sys.exit(exc.exit_code)


def _load(config: str | None, check_plugin: bool = True) -> Settings:
    """The settings, or one line and the error's exit status. ``check_plugin``: import the
    plugin too (commands that run it); the operator commands never do."""
    # Like gunicorn, the current directory comes first on the import path, so a plugin module
    # next to where `ringmaster` is started is found (a console script's sys.path[0] is the
    # script's own directory instead). Workers inherit the path (spawn and forkserver).
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        settings = load_settings(config, check_plugin=check_plugin)
        from runtime.config import consumer_properties, producer_properties
        from runtime.kafka.admin import check_client_properties

        check_client_properties(consumer_properties(settings), producer_properties(settings))
        return settings
    except RingmasterError as exc:
        _fail(exc)
        raise  # unreachable


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafka-ringmaster")
def main() -> None:
    """Turn a Kafka topic into CPU-bound work on every core, without losing a record."""


_RUN_EXIT_CODES = "\b\nExit status:\n" + "\n".join(f"  {code!s:<5} {meaning}" for code, meaning in (
    (0, "stopped cleanly (TERM, INT, QUIT; with --until-caught-up: caught up and committed)"),
    (1, "an internal error (a bug: the log has the traceback)"),
    (ConfigError.exit_code, "the configuration is invalid (not restarted by the systemd unit)"),
    (PluginError.exit_code, "the plugin cannot start: import or setup() failed (not restarted)"),
    (SharedMemoryError.exit_code, "shared memory cannot be created"),
    (KafkaError.exit_code, "the Kafka client reported a fatal error"),
    (WorkerCrashLoop.exit_code, "workers die during start-up without saying why"),
    (PartitionsBlocked.exit_code, "--until-caught-up: partitions blocked at a failing record"),
    (KafkaUnreachable.exit_code, "the cluster did not answer within kafka.connect_timeout_s"),
    (NotCaughtUp.exit_code, "--until-caught-up ended before it caught up (one line says what is left)"),
    (AdminListenFailed.exit_code, "admin.listen cannot be bound (the port is in use): restarted"),
    (KafkaAccessRefused.exit_code, "the cluster refused the credentials or its certificate is not "
                                   "trusted (kafka.security; not restarted)"),
    ("128+N", "--members: a member was killed by signal N (else a member's first non-zero status)"),
))


@main.command(epilog=_RUN_EXIT_CODES)
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
    from runtime.supervisor.members import MEMBER_ENV, die_with_parent

    member_of = os.environ.get(MEMBER_ENV)
    if member_of is not None and not die_with_parent():
        sys.exit(0)  # the parent of `run --members` is gone already: nothing to start for
    settings = _load(config)
    if until_caught_up:  # the flag is not in the file that load_settings checked
        from runtime.config import guarantee_problem
        from runtime.errors import ConfigError

        problem = guarantee_problem(settings.model_copy(update={
            "supervisor": settings.supervisor.model_copy(update={"stop_when_caught_up": True})}))
        if problem is not None:
            _fail(ConfigError(problem))
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
    from runtime.supervisor.daemon import run_daemon

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
        # Once, here, and nowhere before: the rooms return the error rather than log it.
        click.echo(f"ringmaster: error: {result.error}", err=True)
    final = result.final_status
    if summary and final is not None:
        from rich.console import Console
        Console().print(summary_table(final))
    if summary_json and final is not None:
        Path(summary_json).write_text(json.dumps(final.to_dict(), indent=2))
    _exit(result.exit_code, result.consumer_abandoned)


def _run_members(settings: Settings, config: str, count: int, progress: bool | None,
                 until_caught_up: bool, summary: bool, summary_json: str | None,
                 signals: SignalQueue) -> None:
    """``run --members N``: the parent of N daemons (runtime/supervisor/members.py)."""
    from runtime.supervisor.members import run_members

    if progress:
        _fail(ConfigError("--progress draws one daemon: with --members, watch the group with "
                          "`ringmaster top` or `ringmaster status`"))
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format, role="members")
    try:
        code = run_members(settings, config, count, until_caught_up, summary, summary_json, signals)
    except RingmasterError as exc:
        _fail(exc)
        return
    sys.exit(code)


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
@click.option("--shallow", is_flag=True,
              help="Only import the plugin; do not start it in a worker (no setup()/teardown()).")
def check(config: str, shallow: bool) -> None:
    """Validate a config, print the effective settings (librdkafka properties included,
    secrets redacted), then start the plugin in a throw-away worker: import, setup(),
    teardown(), as the daemon's workers do (bounded by workers.setup_timeout_s). Also says
    whether the C speedups are on, how many workers and why, and the shared memory the rings
    need against what is free. Exit 2: the config is invalid; exit 3: the plugin cannot start
    (one line says why); exit 4: this host cannot run it (too little shared memory, or a CPU
    other than x86-64 without the C speedups)."""
    settings = _load(config)
    import runtime.kafka.consumer  # noqa: F401  binds the message type: the packer's C path is known
    from runtime.transport import packing, speedups
    from runtime.worker import main as worker

    click.echo(json.dumps(redacted(settings), indent=2))
    click.echo(f"config {config!r} is valid; plugin {settings.workers.plugin!r} imports",
               err=True)
    paths: list[speedups.HotPath[Any]] = [packing.PACK, worker.BUILD_RECORDS]
    click.echo(f"hot paths: {speedups.describe(paths)}", err=True)
    slow = speedups.python_warning(paths)
    if slow is not None:
        click.echo(f"warning: {slow}", err=True)
    from runtime.errors import PluginError, SharedMemoryError
    from runtime.supervisor.daemon import check_plugin_starts, host_problem, shm_report

    click.echo(f"workers: {settings.workers.processes} ({settings.workers.processes_from})", err=True)
    problem = host_problem(settings)
    if problem is not None:  # the daemon would refuse to start here (exit 4), with this line
        _fail(SharedMemoryError(problem))
    click.echo(shm_report(settings)[0], err=True)
    if settings.spark.source == "kafka":
        from runtime.spark.builtin_source import describe

        click.echo(describe(settings), err=True)
    if shallow:
        return

    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format, role="check")
    outcome = check_plugin_starts(settings)
    if outcome.problem is not None:
        _fail(PluginError(f"workers.plugin: the plugin cannot start: {outcome.problem}"))
    click.echo(f"plugin {settings.workers.plugin!r} starts in a worker: import and setup() "
               f"took {outcome.seconds:.1f} s; teardown() ran", err=True)
    if outcome.teardown_problem is not None:
        click.echo(f"warning: {outcome.teardown_problem} (the daemon logs this and goes on)", err=True)


_COMMAND_EXIT_CODES = """\b
Sent to every daemon of the config's group on this host, one after the other (one line each).
Exit status:
  0   done
  2   the config given here is invalid
  10  a daemon refused, or the change failed and was rolled back
  11  no daemon answers at the control socket
  12  no answer within --timeout (it may still finish: ringmaster status)"""


def _command_options(fn: Any) -> Any:
    fn = click.option("--json", "as_json", is_flag=True, help="Print the daemon's whole reply as JSON.")(fn)
    fn = click.option("--timeout", type=click.FloatRange(min=0.1), default=300.0, show_default=True,
                      help="Seconds to wait for the outcome.")(fn)
    return click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True,
                        help="The config the daemon runs with: it says where the control socket is "
                             "(supervisor.control_socket).")(fn)


def _request(config: str, request: dict[str, Any], timeout: float) -> list[tuple[str, dict[str, Any]]]:
    """One request to every daemon of the config's group on this host (each has its control
    socket: runtime/ops/control_socket.py), one after the other, and their replies, each with
    the socket it came from. Never imports the plugin (the config is read without it)."""
    from runtime.errors import ConfigError, DaemonUnreachable
    from runtime.ops.control_socket import find_daemons, send_command

    try:
        settings = load_settings(config, check_plugin=False)
        paths, base = find_daemons(settings)
        if base is None:
            raise ConfigError("supervisor.control_socket is \"\" (off): send the daemon SIGHUP, SIGTTIN or "
                              "SIGTTOU instead")
        if not paths:
            return [(str(base), send_command(base, request, timeout))]  # raises: says why
        replies, unreachable = [], []
        for path in paths:
            try:
                replies.append((str(path), send_command(path, request, timeout)))
            except DaemonUnreachable as exc:  # left by a daemon that was killed, ...
                unreachable.append(exc)
        if not replies:
            raise unreachable[0]
        return replies
    except RingmasterError as exc:
        _fail(exc)
        raise  # unreachable


def _send(config: str, request: dict[str, Any], timeout: float, as_json: bool) -> None:
    """A command: one line out per daemon (or the replies as JSON: one object, a list when
    several daemons answered); the exit status says how it went (10 if any refused)."""
    from runtime.errors import CommandFailed

    replies = _request(config, request, timeout)
    several = len(replies) > 1
    if as_json:
        docs = [{**reply, "socket": path} if several else reply for path, reply in replies]
        click.echo(json.dumps(docs if several else docs[0], indent=2))
    failed = [f"{path}: {reply.get('message')}" if several else str(reply.get("message"))
              for path, reply in replies if not reply.get("ok")]
    if not as_json:
        for path, reply in replies:
            if reply.get("ok"):
                click.echo(f"{path}: {reply.get('message')}" if several else str(reply.get("message")))
    if failed:
        _fail(CommandFailed("; ".join(failed)))


@main.command(epilog=_COMMAND_EXIT_CODES)
@_command_options
@click.option("--status", "show_status", is_flag=True,
              help="Only say which version runs and how the last reload went (exit 10 if it failed).")
def reload(config: str, timeout: float, as_json: bool, show_status: bool) -> None:
    """Reload the plugin of a running daemon, without a rebalance (as SIGHUP does, but this
    waits for the outcome and says it).

    The daemon reads its config file again and starts one worker with the new plugin code
    (workers.plugin and [workers.settings]). If that worker cannot start – the import or
    setup() fails, it takes longer than workers.setup_timeout_s, or it dies before it has
    finished its first batch – the reload is rolled back: no old worker was touched and the
    daemon keeps its old code. With no traffic the new worker waits for its first batch (the
    old workers keep running; this command may then end at --timeout, exit 12, while the
    reload goes on). Once it has finished one, the old workers are replaced one at a time: each
    takes no more batches, finishes those in its ring and stops while its partitions move to
    the new workers. Nothing is lost or reordered within a partition or key, and the consumer
    group does not rebalance. Other settings changed in the file need a restart: the answer
    names them.

    Prints one line when every worker runs the new version (or why not). The plugin's
    version (its __version__, or a hash of its source) is in `ringmaster status`, /metrics,
    and the ringmaster.plugin.version header of every output and dead letter. This command
    never imports the plugin.
    """
    if show_status:
        from runtime.errors import CommandFailed

        replies = _request(config, {"command": "status"}, timeout)
        failed = False
        for path, reply in replies:
            line = json.dumps(reply, indent=2) if as_json else str(reply.get("message"))
            click.echo(f"{path}: {line}" if len(replies) > 1 else line)
            last = (reply.get("status") or {}).get("last_reload") or {}
            failed = failed or last.get("state") == "failed"
        sys.exit(CommandFailed.exit_code if failed else 0)
    _send(config, {"command": "reload"}, timeout, as_json)


@main.command(epilog=_COMMAND_EXIT_CODES)
@_command_options
@click.option("-n", "--processes", "processes", required=True, metavar="N|+N|-N",
              help="How many workers: N, or N more (+N) or fewer (-N) than the daemon aims at now.")
def scale(config: str, timeout: float, as_json: bool, processes: str) -> None:
    """Resize the worker pool of a running daemon, without a rebalance (as SIGTTIN and SIGTTOU
    do one worker at a time, but this waits for the outcome and says it).

    New workers start with the daemon's plugin code; one that cannot start is not retried and
    the answer says why. Workers removed take no more batches and finish those in their ring
    first; their partitions move to the others. At most workers.max_processes: each worker
    slot used once holds a ring of workers.ring_bytes in supervisor.shm_dir (memory) until the
    daemon stops, so raising that limit needs a restart. The size lasts until the daemon
    stops; `ringmaster reload` keeps it.
    """
    text = processes.strip()
    if not re.fullmatch(r"[+-]?\d+", text) or (text[0] in "+-" and int(text) == 0):
        raise click.BadParameter(f"{processes!r}: expected a number N, +N or -N (not 0)",
                                 param_hint="--processes")
    request: dict[str, Any] = ({"command": "scale", "change": int(text)} if text[0] in "+-"
                               else {"command": "scale", "processes": int(text)})
    _send(config, request, timeout, as_json)


def _scope_option(fn: Any) -> Any:
    fn = click.option("--partition", type=int, default=None, help="One partition of --topic.")(fn)
    fn = click.option("--topic", default=None, help="One of the group's topics (default: all of them).")(fn)
    return click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)(fn)


def _operator_settings(config: str) -> Settings:
    """An operator command's settings: the plugin is not imported, and only warnings are
    logged (on stderr)."""
    settings = _load(config, check_plugin=False)
    configure_command_logging()
    return settings


def _group_reads(settings: Settings, topic: str) -> bool:
    """Whether the group reads ``topic``: one of kafka.topics, or matched by one of its
    regular expressions (a name starting with ^, as librdkafka reads them)."""
    import re

    for t in settings.kafka.topics:
        if t == topic:
            return True
        if t.startswith("^"):
            try:
                if re.search(t, topic):
                    return True
            except re.error:
                continue
    return False


def _scope(topic: str | None, partition: int | None) -> str:
    """The control record key for the options, checked as the readers will check it."""
    from runtime.errors import InvalidControlRecord
    from runtime.ops.control_records import parse_scope, scope_key

    if partition is not None and (topic is None or partition < 0):
        raise ConfigError("--partition needs --topic and a partition number >= 0")
    key = scope_key(topic, partition)
    try:
        return parse_scope(key.encode())
    except InvalidControlRecord:
        if partition is not None and partition > 2**31 - 1:
            raise ConfigError(f"--partition {partition}: Kafka numbers partitions below 2**31") from None
        raise ConfigError(f"--topic {topic!r} is not a valid Kafka topic name") from None


def _reach_cluster(settings: Settings) -> dict[str, int]:
    """The cluster's topics and partition counts, or KafkaUnreachable after
    kafka.connect_timeout_s (exit 8), or KafkaAccessRefused at once (exit 14)."""
    from runtime.ops.cluster import wait_for_cluster

    topics = wait_for_cluster(settings, give_up_after_s=settings.kafka.connect_timeout_s)
    assert topics is not None  # no stop condition: it answers or raises
    return topics


@main.command()
@_scope_option
@click.option("--reason", default="",
              help="Shown in status and logs of every member (at most 1 KiB, one line).")
@click.option("--for", "duration", default=None,
              help="The pause ends by itself after this duration: 90s, 10m, 1h30m, 2d, 1w (1 s to 366 "
                   "days).")
def pause(config: str, topic: str | None, partition: int | None, reason: str, duration: str | None) -> None:
    """Pause processing group-wide and durably: every member on every host stops within about
    2 s (batches in progress finish and commit), across rebalances, restarts and new members,
    until `ringmaster resume` (or --for) ends it. Stored in the group's control topic.

    Never imports the plugin. Exit status: 0 paused; 2 a wrong option (a topic the group does
    not read, a partition the topic does not have, --for or --reason out of bounds), nothing
    stored; 8 the cluster did not answer within kafka.connect_timeout_s; 5 it refused."""
    import time as _time

    from runtime.ops import control
    from runtime.ops.control_records import check_reason, describe_scope, parse_duration, pause_record

    settings = _operator_settings(config)
    try:
        scope = _scope(topic, partition)
        if topic is not None and not _group_reads(settings, topic):
            raise ConfigError(f"--topic {topic!r} is not one of the group's topics "
                              f"({', '.join(settings.kafka.topics)})")
        for_s = None if duration is None else parse_duration(duration)
        check_reason(reason)
        topics = _reach_cluster(settings)
        if topic is not None and partition is not None:
            if topic not in topics:
                raise ConfigError(f"--topic {topic!r} does not exist on the cluster, so it has no partition "
                                  f"{partition}")
            if partition >= topics[topic]:
                raise ConfigError(f"--partition {partition}: topic {topic!r} has {topics[topic]} "
                                  f"partition(s), 0 to {topics[topic] - 1}")
        p = pause_record(scope, reason, control.who(), int(_time.time() * 1000), for_s)
        control.write(settings, [p.record()])
    except RingmasterError as exc:
        _fail(exc)
        return
    said = f": {p.reason}" if p.reason else ""
    click.echo(f"group {settings.kafka.group_id!r}: paused {describe_scope(scope)} {p.provenance()}{said}; "
               "every member stops processing it within about 2 s")


@main.command()
@_scope_option
def resume(config: str, topic: str | None, partition: int | None) -> None:
    """End pauses. Without --topic, every pause of the group; with --topic (and --partition),
    that scope only (a wider pause still in force is reported). Works whatever the control
    topic holds: records that are not valid pauses are overwritten in the scope resumed.

    Never imports the plugin. Exit status: 0 resumed, and also when nothing in the scope was
    paused (it says so: resuming is safe to repeat in scripts); 2 a wrong option; 8 the
    cluster did not answer within kafka.connect_timeout_s; 5 it refused."""
    import time as _time

    from runtime.ops import control
    from runtime.ops.control_records import describe_scope

    settings = _operator_settings(config)
    group = settings.kafka.group_id
    try:
        scope = _scope(topic, partition)
        _reach_cluster(settings)
        state = control.OperatorPauses.for_settings(settings)
        try:
            state.load(settings.control.load_timeout_s, report=False)
        finally:
            state.close()
        plan = control.plan_resume(state, topic, partition, control.who(), int(_time.time() * 1000))
        if plan.records:
            control.write(settings, plan.records)
    except RingmasterError as exc:
        _fail(exc)
        return
    cleared = f"; overwrote {plan.cleared} control record(s) that were not valid" if plan.cleared else ""
    if plan.resumed:
        shown = ", ".join(describe_scope(k) for k in plan.resumed[:10])
        more = f" and {len(plan.resumed) - 10} more" if len(plan.resumed) > 10 else ""
        click.echo(f"group {group!r}: resumed {shown}{more}{cleared}")
    else:
        click.echo(f"group {group!r}: nothing to resume, {describe_scope(scope)} is not paused{cleared}")
    if topic is not None and not _group_reads(settings, topic):
        click.echo(f"note: {topic!r} is not one of the group's topics ({', '.join(settings.kafka.topics)})",
                   err=True)
    for p in plan.still:
        click.echo(f"note: {describe_scope(p.scope)} is still paused ({p.describe()})", err=True)
    if plan.invalid_elsewhere:
        click.echo(f"note: {plan.invalid_elsewhere} other control record(s) are not valid pauses or resumes "
                   "(`ringmaster resume` without --topic overwrites them; the daemon's log says what "
                   "is wrong)",
                   err=True)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--json", "as_json", is_flag=True, help="The snapshot as JSON (the same document as /status).")
def status(config: str, as_json: bool) -> None:
    """One snapshot of the daemon: partitions with lag and rates, pauses with reasons,
    workers. Reads [admin] listen's /status, or the status file; never imports the plugin.
    Exit 0: it is running; 1: nothing to read (no endpoint answers, no status file); 3: it is
    not running (it stopped, and says why, or its process is gone)."""
    from runtime.ops.views import NOT_RUNNING_EXIT, read_snapshot, render, show

    settings = _operator_settings(config)
    try:
        reading = read_snapshot(settings)
    except RingmasterError as exc:
        _fail(exc)
        return
    daemons = _daemons_on_host(settings)
    if as_json:
        doc = {**reading.snapshot, "daemons_on_host": daemons} if daemons else reading.snapshot
        click.echo(json.dumps(doc, indent=2))
    else:
        from rich.console import Console

        show(Console(), render(reading))
        if daemons:
            click.echo(f"{len(daemons)} daemons of this group on this host (the snapshot above is the "
                       "first's):")
            for d in daemons:
                click.echo(f"  {d['socket']}: {d['message']}")
    if not reading.running:
        click.echo(f"ringmaster: the daemon is not running: {reading.state}", err=True)
        sys.exit(NOT_RUNNING_EXIT)


def _daemons_on_host(settings: Settings) -> list[dict[str, Any]]:
    """When several daemons of the group run on this host from this config (only the first
    serves [admin] listen and the status file), what each says on its control socket."""
    from runtime.ops.control_socket import find_daemons, send_command

    paths, _ = find_daemons(settings)
    if len(paths) < 2:
        return []
    out = []
    for path in paths:
        try:
            reply = send_command(path, {"command": "status"}, 3.0)
            out.append({"socket": str(path), "message": reply.get("message"), "status": reply.get("status")})
        except RingmasterError as exc:
            out.append({"socket": str(path), "message": f"no answer: {exc}", "status": None})
    return out


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
def top(config: str, interval: float) -> None:
    """A live view of the daemon (q or Ctrl-C to leave): rates, lag, pauses, workers; never
    imports the plugin. While there is nothing to read it keeps trying, and says why and what
    to do; a daemon that stopped or died is shown with its last snapshot until it runs again."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from runtime.ops.keys import QUIT_KEYS, Keys
    from runtime.ops.views import NoDaemon, NothingToRead, fit_to_content, read_snapshot, render

    settings = _operator_settings(config)
    console = Console()
    # Ctrl-C leaves, as the help says, also when this process started with SIGINT ignored
    # (a shell runs a script's background jobs so, and Python then raises no KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Keys() as keys, Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                try:
                    view: Any = render(read_snapshot(settings))
                except NothingToRead as exc:
                    _fail(exc)  # nothing will ever appear: waiting would be forever
                except NoDaemon as exc:
                    view = Text(f"waiting for the daemon (retrying every {interval:g} s; q to leave): "
                                f"{exc}", style="yellow")
                fit_to_content(console, view)
                live.update(view, refresh=True)
                if keys.wait(interval) in QUIT_KEYS:
                    return
    except KeyboardInterrupt:
        pass


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


@main.command(epilog=_REDRIVE_EPILOG)
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

    settings = _load(config, check_plugin=not to_source and not dry_run)
    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format)
    options = Options(start, end, error_types, rate, max_redrives, not to_source, dry_run, group)
    try:
        result = run_redrive(settings, options)
    except RingmasterError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:  # before the loop took over the signals: nothing was sent yet
        click.echo("ringmaster: redrive interrupted before it started; nothing was sent", err=True)
        sys.exit(RedriveIncomplete.exit_code)
    except Exception:
        log.critical("internal error", exc_info=True)
        click.echo("ringmaster: internal error (a bug); the log above has the traceback", err=True)
        _exit(1, False)
        return
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
    _exit(code, result.consumer_abandoned)


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


def _refuse_exactly_once_on_spark(settings: Settings) -> None:
    """Spark runs are at-least-once (docs/spark.md): a config that asks for more is refused
    rather than run with less."""
    if settings.output.guarantee == "exactly-once":
        from runtime.errors import ConfigError

        _fail(ConfigError('output.guarantee = "exactly-once" is not supported by the Spark backend: '
                          "its runs are at-least-once (docs/spark.md); run it with ringmaster run, or "
                          'set guarantee = "at-least-once" for Spark'))


def _fail_if_spark_extra_missing(exc: ImportError) -> None:
    """One line and exit 1 when the `spark` extra is not installed; otherwise return (the
    caller re-raises)."""
    missing = _missing_spark_module(exc)
    if missing is not None:
        what = "PySpark" if missing == "pyspark" else missing
        _fail(RingmasterError(f"the Spark backend needs {what}, which is not installed: "
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
        _fail(ConfigError(f"--source {source}: spark.{why}"))
        raise
    settings = settings.model_copy(update={"spark": spark_settings})
    if source == "kafka":
        try:
            check_kafka_source(settings)
        except RingmasterError as exc:
            _fail(exc)
    return settings


def _spark_settings(config: str, source: str | None) -> Settings:
    settings = _with_source(_load(config), source)
    _refuse_exactly_once_on_spark(settings)
    if settings.kafka.group_type == "share":  # docs/spark.md: Spark reads by offsets, per partition
        _fail(ConfigError('kafka.group_type = "share" is for `ringmaster run`; Spark reads offset ranges of '
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
        _fail(exc)
        return
    except ImportError as exc:
        _fail_if_spark_extra_missing(exc)
        raise
    done = "; caught up: the group committed the end of every partition" \
        if settings.spark.trigger == "availableNow" and result.error is None else ""
    click.echo(result.line() + done, err=True)
    if result.error is not None:
        _fail(result.error)


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
@click.option("--apache-kafka", "apache_kafka", is_flag=True,
              help="Run Apache Kafka itself (one KRaft node; Java 17+, resolved with Maven on first "
                   "use) instead of the embedded Tansu.")
@click.option("--sasl-scram", "sasl_scram", default=None, metavar="USER:PASSWORD",
              help="With --apache-kafka: clients must log in with SCRAM-SHA-512 as this user over TLS "
                   "(SASL_SSL), with certificates made at start; prints the [kafka.security] to use.")
@click.option("--tls-dir", "tls_dir", type=click.Path(file_okay=False), default=None,
              help="With --sasl-scram: where the CA (ca.pem) and the broker's keystore are written "
                   "(default: in the broker's log dir, gone at stop).")
def broker(port: int, apache_kafka: bool, sasl_scram: str | None, tls_dir: str | None) -> None:
    """Run a development broker in the foreground: the embedded Tansu (memory-only), or with
    --apache-kafka a single-node Apache Kafka with a log dir removed at stop."""
    import time

    from runtime.ops.devbroker import FAST_JOIN, DevBroker
    from runtime.ops.kafkabroker import (
        KAFKA_VERSION,
        ApacheKafkaBroker,
        cache_dir,
        parse_scram_user,
        resolved,
    )

    # RACE: the handler goes in before the banner, which is what tells a caller it may stop us.
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    b: DevBroker | ApacheKafkaBroker
    try:
        if (sasl_scram or tls_dir) and not apache_kafka:
            raise ConfigError("--sasl-scram and --tls-dir need --apache-kafka")
        if tls_dir and not sasl_scram:
            raise ConfigError("--tls-dir needs --sasl-scram")
        scram = parse_scram_user(sasl_scram) if sasl_scram else None
        if apache_kafka:
            if not resolved():
                click.echo(f"resolving Apache Kafka {KAFKA_VERSION} with Maven into {cache_dir()} "
                           "(first run only)", err=True)
            b = ApacheKafkaBroker(port, scram=scram, tls_dir=tls_dir).start()
        else:
            b = DevBroker(port).start()
    except RingmasterError as exc:
        _fail(exc)
        return
    except KeyboardInterrupt:
        sys.exit(130)
    if apache_kafka:
        click.echo(f"Apache Kafka {KAFKA_VERSION} listening on {b.bootstrap} (one KRaft node; its log "
                   f"dir goes at stop; Ctrl-C stops it)\n"
                   f"Transactions, the consumer group protocol (KIP-848: group.protocol = \"consumer\") "
                   f"and share groups are on.", err=True)
        if scram is not None:
            assert isinstance(b, ApacheKafkaBroker)
            click.echo(f"Clients log in over TLS (SASL_SSL, SCRAM-SHA-512). In the config of what you run "
                       f"against it:\n[kafka.security]\nprotocol = \"SASL_SSL\"\n"
                       f"sasl_mechanism = \"SCRAM-SHA-512\"\nusername = \"{scram[0]}\"\n"
                       f"ca_location = \"{b.ca}\"\n"
                       "# and the password: RINGMASTER__KAFKA__SECURITY__PASSWORD, or password_file",
                       err=True)
    else:
        fast = "\n".join(f'  "{k}" = {v}' for k, v in FAST_JOIN.items())
        click.echo(f"embedded broker listening on {b.bootstrap} (memory-only; Ctrl-C stops it)\n"
                   f"It forms a consumer group in about session.timeout.ms / 2: "
                   f"22 s with librdkafka's default.\n"
                   f"For joins in about 3 s, put in the config of what you run against it:\n"
                   f"[kafka.consumer]\n{fast}", err=True)
    try:
        while not stop and b.proc is not None and b.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--topic", default=None, help="Default: the config's input topic (when it has one).")
@click.option("--key-separator", default=None,
              help="Split each line at the first SEP: the key before it, the value after.")
@click.option("--partitions", type=int, default=4, show_default=True,
              help="When the topic does not exist yet, create it with this many partitions.")
@click.argument("values", nargs=-1)
def produce(config: str, topic: str | None, key_separator: str | None, partitions: int,
            values: tuple[str, ...]) -> None:
    """Write test records: each VALUE, or else each line of stdin, is one record's value,
    acknowledged by the broker. Uses the config's connection settings."""
    from runtime.ops import devtools

    settings = _operator_settings(config)
    try:
        name = devtools.input_topic(settings, topic)
        # An outage is one line and exit 8, not a stream of client errors; the topics it reads
        # tell whether the topic must be created.
        topics = _reach_cluster(settings)
        lines = values if values else sys.stdin
        count, created = devtools.produce_lines(settings, name, lines, key_separator, partitions, topics)
    except RingmasterError as exc:
        _fail(exc)
        return
    made = f" (created it with {partitions} partitions)" if created else ""
    click.echo(f"produced {count} record(s) to {name!r}{made}", err=True)


@main.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--topic", default=None, help="Default: the config's [output] topic.")
@click.option("--dead-letters", is_flag=True, help="Read the [dead_letter] topic: each line says where "
              "the record came from and why it failed.")
@click.option("-n", "--lines", "last", type=click.IntRange(min=0), default=None, metavar="N",
              help="The last N records of each partition, partition by partition in offset order, "
                   "then exit (as Unix tail -n; with -f, go on following).")
@click.option("-f", "--follow", is_flag=True, help="With -n: after the last N, print what arrives.")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop after N records, waiting for them (from the beginning, or after -n's).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Give up (exit 1) when --max records have not come within this many seconds.")
@click.option("--keys", is_flag=True, help="Print the key, a tab, then the value.")
def tail(config: str, topic: str | None, dead_letters: bool, last: int | None, follow: bool,
         max_records: int | None, timeout_s: float | None, keys: bool) -> None:
    """Print a topic's records, one per line: by default what the plugin produced. Without -n,
    every record from the beginning, then as they come (Ctrl-C to leave). Joins no group,
    commits nothing. Kafka orders records within a partition only: records of different
    partitions come in an order that may differ from run to run, except with -n."""
    from runtime.ops import devtools

    if follow and last is None:
        _fail(ConfigError("-f/--follow goes with -n N (without -n, tail follows from the beginning)"))
    settings = _operator_settings(config)
    seen = 0
    try:
        name = devtools.output_topic(settings, topic, dead_letters)
        _reach_cluster(settings)
        lines = devtools.tail_lines(settings, name, keys, max_records, timeout_s, last=last,
                                    follow=follow or last is None)
        for line in lines:
            click.echo(line)
            seen += 1
    except RingmasterError as exc:
        _fail(exc)
    except KeyboardInterrupt:
        return
    following = follow or last is None
    if following and max_records is not None and seen < max_records:  # --timeout passed first
        _fail(RingmasterError(f"only {seen} of {max_records} record(s) from {name!r} within {timeout_s:g} s"))


if __name__ == "__main__":
    main()
