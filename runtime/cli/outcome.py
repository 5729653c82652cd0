"""How a command ends: one line on stderr with the error's exit status, a bug's traceback in
the log, or an exit that does not wait for a Kafka client left busy."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import click

from runtime.errors import RingmasterError

log = logging.getLogger("ringmaster")


def fail(exc: RingmasterError) -> NoReturn:
    click.echo(f"ringmaster: error: {exc}", err=True)
    sys.exit(exc.exit_code)


def internal_error() -> NoReturn:
    """Called in an ``except Exception``: a bug, not a condition the user caused. The traceback
    goes to the log, one line here."""
    log.critical("internal error", exc_info=True)
    click.echo("ringmaster: internal error (a bug); the log above has the traceback", err=True)
    exit_process(1, False)


def exit_process(code: int, consumer_abandoned: bool) -> NoReturn:
    """sys.exit, unless leaving the group was abandoned (GroupConsumer.close): then the
    Kafka client is still busy on a helper thread and interpreter teardown could wait on it
    or free it under its feet, so flush what we print and end the process at once."""
    if consumer_abandoned:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
