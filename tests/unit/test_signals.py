"""The supervisor's signal table (runtime/supervisor/control/signals.py) with real signals sent to
this process, and the worker side: a worker starts with the operator signals blocked, so a
hangup of the process group cannot kill it before it ignores them."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_admin_metrics import snapshot

from runtime.supervisor.control.signals import MEANS, Asked, Intent, SignalHandlers, SignalQueue, log_status
from runtime.worker.signal_mask import WORKER_IGNORES

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def handlers() -> Iterator[SignalHandlers]:
    saved = {sig: signal.getsignal(sig) for sig in (*MEANS, signal.SIGPIPE)}
    try:
        yield SignalHandlers(SignalQueue().install())
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def deliver(h: SignalHandlers, *sigs: signal.Signals) -> list[Asked]:
    for sig in sigs:
        os.kill(os.getpid(), sig)  # Python runs the handler before the next bytecode
    return h.dispatch()


@pytest.mark.parametrize(("sig", "intent"), [(signal.SIGHUP, Intent.RELOAD), (signal.SIGTTIN, Intent.GROW),
                                             (signal.SIGTTOU, Intent.SHRINK)], ids=lambda s: str(s))
def test_reload_and_resize_signals_ask_the_live_commands_and_stop_nothing(
        handlers: SignalHandlers, sig: signal.Signals, intent: Intent) -> None:
    assert deliver(handlers, sig, sig) == [Asked(intent, sig.name)] * 2, \
        "each arrival is one request (commands.py queues and judges them)"
    assert handlers.stop_requested is None


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGPIPE],
                         ids=lambda s: s.name)
def test_an_operator_signal_is_named_and_stops_nothing(handlers: SignalHandlers, sig: signal.Signals,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="ringmaster.supervisor"):
        asked = deliver(handlers, sig, sig)
        for a in asked:
            assert a.intent is Intent.LOG_STATUS
            log_status(snapshot())  # as the loop does with the latest status
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    if sig is signal.SIGPIPE:
        assert lines == [] and asked == [], "ignored by the kernel: nothing reaches the queue"
        return
    assert len(lines) == 2, f"one line per arrival: {lines}"
    assert len(asked) == (2 if sig is signal.SIGUSR1 else 0)
    level, text = lines[0]
    expected = {signal.SIGUSR1: ("INFO", "status: 1,000 records (100/s), 997 outputs, 3 dead letters, lag 7; "
                                         "2 partitions (1 paused); 2/2 workers alive, 2 restarts; ready"),
                signal.SIGUSR2: ("INFO", "SIGUSR2 ignored"),
                signal.SIGWINCH: ("INFO", "SIGWINCH ignored")}[sig]
    assert level == expected[0] and expected[1] in text, lines


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT], ids=lambda s: s.name)
def test_term_int_and_quit_ask_for_the_same_graceful_stop(handlers: SignalHandlers,
                                                           sig: signal.Signals) -> None:
    assert [a.intent for a in deliver(handlers, signal.SIGHUP)] == [Intent.RELOAD]
    assert deliver(handlers, sig) == [Asked(Intent.STOP, sig.name)]
    assert handlers.stop_requested == sig.name
    assert [a.intent for a in deliver(handlers, signal.SIGTERM)] == [Intent.STOP]
    assert handlers.stop_requested == sig.name, "the first one says why"


def test_every_handled_signal_has_a_meaning_and_the_table_says_it() -> None:
    doc = (ROOT / "runtime/supervisor/control/signals.py").read_text()
    for sig, intent in MEANS.items():
        assert sig.name[3:] in doc and (intent is None or intent.name in doc), sig


_SPAWN = """
import shutil, signal, sys
import multiprocess
from runtime.supervisor.workers.pool import start_resource_tracker
from runtime.worker.signal_mask import signals_held_for_spawn

start_resource_tracker()  # as WorkerPool does
proc = multiprocess.get_context(sys.argv[1]).Process(target=shutil.copyfile,
                                                      args=("/proc/self/status", sys.argv[2]))
before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
with signals_held_for_spawn():
    proc.start()
assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before, "the supervisor's mask is restored"
proc.join(30)
sys.exit(proc.exitcode)
"""


def _blocked(status: str) -> set[int]:
    mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_worker_process_starts_with_the_operator_signals_blocked(tmp_path: Path, method: str) -> None:
    """What a starting worker has before worker_main ignores them: blocked (held pending,
    then discarded), never the default action that ends it. In a process of its own: the
    helpers multiprocess starts (resource tracker, fork server) end with it."""
    out = tmp_path / "status"
    r = subprocess.run([sys.executable, "-c", _SPAWN, method, str(out)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    blocked = _blocked(out.read_text())
    assert {int(s) for s in WORKER_IGNORES} <= blocked, sorted(blocked)
    assert int(signal.SIGTERM) not in blocked, "SIGTERM still stops a worker"
