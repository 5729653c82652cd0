"""The one exponential back-off (runtime/backoff.py) every retrying path uses, and its jitter."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import backoff
from runtime.backoff import backoff_s, nominal_s
from runtime.plugin import backoff_wait


@pytest.fixture
def seeded(monkeypatch: pytest.MonkeyPatch) -> Iterator[random.Random]:
    rng = random.Random(28)
    monkeypatch.setattr(backoff, "random_fraction", rng.random)
    yield rng


def test_the_first_wait_is_the_base_and_each_failure_doubles_it_up_to_the_cap() -> None:
    assert [nominal_s(0.5, n, cap_s=5.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert nominal_s(0.5, -3) == 0.5, "no failure before: the base"


@given(base=st.floats(0.001, 100.0), n=st.integers(0, 10**9), cap=st.floats(0.001, 1e6))
def test_waits_never_shrink_never_pass_the_cap_and_never_overflow(base: float, n: int, cap: float) -> None:
    wait = nominal_s(base, n, cap_s=cap)
    assert wait <= cap and nominal_s(base, n + 1, cap_s=cap) >= wait
    jittered = backoff_s(base, n, cap_s=cap)
    assert wait / 2 <= jittered <= wait <= cap


def test_a_plugins_backoff_doubles_at_most_six_times_and_never_waits_less_than_asked(
        seeded: random.Random) -> None:
    for n, nominal in ((0, 1.0), (6, 64.0), (500, 64.0)):
        waits = [backoff_wait(1.0, n) for _ in range(200)]
        assert all(nominal <= w <= nominal * 1.5 for w in waits)
        assert max(waits) - min(waits) > nominal * 0.4, "spread over the half above the wait"


def test_every_wait_is_drawn_between_half_and_all_of_the_nominal_one(seeded: random.Random) -> None:
    waits = [backoff_s(1.0, 3, cap_s=100.0) for _ in range(1000)]
    assert all(4.0 <= w <= 8.0 for w in waits)
    # spread over the whole half-range: hosts that failed together do not retry in step
    assert min(waits) < 4.2 and max(waits) > 7.8
    assert len({round(w, 6) for w in waits}) > 900


def test_jitter_is_the_seeded_source_so_a_run_can_be_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    def draws(seed: int) -> list[float]:
        monkeypatch.setattr(backoff, "random_fraction", random.Random(seed).random)
        return [backoff_s(0.2, n, 30.0) for n in range(10)]

    assert draws(1) == draws(1) != draws(2)


def test_the_worst_draws_are_the_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backoff, "random_fraction", lambda: 0.0)
    assert backoff_s(2.0, 1) == 4.0 and backoff_wait(2.0, 1) == 4.0
    monkeypatch.setattr(backoff, "random_fraction", lambda: 0.999999)
    assert backoff_s(2.0, 1) == pytest.approx(2.0, abs=1e-5)
    assert backoff_wait(2.0, 1) == pytest.approx(6.0, abs=1e-5)
