"""Unit tests see back-offs without jitter: each component's tests check its doubling and cap
against exact waits on a fake clock. The jitter itself (runtime/backoff.py) is tested with a
seeded source in test_backoff.py, which replaces this one."""

from __future__ import annotations

import pytest

from runtime import backoff


@pytest.fixture(autouse=True)
def _no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backoff, "random_fraction", lambda: 0.0)
