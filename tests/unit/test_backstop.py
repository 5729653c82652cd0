"""The stop's last resort (runtime/ops/backstop.py): a SIGTERM ends the daemon within its bound
even when the Kafka client holds the GIL for good inside close(), as confluent-kafka's rebalance
callback does around librdkafka's assign (seen in the operator matrix on a loaded Tansu). Each
case runs in a child process, which the backstop ends: the child's exit status, stderr and the
files it was told to unlink are what is judged. The parent's wait is a bound for a failing
case, not a timing assertion."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.transport.speedups import native

ROOT = Path(__file__).resolve().parents[2]
UNIT = Path(__file__).resolve().parent
needs_c = pytest.mark.skipif(native is None or not hasattr(native, "exit_later"),
                             reason="the C speedups are not built (their fallback is tested below)")

# What blocks for good while holding the GIL: a C call made through ctypes.PyDLL keeps it
# (ctypes.CDLL would let it go), like librdkafka's assign inside Consumer_rebalance_cb.
PREAMBLE = textwrap.dedent("""
    import ctypes, logging, sys, threading
    from pathlib import Path
    from runtime.ops.logs import configure_logging
    from runtime.ops.backstop import last_resort
    configure_logging("INFO", "text", "supervisor")
    log = logging.getLogger("ringmaster.supervisor")

    def hold_gil(*_):
        ctypes.PyDLL(None).sleep(3600)
""")


def run_child(body: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = PREAMBLE + textwrap.dedent(body)
    env = {"PYTHONPATH": f"{UNIT}:{ROOT}", "PATH": "/usr/bin:/bin"}
    try:
        return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the child never ended: the last resort did not fire\n{exc.stderr!r}") from None


@needs_c
def test_it_ends_the_process_with_the_stops_code_while_another_thread_holds_the_gil(tmp_path: Path) -> None:
    segment = tmp_path / "rm-segment"
    segment.write_bytes(b"x")
    r = run_child("""
        with last_resort(0.2, 0, log, "gave up leaving the group", {"timeout_s": 1.5}, [Path(sys.argv[1])]):
            helper = threading.Thread(target=hold_gil, daemon=True)
            helper.start()
            helper.join(0.1)  # never returns: the helper holds the GIL, as the close thread did
        print("not reached")
    """, str(segment))
    assert r.returncode == 0, r.stderr
    assert "not reached" not in r.stdout
    line = next(ln for ln in r.stderr.splitlines() if "gave up leaving the group" in ln)
    assert "ERROR" in line and "supervisor[" in line, "formatted by the daemon's own handler"
    assert "timeout_s=1.5" in line and "exit_code=0" in line
    assert not segment.exists(), "the run's segments are unlinked (invariant 7)"


@needs_c
def test_a_block_that_ends_in_time_cancels_it() -> None:
    # The first deadline is cancelled as its block ends; the second one, later, is what ends
    # the child: had the first fired, the status would be 3.
    r = run_child("""
        with last_resort(0.3, 3, log, "first", {}):
            pass
        with last_resort(0.6, 4, log, "second", {}):
            hold_gil()
    """)
    assert r.returncode == 4, r.stderr
    assert "second" in r.stderr and "first" not in r.stderr


def test_without_the_c_speedups_faulthandler_ends_it_and_shows_where_it_was_stuck() -> None:
    r = run_child("""
        import runtime.ops.backstop as backstop
        backstop._exit_later = backstop._cancel_exit = None
        with last_resort(0.2, 0, log, "gave up", {}):
            hold_gil()
    """)
    assert r.returncode == 1, r.stderr  # faulthandler can only exit 1
    assert "Timeout" in r.stderr and "File " in r.stderr, r.stderr


@needs_c
def test_supervisor_shutdown_ends_when_the_consumer_close_holds_the_gil(tmp_path: Path) -> None:
    """The step found: GroupConsumer.close runs librdkafka's close on a helper thread with a
    deadline, but a rebalance callback inside it holds the GIL, so the deadline never comes.
    shutdown() still ends the process, with the stop's exit status and the final status
    written, having unlinked the run's segments."""
    segment = tmp_path / "rm-segment"
    segment.write_bytes(b"x")
    status = tmp_path / "status.json"
    r = run_child("""
        import signal
        from fakes import TP0, Clock, FakeConsumer, FakePool, assign
        from runtime.config import Settings
        from runtime.kafka.consumer import close_within
        from runtime.supervisor.daemon.loop import Supervisor

        settings = Settings.model_validate({
            "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
            "workers": {"plugin": "workers.enrich", "processes": 1},
            "supervisor": {"shutdown_timeout_s": 1.0, "status_file": sys.argv[2]}})
        pool, consumer = FakePool(1), FakeConsumer()
        sup = Supervisor(settings, consumer, pool, pool.epochs, clock=Clock())
        sup.workforce.start_all()
        assign(sup, consumer, [TP0])
        pool.segment_paths = lambda: [Path(sys.argv[1])]

        def close(timeout_s):  # GroupConsumer.close's shape, around a client that holds the GIL
            return close_within(hold_gil, timeout_s, "kafka-close")[0]

        consumer.close = close
        sup.signals.queue.put(signal.SIGTERM)
        sup.handle_signals()
        sup.shutdown()
        print("shutdown returned")
    """, str(segment), str(status))
    assert r.returncode == 0, r.stderr
    assert "shutdown returned" not in r.stdout
    assert "leaving the consumer group did not finish" in r.stderr, r.stderr
    assert "stop=SIGTERM received" in r.stderr
    assert not segment.exists()
    final = json.loads(status.read_text())["stopped"]
    assert final["code"] == 0 and final["reason"] == "SIGTERM received", "written before the close"


