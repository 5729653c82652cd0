"""The signals a worker ignores, and the supervisor's hold on them while it starts one.

Runs in: the supervisor (``signals_held_for_spawn``, around each worker's start in
supervisor/workers/pool.py) and a worker (``ignore_operator_signals``, first thing).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

# A terminal's hangup, Ctrl-C and Ctrl-\ reach the whole process group, and so does an
# operator's `kill -HUP -<pgid>`: a worker ignores them all (only the supervisor decides, and
# stops workers with SIGTERM). Most would otherwise end the process at once (HUP, USR1, USR2,
# QUIT with a core dump) or stop it (TTIN, TTOU), mid-batch.
WORKER_IGNORES = frozenset({signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2,
                            signal.SIGTTIN, signal.SIGTTOU, signal.SIGWINCH, signal.SIGPIPE})


@contextlib.contextmanager
def signals_held_for_spawn() -> Iterator[None]:
    """Runs in: supervisor, around starting a worker process. Blocks WORKER_IGNORES in the
    calling thread so the new process starts with them blocked (fork and exec keep the
    mask): one that arrives before the worker ignores them stays pending and is discarded
    when it does (ignore_operator_signals), instead of killing a worker still starting up.
    The helpers multiprocess starts on the way (fork server, resource tracker) keep them
    blocked for good. The supervisor gets what arrived meanwhile once the mask is restored."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, WORKER_IGNORES)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def ignore_operator_signals() -> None:
    """Runs in: a worker, first thing. Ignore, then unblock (see signals_held_for_spawn)."""
    for sig in WORKER_IGNORES:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, WORKER_IGNORES)

