"""The one duration grammar: every option and setting that takes a span of time
(``pause --for``, ``redrive --from``/``--to`` as a time ago, ``spark.trigger``) reads it
here, so what one accepts the others accept.

A duration is one or more ``<number><unit>`` terms, optionally separated by spaces, summed:
``90s``, ``10m``, ``1h30m``, ``1.5h``, ``2d``, ``1w``, ``500ms``, ``5 seconds``,
``1 minute 30 seconds``. Units: ``ms``; ``s``, ``sec``, ``second(s)``; ``m``, ``min``,
``minute(s)``; ``h``, ``hour(s)``; ``d``, ``day(s)``; ``w``, ``week(s)``. A bare number is
seconds. Runs in: every process (pure; raises ValueError, which each caller turns into its
own one-line error).
"""

from __future__ import annotations

import math
import re

UNIT_S: dict[str, float] = {
    "ms": 0.001, "millisecond": 0.001, "milliseconds": 0.001,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}
# Longest first, so that "ms" is not read as "m" followed by garbage, nor "min" as "m".
_UNITS = "|".join(sorted(UNIT_S, key=len, reverse=True))
_TERM = re.compile(rf"\s*(\d+(?:\.\d+)?)\s*({_UNITS})(?![a-z])", re.IGNORECASE)
_BARE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*")

EXAMPLES = "90s, 10m, 1h30m, 2d, 1w"


def parse_duration(text: str) -> float:
    """``text`` in seconds; ValueError (saying what is expected) when it is not a duration."""
    bare = _BARE.fullmatch(text)
    if bare:
        return _finite(float(bare.group(1)))
    pos, total, terms = 0, 0.0, 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None:
            if text[pos:].strip() == "" and terms:
                break
            raise ValueError(f"expected a duration like {EXAMPLES} (units ms, s, m, h, d, w)")
        total += float(m.group(1)) * UNIT_S[m.group(2).lower()]
        pos, terms = m.end(), terms + 1
    if not terms:
        raise ValueError(f"expected a duration like {EXAMPLES} (units ms, s, m, h, d, w)")
    return _finite(total)


def _finite(seconds: float) -> float:
    # 400 nines parse as a float of inf: no caller could use it (int(inf) raises)
    if not math.isfinite(seconds):
        raise ValueError("the duration is too long to be meant")
    return seconds


def is_duration(text: str) -> bool:
    """Whether ``text`` reads as a duration (with a unit: a bare number is not taken here, as
    callers that also take offsets read a bare number as one)."""
    if _BARE.fullmatch(text):
        return False
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True
