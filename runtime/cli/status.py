"""``ringmaster status`` and ``top``: what the daemon says of itself, once or live. Never
import the plugin."""

from __future__ import annotations

import json
import signal
import sys
from typing import Any

import click

from runtime.cli.loading import operator_settings
from runtime.cli.outcome import fail
from runtime.config import Settings
from runtime.errors import RingmasterError


@click.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--json", "as_json", is_flag=True, help="The snapshot as JSON (the same document as /status).")
def status(config: str, as_json: bool) -> None:
    """One snapshot of the daemon: partitions with lag and rates, pauses with reasons,
    workers. Reads [admin] listen's /status, or the status file; never imports the plugin.
    Exit 0: it is running; 1: nothing to read (no endpoint answers, no status file); 3: it is
    not running (it stopped, and says why, or its process is gone)."""
    from runtime.ops.views import NOT_RUNNING_EXIT, read_snapshot, render, show

    settings = operator_settings(config)
    try:
        reading = read_snapshot(settings)
    except RingmasterError as exc:
        fail(exc)
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


@click.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--interval", type=float, default=1.0, show_default=True, help="Seconds between refreshes.")
def top(config: str, interval: float) -> None:
    """A live view of the daemon (q or Ctrl-C to leave): rates, lag, pauses, workers; never
    imports the plugin. While there is nothing to read it keeps trying, and says why and what
    to do; a daemon that stopped or died is shown with its last snapshot until it runs again.

    When stdout is not a terminal (a pipe, a file, a CI log) it prints the view once and exits,
    0 when it could read the daemon's snapshot, 1 when there is nothing to read: a live view
    has nowhere to be drawn there (`ringmaster status --json` is the form for scripts)."""
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from runtime.ops.keys import QUIT_KEYS, Keys
    from runtime.ops.views import NoDaemon, NothingToRead, fit_to_content, read_snapshot, render, show

    settings = operator_settings(config)
    console = Console()
    if not console.is_terminal:
        try:
            show(console, render(read_snapshot(settings)))
        except (NothingToRead, NoDaemon) as exc:
            fail(exc)
        return
    # Ctrl-C leaves, as the help says, also when this process started with SIGINT ignored
    # (a shell runs a script's background jobs so, and Python then raises no KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with Keys() as keys, Live(console=console, auto_refresh=False, screen=console.is_terminal) as live:
            while True:
                try:
                    view: Any = render(read_snapshot(settings))
                except NothingToRead as exc:
                    fail(exc)  # nothing will ever appear: waiting would be forever
                except NoDaemon as exc:
                    view = Text(f"waiting for the daemon (retrying every {interval:g} s; q to leave): "
                                f"{exc}", style="yellow")
                fit_to_content(console, view)
                live.update(view, refresh=True)
                if keys.wait(interval) in QUIT_KEYS:
                    return
    except KeyboardInterrupt:
        pass
