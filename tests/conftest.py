from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests", ROOT / "tests" / "plugins"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from helpers import shm_segments, topic_names  # noqa: E402

from runtime.devbroker import DevBroker  # noqa: E402


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    """One memory-only Tansu broker per test session on a free loopback port."""
    log = tmp_path_factory.mktemp("broker") / "tansu.log"
    with DevBroker(log_path=log) as b:
        yield b


@pytest.fixture
def names() -> dict[str, str]:
    """Fresh topic and group names: in, out, dlq, group."""
    return topic_names()


@pytest.fixture(autouse=True)
def no_leftovers(request: pytest.FixtureRequest) -> Iterator[None]:
    """Invariant 7 around every test: no shared-memory segment and no child process of
    this test session survives the test."""
    before = set(shm_segments())
    yield
    stray = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE or "tansu" in " ".join(c.cmdline()):
                continue
            stray.append(f"{c.pid} {' '.join(c.cmdline())[:120]}")
            c.kill()
        except psutil.NoSuchProcess:
            continue
    new_shm = sorted(set(shm_segments()) - before)
    assert not new_shm, f"shared memory left behind: {new_shm}"
    assert not stray, f"processes left behind: {stray}"
