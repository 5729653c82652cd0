"""A command's settings, read and checked before anything touches Kafka, and the cluster's
first answer for the commands that need one."""

from __future__ import annotations

import os
import sys

from runtime.cli.outcome import fail
from runtime.config import Settings, load_settings
from runtime.errors import RingmasterError
from runtime.ops.logs import configure_command_logging


def load(config: str | None, check_plugin: bool = True) -> Settings:
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
        from runtime.kafka.admin import check_client_properties
        from runtime.kafka.properties import consumer_properties, producer_properties

        check_client_properties(consumer_properties(settings), producer_properties(settings))
        return settings
    except RingmasterError as exc:
        fail(exc)


def operator_settings(config: str) -> Settings:
    """An operator command's settings: the plugin is not imported, and only warnings are
    logged (on stderr)."""
    settings = load(config, check_plugin=False)
    configure_command_logging()
    return settings


def reach_cluster(settings: Settings) -> dict[str, int]:
    """The cluster's topics and partition counts, or KafkaUnreachable after
    kafka.connect_timeout_s (exit 8), or KafkaAccessRefused at once (exit 14)."""
    from runtime.ops.cluster import wait_for_cluster

    topics = wait_for_cluster(settings, give_up_after_s=settings.kafka.connect_timeout_s)
    assert topics is not None  # no stop condition: it answers or raises
    return topics
