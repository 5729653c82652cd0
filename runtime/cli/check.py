"""``ringmaster check``: validate a config and start its plugin once, before a deploy."""

from __future__ import annotations

import json
from typing import Any

import click

from runtime.cli.loading import load
from runtime.cli.outcome import fail
from runtime.config import redacted
from runtime.kafka.properties import effective_settings
from runtime.ops.logs import configure_logging


@click.command()
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
    settings = load(config)
    from runtime.kafka.messages import bind_packer
    from runtime.transport import packing, speedups
    from runtime.worker import decoding

    bind_packer()  # the packer's path (C or Python) is known once it knows the message type
    click.echo(json.dumps(redacted(effective_settings(settings)), indent=2))
    click.echo(f"config {config!r} is valid; plugin {settings.workers.plugin!r} imports",
               err=True)
    paths: list[speedups.HotPath[Any]] = [packing.PACK, decoding.BUILD_RECORDS]
    click.echo(f"hot paths: {speedups.describe(paths)}", err=True)
    slow = speedups.python_warning(paths)
    if slow is not None:
        click.echo(f"warning: {slow}", err=True)
    from runtime.errors import PluginError, SharedMemoryError
    from runtime.supervisor.daemon import check_plugin_starts, host_problem, shm_report

    click.echo(f"workers: {settings.workers.processes} ({settings.workers.processes_from})", err=True)
    problem = host_problem(settings)
    if problem is not None:  # the daemon would refuse to start here (exit 4), with this line
        fail(SharedMemoryError(problem))
    click.echo(shm_report(settings)[0], err=True)
    if settings.spark.source == "kafka":
        from runtime.spark.builtin_source import describe

        click.echo(describe(settings), err=True)
    if shallow:
        return

    configure_logging(settings.supervisor.log_level, settings.supervisor.log_format, role="check")
    outcome = check_plugin_starts(settings)
    if outcome.problem is not None:
        fail(PluginError(f"workers.plugin: the plugin cannot start: {outcome.problem}"))
    click.echo(f"plugin {settings.workers.plugin!r} starts in a worker: import and setup() "
               f"took {outcome.seconds:.1f} s; teardown() ran", err=True)
    if outcome.teardown_problem is not None:
        click.echo(f"warning: {outcome.teardown_problem} (the daemon logs this and goes on)", err=True)
