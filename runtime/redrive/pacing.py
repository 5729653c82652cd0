"""The token bucket behind ``--rate``: records per second, in bursts of at most a tenth of a
second's worth (one record at least), so a redrive never floods a recovering downstream.

Pure: the clock is injected, and the caller does the waiting (runtime/redrive/engine.py
waits so that a stop signal ends the wait). Runs in: the CLI.
"""

from __future__ import annotations

from collections.abc import Callable


class TokenBucket:
    def __init__(self, rate_per_s: float, clock: Callable[[], float], burst: float | None = None) -> None:
        if not rate_per_s > 0:
            raise ValueError(f"rate must be > 0, not {rate_per_s!r}")
        self.rate = float(rate_per_s)
        self.burst = max(1.0, self.rate / 10) if burst is None else max(1.0, burst)
        self._clock = clock
        self._tokens = self.burst
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now

    def delay(self) -> float:
        """Seconds until a record may go (0.0: now)."""
        self._refill()
        # A wait of exactly the delay must make the record go, whatever the rounding.
        return 0.0 if self._tokens >= 1.0 - 1e-9 else (1.0 - self._tokens) / self.rate

    def take(self) -> None:
        """One record goes now (call when delay() is 0)."""
        self._refill()
        self._tokens -= 1.0
