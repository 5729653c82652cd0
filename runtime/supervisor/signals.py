"""The supervisor's signals: what each one means, and the queue their handlers fill.

Runs in: supervisor. Handlers only enqueue (a handler never logs, raises or decides
anything: it may run between any two bytecodes of the loop); the loop drains the queue
between its steps and calls one ``handle_<name>`` method per signal, gunicorn's way.

===========  =============================================================================
TERM, INT    graceful stop: stop fetching, finish the batches in progress, fence the rest,
             commit, leave the group, unlink shared memory, exit 0
QUIT         the same graceful stop (Ctrl-\\ in a terminal sends it to the whole group)
HUP          reload the plugin, as ``ringmaster reload`` does (rollout.py), without a rebalance
TTIN, TTOU   one worker more / less, up to ``workers.max_processes`` (as in gunicorn)
USR1         one log line summing up the daemon: records, rate, lag, partitions, workers
USR2, WINCH  ignored, with a log line
PIPE         ignored (a reader of our output went away: never a reason to die)
===========  =============================================================================

Workers ignore every one of them but TERM (runtime/worker/main.py): a terminal hangup, a
Ctrl-C or a Ctrl-\\ reaches the whole process group, and only the supervisor decides.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
from collections.abc import Callable
from types import FrameType

from runtime.ops.status import StatusSnapshot

log = logging.getLogger("ringmaster.supervisor")

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU,
           signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH)


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
        for sig in HANDLED:
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


class SignalHandlers:
    """``handle_<name>`` for every signal the supervisor handles. Runs in: supervisor, between
    the loop's steps (never inside a handler). Reload (HUP) and resize (TTIN, TTOU) go to
    ``live`` (commands.py: queued with the control socket's requests, one at a time)."""

    def __init__(self, signals: SignalQueue,
                 status: Callable[[], StatusSnapshot | None],
                 live: Callable[[signal.Signals], None]) -> None:
        self.queue = signals
        self.status = status
        self.live = live
        self.stop_requested: str | None = None  # the signal that asked for a stop

    def dispatch(self) -> bool:
        """Handle what arrived since the last call; True once a stop was requested."""
        for sig in self.queue.drain():
            getattr(self, f"handle_{sig.name[3:].lower()}")()
        return self.stop_requested is not None

    def _stop(self, sig: str) -> None:
        log.info("stop requested", extra={"signal": sig})
        self.stop_requested = self.stop_requested or sig

    def handle_term(self) -> None:
        self._stop("SIGTERM")

    def handle_int(self) -> None:
        self._stop("SIGINT")

    def handle_quit(self) -> None:
        self._stop("SIGQUIT")

    def handle_hup(self) -> None:
        self.live(signal.SIGHUP)

    def handle_ttin(self) -> None:
        self.live(signal.SIGTTIN)

    def handle_ttou(self) -> None:
        self.live(signal.SIGTTOU)

    def handle_usr1(self) -> None:
        snap = self.status()
        log.info(f"status: {snap.one_line() if snap else 'starting'}", extra={"signal": "SIGUSR1"})

    def handle_usr2(self) -> None:
        log.info("SIGUSR2 ignored", extra={"signal": "SIGUSR2"})

    def handle_winch(self) -> None:
        log.info("SIGWINCH ignored", extra={"signal": "SIGWINCH"})
