"""The one exponential back-off (runtime/backoff.py) every retrying path uses."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.backoff import backoff_s
from runtime.plugin import backoff_wait


def test_the_first_wait_is_the_base_and_each_failure_doubles_it_up_to_the_cap() -> None:
    assert [backoff_s(0.5, n, cap_s=5.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert backoff_s(0.5, -3) == 0.5, "no failure before: the base"


@given(base=st.floats(0.001, 100.0), n=st.integers(0, 10**9), cap=st.floats(0.001, 1e6))
def test_waits_never_shrink_never_pass_the_cap_and_never_overflow(base: float, n: int, cap: float) -> None:
    wait = backoff_s(base, n, cap_s=cap)
    assert wait <= cap and backoff_s(base, n + 1, cap_s=cap) >= wait


def test_a_plugins_backoff_doubles_at_most_six_times() -> None:
    assert backoff_wait(1.0, 0) == 1.0 and backoff_wait(1.0, 6) == 64.0 and backoff_wait(1.0, 500) == 64.0
