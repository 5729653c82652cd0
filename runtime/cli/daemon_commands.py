"""``ringmaster reload`` and ``scale``: requests to the running daemons of a group on this
host, over each one's control socket (runtime/ops/control_socket.py). Never imports the
plugin: a broken deploy must not keep an operator from rolling it back."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click

from runtime.cli.outcome import fail
from runtime.config import load_settings
from runtime.errors import RingmasterError

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
        fail(exc)
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
        fail(CommandFailed("; ".join(failed)))


@click.command(epilog=_COMMAND_EXIT_CODES)
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


@click.command(epilog=_COMMAND_EXIT_CODES)
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
