"""The stop's last resort: a deadline that holds even while no Python code can run.

A Python thread cannot bound a call that holds the GIL. confluent-kafka runs librdkafka's
assign with the GIL held inside a rebalance callback (its fallback when the callback did not
assign), and inside ``Consumer.close()`` that call can wait for an answer that never comes
(seen on a loaded Tansu when the group rebalanced as the member closed: ``py-spy`` showed the
close thread in ``Consumer_rebalance_cb`` → ``rd_kafka_assign0`` → ``rd_kafka_op_req`` and the
main thread unable to take the GIL back). Then nothing in the process runs again: not the
deadline of GroupConsumer.close's helper thread, not a signal handler, not a log line.

``arm`` (``last_resort``: for the time of a block) starts a thread of C alone
(runtime/transport/_speedups.c: exit_later) that, unless ``disarm`` comes first, writes the
log line of what was given up (formatted now, by the daemon's own handlers), unlinks the run's
shared-memory segments and ends the process with the exit status the stop had come to. The
workers end with their supervisor by themselves (runtime/worker/lineage.py). Without the C
speedups it is faulthandler's watchdog, which also runs without the GIL but can only dump
every thread's stack and exit 1; the segments are then reclaimed by the next start
(runtime/transport/shm.py: reclaim_stale).

Runs in: supervisor.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from runtime.transport.speedups import native

# Which exit_later to use; tests point it at None to exercise the fallback.
_exit_later = getattr(native, "exit_later", None)
_cancel_exit = getattr(native, "cancel_exit", None)


_armed = False  # whether disarm() has something to cancel (faulthandler's timer is process-wide)


def arm(seconds: float, code: int, logger: logging.Logger, message: str,
        fields: Mapping[str, Any], unlink: Sequence[Path] = ()) -> None:
    """Unless disarm() comes within ``seconds``: log ``message`` with ``fields`` at ERROR on
    ``logger``, unlink ``unlink`` and end the process with ``code``, whatever holds the GIL.
    Only the last armed is in force."""
    global _armed
    _armed = True
    if _exit_later is None or _cancel_exit is None:
        faulthandler.dump_traceback_later(seconds, exit=True, file=sys.stderr)
        return
    line = rendered(logger, message, {**fields, "exit_code": code}, at=time.time() + seconds)
    _exit_later(seconds, code, line.encode("utf-8", "replace"), [bytes(p) for p in unlink])


def disarm() -> None:
    """What arm() set up does not happen (nothing, if nothing is armed)."""
    global _armed
    if not _armed:
        return
    _armed = False
    if _exit_later is None or _cancel_exit is None:
        faulthandler.cancel_dump_traceback_later()
    else:
        _cancel_exit()


@contextlib.contextmanager
def last_resort(seconds: float, code: int, logger: logging.Logger, message: str,
                fields: Mapping[str, Any], unlink: Sequence[Path] = ()) -> Iterator[None]:
    """arm() for the time of the block."""
    arm(seconds, code, logger, message, fields, unlink)
    try:
        yield
    finally:
        disarm()


def rendered(logger: logging.Logger, message: str, fields: Mapping[str, Any], at: float) -> str:
    """The text ``logger.error(message, extra=fields)`` would write at wall-clock time ``at``
    to the stream handlers it reaches, formatted now: when it is written, nothing may run Python."""
    record = logger.makeRecord(logger.name, logging.ERROR, __file__, 0, message, (), None,
                               extra=dict(fields))
    record.created, record.msecs = at, (at - int(at)) * 1000
    text = []
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.filter(record):
                text.append(handler.format(record) + handler.terminator)
        current = current.parent if current.propagate else None
    return "".join(text) or f"{message} {' '.join(f'{k}={v}' for k, v in fields.items())}\n"
