"""The ``ringmaster`` command group: every subcommand, each from the module of its family."""

from __future__ import annotations

import click

from runtime.cli.broker import broker
from runtime.cli.check import check
from runtime.cli.console import console
from runtime.cli.daemon import run
from runtime.cli.daemon_commands import reload, scale
from runtime.cli.devtools import produce, tail
from runtime.cli.pauses import pause, resume
from runtime.cli.redrive import redrive
from runtime.cli.spark_commands import spark
from runtime.cli.status import status, top


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="kafka-ringmaster")
def main() -> None:
    """Turn a Kafka topic into CPU-bound work on every core, without losing a record."""


for _command in (run, check, reload, scale, pause, resume, status, top, console, redrive, spark, broker,
                 produce, tail):
    main.add_command(_command)
