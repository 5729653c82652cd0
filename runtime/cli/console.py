"""``ringmaster console``: the web console (runtime/console/), in a process of its own. Needs
the ``[console]`` extra; never imports the plugin."""

from __future__ import annotations

import os
from pathlib import Path

import click

from runtime.cli.loading import load
from runtime.cli.outcome import fail
from runtime.errors import ConfigError, RingmasterError
from runtime.ops.logs import configure_logging

TOKEN_ENV = "RINGMASTER_CONSOLE_TOKEN"


@click.command()
@click.option("-c", "--config", "configs", type=click.Path(dir_okay=False), required=True, multiple=True,
              help="A group's config (its connection, topics, control, status and dead-letter topics); "
                   "repeat for several groups.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True, metavar="HOST:PORT",
              help="Where to serve the pages: loopback unless --allow-remote.")
@click.option("--allow-remote", is_flag=True,
              help="Allow a non-loopback --listen address; a token is then required for every page "
                   f"(--token-file or {TOKEN_ENV}).")
@click.option("--token-file", type=click.Path(dir_okay=False, exists=True), default=None,
              help=f"A file holding the token every page asks for (or {TOKEN_ENV}); on loopback too "
                   "when given.")
@click.option("--read-only", is_flag=True, help="Show everything, act on nothing: no pause, resume, reload, "
                                                "scale or redrive.")
def console(configs: tuple[str, ...], listen: str, allow_remote: bool, token_file: str | None,
            read_only: bool) -> None:
    """A web console for one or more groups: every member on every host (from the status
    records each daemon publishes to its group's status topic, control.status_interval_s),
    each partition with its lag and rate, plots of the last hour, the dead-letter explorer
    with redrives (the plan first, as redrive --dry-run, then the redrive), and the operator's
    actions (pause and resume a partition, a topic or the group; reload; scale), each with every
    member's acknowledgement. Actions are written to the control topic as `ringmaster pause`,
    `resume`, `reload` and `scale` would be (reload and scale reach every member on every
    host, not only those of this one).

    Runs in its own process, reaching the Kafka cluster only: no admin port of a member, and
    every asset of its pages in the package. Needs the console extra:
    pip install 'kafka-ringmaster[console]'.

    Exit status: 0 stopped (Ctrl-C, SIGTERM); 2 a bad config or option (--allow-remote without
    a token, a --listen that is not loopback without --allow-remote), or the extra is not
    installed; 13 --listen cannot be bound (in use)."""
    settings = [load(c, check_plugin=False) for c in configs]
    # A process that runs for long: its own lines (where it listens, what it cannot read) at
    # INFO, and the Kafka clients' through the same throttled log.
    configure_logging(settings[0].supervisor.log_level, settings[0].supervisor.log_format, role="console")
    token = None
    try:
        if token_file is not None:
            token = Path(token_file).read_text().strip()
            if not token:
                raise ConfigError(f"--token-file {token_file!r} is empty")
        elif os.environ.get(TOKEN_ENV):
            token = os.environ[TOKEN_ENV].strip()
        if token is not None and len(token) < 16:
            raise ConfigError("the console's token must be at least 16 characters (openssl rand -hex 16)")
        try:
            from runtime.console.server import serve
        except ImportError as exc:
            raise ConfigError(f"ringmaster console needs the console extra ({exc.name} is missing): "
                              "pip install 'kafka-ringmaster[console]'") from None
        serve(settings, listen, allow_remote, token, read_only)
    except RingmasterError as exc:
        fail(exc)
