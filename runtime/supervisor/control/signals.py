"""The supervisor's signals: what each one asks for, and the queue their handlers fill.

Runs in: supervisor. Handlers only enqueue (a handler never logs, raises or decides
anything: it may run between any two bytecodes of the loop); the loop drains the queue
between its steps, and each signal becomes an :class:`Intent` that the loop hands to the room
that does it (this room calls no other: it answers what was asked).

===========  ==========  ==================================================================
TERM, INT    STOP        graceful stop: stop fetching, finish the batches in progress, fence
                         the rest, commit, leave the group, unlink shared memory, exit 0
QUIT         STOP        the same graceful stop (Ctrl-\\ in a terminal sends it to the group)
HUP          RELOAD      reload the plugin, as ``ringmaster reload`` does (commands.py), with
                         no rebalance
TTIN, TTOU   GROW,       one worker more / less, up to ``workers.max_processes`` (as in
             SHRINK      gunicorn)
USR1         LOG_STATUS  one log line summing up the daemon: records, rate, lag, partitions,
                         workers
USR2, WINCH  –           ignored, with a log line
PIPE         –           ignored (a reader of our output went away: never a reason to die)
===========  ==========  ==================================================================

Workers ignore every one of them but TERM (runtime/worker/signal_mask.py): a terminal hangup, a
Ctrl-C or a Ctrl-\\ reaches the whole process group, and only the supervisor decides.
"""

from __future__ import annotations

import enum
import logging
import queue
import signal
import threading
from dataclasses import dataclass
from types import FrameType

from runtime.ops.status import StatusSnapshot

log = logging.getLogger("ringmaster.supervisor")


class Intent(enum.Enum):
    """What a signal asks of the daemon (the module docstring's table)."""

    STOP = "stop"
    RELOAD = "reload"
    GROW = "grow"  # one worker more
    SHRINK = "shrink"  # one worker fewer
    LOG_STATUS = "log status"


# Every signal here gets a handler (install); None: ignored, with a log line.
MEANS: dict[signal.Signals, Intent | None] = {
    signal.SIGTERM: Intent.STOP, signal.SIGINT: Intent.STOP, signal.SIGQUIT: Intent.STOP,
    signal.SIGHUP: Intent.RELOAD, signal.SIGTTIN: Intent.GROW, signal.SIGTTOU: Intent.SHRINK,
    signal.SIGUSR1: Intent.LOG_STATUS, signal.SIGUSR2: None, signal.SIGWINCH: None}


class SignalQueue:
    """The handlers' side: installed once, as early as the process can (``ringmaster run``
    does it before it reads the config), so that no signal of the table above finds the
    default action – which, for HUP, QUIT, USR1, USR2, TTIN and TTOU, ends or stops the
    process with no commit and shared memory left behind."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.installed = False

    def install(self) -> SignalQueue:
        """Runs in: the main thread (Python runs handlers there only)."""
        if self.installed or threading.current_thread() is not threading.main_thread():
            return self
        for sig in MEANS:
            signal.signal(sig, self._enqueue)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.installed = True
        return self

    def _enqueue(self, signum: int, _frame: FrameType | None) -> None:
        self.put(signum)  # INVARIANT: a handler only enqueues

    def put(self, signum: int) -> None:
        """What a handler does (and a test, to deliver a signal)."""
        self._queue.put_nowait(signum)

    def drain(self) -> list[signal.Signals]:
        out = []
        while True:
            try:
                out.append(signal.Signals(self._queue.get_nowait()))
            except queue.Empty:
                return out


@dataclass(frozen=True)
class Asked:
    intent: Intent
    by: str  # the signal's name: the log's, and the operation's ``requested_by``


class SignalHandlers:
    """What the signals that arrived ask for. Runs in: supervisor, between the loop's steps
    (never inside a handler)."""

    def __init__(self, signals: SignalQueue) -> None:
        self.queue = signals
        self.stop_requested: str | None = None  # the signal that asked for a stop

    def dispatch(self) -> list[Asked]:
        """One intent per signal that arrived since the last call, in their order."""
        asked = []
        for sig in self.queue.drain():
            intent = MEANS[sig]
            if intent is None:
                log.info(f"{sig.name} ignored", extra={"signal": sig.name})
                continue
            if intent is Intent.STOP:
                log.info("stop requested", extra={"signal": sig.name})
                self.stop_requested = self.stop_requested or sig.name
            asked.append(Asked(intent, sig.name))
        return asked


def log_status(snapshot: StatusSnapshot | None) -> None:
    """SIGUSR1's line."""
    log.info(f"status: {snapshot.one_line() if snapshot else 'starting'}", extra={"signal": "SIGUSR1"})
