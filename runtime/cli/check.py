"""``ringmaster check``: validate a config and start its plugin once, before a deploy."""

from __future__ import annotations

import json
from typing import Any

import click

from runtime.cli.loading import load
from runtime.cli.outcome import fail
from runtime.config import Settings, redacted
from runtime.kafka.properties import effective_settings
from runtime.ops.logs import configure_logging


@click.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--shallow", is_flag=True,
              help="Only import the plugin; do not start it in a worker (no setup()/teardown()).")
@click.option("--connect", is_flag=True,
              help="Also ask the Kafka cluster (kafka.bootstrap_servers): does it answer, are the "
                   "topics there, can it give the configuration what it needs.")
def check(config: str, shallow: bool, connect: bool) -> None:
    """Validate a config, print the effective settings (librdkafka properties included,
    secrets redacted), then start the plugin in a throw-away worker: import, setup(),
    teardown(), as the daemon's workers do (bounded by workers.setup_timeout_s). Also says
    whether the C speedups are on, how many workers and why, and the shared memory the rings
    need against what is free.

    It does not contact the Kafka cluster unless --connect is given: "valid" is about the
    file, not about the address in it. With --connect it asks the cluster for its topics
    (within kafka.connect_timeout_s), says which of the config's topics exist, and refuses
    what the cluster cannot give (exactly-once on the development broker).

    Exit 2: the config is invalid (or, with --connect, the cluster cannot serve it); exit 3:
    the plugin cannot start (one line says why); exit 4: this host cannot run it (too little
    shared memory, or a CPU other than x86-64 without the C speedups); with --connect, exit 8:
    the cluster did not answer, 14: it refused the credentials."""
    settings = load(config)
    from runtime.kafka.messages import bind_packer
    from runtime.transport import packing, speedups
    from runtime.worker import decoding

    bind_packer()  # the packer's path (C or Python) is known once it knows the message type
    click.echo(json.dumps(redacted(effective_settings(settings)), indent=2))
    contacted = "" if connect else " (the Kafka cluster was not contacted: --connect asks it)"
    click.echo(f"config {config!r} is valid; plugin {settings.workers.plugin!r} imports{contacted}",
               err=True)
    paths: list[speedups.HotPath[Any]] = [packing.PACK, decoding.BUILD_RECORDS]
    click.echo(f"hot paths: {speedups.describe(paths)}", err=True)
    slow = speedups.python_warning(paths)
    if slow is not None:
        click.echo(f"warning: {slow}", err=True)
    from runtime.errors import PluginError, SharedMemoryError
    from runtime.supervisor.daemon.run import check_plugin_starts, host_problem, shm_report

    click.echo(f"workers: {settings.workers.processes} ({settings.workers.processes_from})", err=True)
    problem = host_problem(settings)
    if problem is not None:  # the daemon would refuse to start here (exit 4), with this line
        fail(SharedMemoryError(problem))
    click.echo(shm_report(settings)[0], err=True)
    if connect:
        _ask_the_cluster(settings)
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


def _ask_the_cluster(settings: Settings) -> None:
    """``--connect``: the cluster answers, with the config's topics, and can serve it."""
    from runtime.errors import ConfigError, RingmasterError
    from runtime.kafka.admin import ClusterProbe
    from runtime.kafka.properties import consumer_properties
    from runtime.ops.cluster import cluster_problem, wait_for_cluster
    from runtime.ops.logs import configure_command_logging

    configure_command_logging()  # the client's lines through the log's throttle, warnings only
    probe = ClusterProbe(consumer_properties(settings))
    try:
        topics = wait_for_cluster(settings, give_up_after_s=settings.kafka.connect_timeout_s, probe=probe)
        assert topics is not None  # no stop condition: it answers or raises
        problem = cluster_problem(settings, probe.cluster_id)
        if problem is not None:
            raise ConfigError(problem)
    except RingmasterError as exc:
        fail(exc)
        return
    click.echo(f"the Kafka cluster at {probe.bootstrap} answers (cluster id {probe.cluster_id})", err=True)
    named = [(t, "input") for t in settings.kafka.topics if not t.startswith("^")]
    named += [(t, what) for t, what in ((settings.output.topic, "[output] topic"),
                                       (settings.dead_letter.topic, "[dead_letter] topic")) if t]
    for topic, what in named:
        if topic in topics:
            click.echo(f"  {what} {topic!r}: {topics[topic]} partition(s)", err=True)
        else:
            click.echo(f"warning: {what} {topic!r} does not exist on the cluster (create it; the daemon "
                       "waits for an output topic that is missing)", err=True)