@needs_c
def test_the_release_after_the_supervisor_stopped_is_bounded_too(tmp_path: Path) -> None:
    """run_daemon's releases (the control topic's reader, the dead-letter producer, the admin
    endpoint, the workers) run after the supervisor's stop: one that holds the GIL for good
    still ends the process, with the stop's status, the segments unlinked."""
    r = run_child("""
        import time
        from types import SimpleNamespace
        from runtime.ops.status import Stopped
        from runtime.supervisor.daemon import run as daemon
        from runtime.transport.shm import SegmentSet
        from fakes import settings

        daemon._RELEASE_FLOOR_S = 0.2
        segments = SegmentSet(sys.argv[1])
        segments.create("epochs", 64)
        stopped = SimpleNamespace(final_status=SimpleNamespace(stopped=Stopped(0, "SIGTERM received")),
                                  stop_deadline=time.monotonic())
        daemon._bound_the_release(settings(), stopped, segments)
        hold_gil()  # a release that never returns
    """, str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "releasing what the daemon held did not finish in time" in r.stderr, r.stderr
    assert not list(tmp_path.iterdir()), "the segments are unlinked (invariant 7)"


def test_disarm_without_arm_leaves_faulthandler_alone() -> None:
    """run_daemon disarms on every exit path, also those that armed nothing: pytest's own
    faulthandler timer (and any other) must survive that."""
    r = run_child("""
        import faulthandler
        import runtime.ops.backstop as backstop
        backstop._exit_later = backstop._cancel_exit = None
        faulthandler.dump_traceback_later(0.3, exit=True)
        backstop.disarm()
        hold_gil()
    """)
    assert r.returncode == 1 and "Timeout" in r.stderr, r.stderr


def test_the_line_bears_the_time_it_is_written_not_the_time_it_was_formatted() -> None:
    """Formatted when armed, written when it fires: its timestamp is the firing time."""
    from runtime.ops.backstop import rendered
    from runtime.ops.logs import TextFormatter

    logger = logging.getLogger("ringmaster.test_backstop")
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(TextFormatter("supervisor"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        # Midday on 1971-01-01 UTC: that date in the machine's time zone too.
        line = rendered(logger, "gave up", {"timeout_s": 3}, at=86400 * 365 + 43200.25)
    finally:
        logger.removeHandler(handler)
    assert line.startswith("1971-01-01") and "gave up" in line and "timeout_s=3" in line, line
