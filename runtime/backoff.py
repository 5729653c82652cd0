"""The one exponential back-off: every wait that grows with failures in a row (a worker's
restarts, a plugin's retries and Backoffs, an outage, a dead letter that was not delivered)
is computed here, so they all double the same way, all stop growing somewhere, and all carry
jitter. Runs in: every process.

Jitter: many hosts (or the workers of one) that failed together at a downstream's outage
would otherwise retry it in step, each doubling, and hit it together as it recovers. Every
wait is drawn at random, AWS's "equal jitter": between half and all of the nominal wait
(``base_s`` doubled, capped), so retries spread over half the wait while a wait never falls
below half of what is configured. A plugin's ``Backoff(seconds)`` is a floor the plugin asked
for (a Retry-After), so its jitter goes the other way: between the wait and 1.5 times it
(``jitter_up``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

# An exponent past this is as good as infinite against any cap, and 2 ** n for a huge n (a
# count that kept growing for days) must not make a float overflow.
_MAX_EXPONENT = 60

JITTER = 0.5  # the share of the nominal wait drawn at random

# The source of jitter: a uniform float in [0, 1). Module state on purpose, so that every
# back-off in a process draws from it and a test replaces it with a seeded one
# (tests/unit/test_backoff.py) instead of every caller threading an RNG through.
random_fraction: Callable[[], float] = random.Random().random


def nominal_s(base_s: float, failures_before: int, cap_s: float | None = None,
              max_doublings: int = _MAX_EXPONENT) -> float:
    """``base_s`` after the first failure, doubled for each failure before it, at most
    ``max_doublings`` times and at most ``cap_s``: the wait before jitter."""
    # typeshed makes int ** int Any (a negative exponent gives a float); this one is >= 0.
    factor: int = 2 ** min(max(failures_before, 0), max_doublings, _MAX_EXPONENT)
    wait = base_s * factor
    return wait if cap_s is None else min(wait, cap_s)


def backoff_s(base_s: float, failures_before: int, cap_s: float | None = None,
              max_doublings: int = _MAX_EXPONENT, jitter_up: bool = False) -> float:
    """The wait after ``failures_before + 1`` failures in a row: the nominal wait
    (``nominal_s``) with jitter, between ``1 - JITTER`` and all of it (never above ``cap_s``),
    or with ``jitter_up`` between all of it and ``1 + JITTER`` times it."""
    wait = nominal_s(base_s, failures_before, cap_s, max_doublings)
    share = JITTER * random_fraction()
    return wait * (1 + share) if jitter_up else wait * (1 - share)
