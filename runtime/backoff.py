"""The one exponential back-off: every wait that grows with failures in a row (a worker's
restarts, a plugin's retries and Backoffs, an outage, a dead letter that was not delivered)
is computed here, so they all double the same way and all stop growing somewhere. Runs in:
every process."""

from __future__ import annotations

# An exponent past this is as good as infinite against any cap, and 2 ** n for a huge n (a
# count that kept growing for days) must not make a float overflow.
_MAX_EXPONENT = 60


def backoff_s(base_s: float, failures_before: int, cap_s: float | None = None,
              max_doublings: int = _MAX_EXPONENT) -> float:
    """``base_s`` after the first failure, doubled for each failure before it, at most
    ``max_doublings`` times and at most ``cap_s``."""
    # typeshed makes int ** int Any (a negative exponent gives a float); this one is >= 0.
    factor: int = 2 ** min(max(failures_before, 0), max_doublings, _MAX_EXPONENT)
    wait = base_s * factor
    return wait if cap_s is None else min(wait, cap_s)
