from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import settings

# No time limit per hypothesis example: a deadline is a timed assertion, and on a loaded 2-core
# machine a fitted 1.5 MB dead letter takes longer than 200 ms now and then. What each example
# must hold is asserted; how fast it runs is the benchmarks' business.
settings.register_profile("ringmaster", deadline=None)
settings.load_profile("ringmaster")

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "tests" / "plugins"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from helpers import (  # noqa: E402
    SHM_DIR,
    SOCK_DIR,
    TEST_BROKER,
    Broker,
    is_broker_process,
    new_broker,
    proxied_broker,
    shm_segments,
    sweep_dead_sessions,
    topic_names,
)
from proxy import Proxy  # noqa: E402


def pytest_report_header() -> str:
    return f"broker: {TEST_BROKER} (RINGMASTER_TEST_BROKER)"


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker per test session on a free loopback port: Tansu (memory-only), or Apache
    Kafka with RINGMASTER_TEST_BROKER=kafka (its log dir removed at the end)."""
    log = tmp_path_factory.mktemp("broker") / f"{TEST_BROKER}.log"
    with new_broker(log_path=log) as b:
        yield b


# Segments no test is to blame for: there at the session's start (none: the directory is the
# session's own), or blamed already on the test that left them (one leak fails one test).
_KNOWN_SHM: set[str] = set()


def pytest_sessionstart(session: pytest.Session) -> None:
    """The baseline of no_leftovers, taken before any fixture: session fixtures (the fault
    matrix, chaos) run their daemons before the first test's own snapshot would be taken.
    What sessions killed before their end left behind goes first."""
    sweep_dead_sessions()
    _KNOWN_SHM.update(shm_segments())


@pytest.fixture(scope="session", autouse=True)
def private_shm_dir() -> Iterator[None]:
    """The session's own segment directory (tests/helpers.py) is empty at the end, and goes.
    Made again at the start: a process may run more than one session (mutmut does)."""
    SHM_DIR.mkdir(mode=0o700, exist_ok=True)
    SOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    yield
    left = sorted(str(p.relative_to(SHM_DIR)) for p in SHM_DIR.rglob("*"))
    shutil.rmtree(SHM_DIR, ignore_errors=True)
    shutil.rmtree(SOCK_DIR, ignore_errors=True)  # with the sockets of daemons a test SIGKILLed
    assert not left, f"shared memory left behind by the session: {left}"


@pytest.fixture
def names() -> dict[str, str]:
    """Fresh topic and group names: in, out, dlq, group."""
    return topic_names()


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Invariant 7 around every test: no shared-memory segment and no child process of
    this test session survives the test. Segments are compared with the session's baseline,
    not with a snapshot taken after the session fixtures started."""
    yield
    stray = []
    for c in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
            # The broker and this process's own resource tracker live for the whole session.
            if c.status() == psutil.STATUS_ZOMBIE or is_broker_process(cmd) or "resource_tracker" in cmd:
                continue
            stray.append(f"{c.pid} {cmd[:120]}")
            c.kill()
        except psutil.NoSuchProcess:
            continue
    new_shm = sorted(set(shm_segments()) - _KNOWN_SHM)
    _KNOWN_SHM.update(new_shm)
    assert not new_shm, f"shared memory left behind: {new_shm}"
    assert not stray, f"processes left behind: {stray}"


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[Broker, Proxy]]:
    """A broker of this test's own (of the session's kind) behind a TCP proxy the test can
    cut (tests/proxy.py): an outage without touching the session's broker."""
    with proxied_broker(tmp_path) as (broker, proxy):
        yield broker, proxy


def pytest_sessionfinish(session: pytest.Session) -> None:
    """After every fixture's teardown: nothing this session started is still running (the
    broker's JVM included), whichever test or fixture forgot it."""
    stray = []
    for c in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(c.cmdline())
            if c.status() == psutil.STATUS_ZOMBIE or "resource_tracker" in cmd:
                continue
            stray.append(f"{c.pid} {cmd[:120]}")
            c.kill()
        except psutil.NoSuchProcess:
            continue
    if stray:
        sys.stderr.write(f"processes left behind by the session: {stray}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # A session that ran no test (--collect-only, nothing selected) made its directories when
    # helpers.py was imported and never ran private_shm_dir, which removes them: an empty one
    # goes here (anything in one is that fixture's to report).
    for d in (SHM_DIR, SOCK_DIR):
        with contextlib.suppress(OSError):
            d.rmdir()
