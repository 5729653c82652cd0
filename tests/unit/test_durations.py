"""The one duration grammar (runtime/durations.py), and that every option and setting taking
a span of time reads it: ``pause --for``, ``redrive --from``/``--to``, ``spark.trigger``."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from runtime.config import SparkSettings
from runtime.durations import is_duration, parse_duration
from runtime.errors import ConfigError
from runtime.ops.control_records import parse_duration as pause_for
from runtime.redrive.selection import TimeBound, parse_bound

GOOD = [("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("2h", 7200.0), ("1d", 86400.0), ("1w", 604800.0),
        ("1h30m", 5400.0), ("1h 30m", 5400.0), ("1.5h", 5400.0), ("500ms", 0.5), ("1m500ms", 60.5),
        ("5 seconds", 5.0), ("1 minute 30 seconds", 90.0), ("2 hours", 7200.0), ("3 days", 259200.0),
        ("1 week", 604800.0), ("10 min", 600.0), ("10MIN", 600.0), (" 1.5 h ", 5400.0), ("1w2d", 777600.0)]


@pytest.mark.parametrize("text, seconds", GOOD)
def test_a_duration_is_terms_of_a_number_and_a_unit_summed(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", " ", "abc", "1y", "-5s", "5 s s", "h", "1h30", "1.h", "5 secondsx",
                                  "1e3s", "1h,30m", "9" * 400 + "w"])
def test_anything_else_is_one_value_error_naming_the_grammar(text: str) -> None:
    with pytest.raises(ValueError, match=r"duration"):
        parse_duration(text)


def test_a_bare_number_is_seconds_but_not_a_time_ago_where_offsets_are_taken() -> None:
    assert parse_duration("42") == 42.0 and not is_duration("42") and is_duration("42s")


@pytest.mark.parametrize("text, seconds", [t for t in GOOD if 1 <= t[1] <= 366 * 86400])
def test_pause_for_takes_every_duration_the_grammar_takes(text: str, seconds: float) -> None:
    assert pause_for(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, seconds", [t for t in GOOD if not t[0].strip().isdigit()])
def test_redrive_from_takes_every_duration_as_a_time_ago(text: str, seconds: float) -> None:
    assert parse_bound(text, "--from", 10**13) == TimeBound(int(10**13 - seconds * 1000))


@pytest.mark.parametrize("text, seconds", [t for t in GOOD if t[1] > 0])
def test_the_spark_trigger_takes_every_duration_and_gives_spark_milliseconds(text: str,
                                                                              seconds: float) -> None:
    assert SparkSettings(trigger=text).trigger_ms() == max(1, round(seconds * 1000))
    assert SparkSettings(trigger="availableNow").trigger_ms() is None


@pytest.mark.parametrize("text", ["1y", "0s", "soon"])
def test_a_bad_trigger_is_refused_at_load(text: str) -> None:
    with pytest.raises(ValidationError, match="availableNow"):
        SparkSettings(trigger=text)


def test_the_bad_forms_are_refused_alike_by_pause_and_redrive() -> None:
    for bad in ("1y", "1h30", "abc"):
        with pytest.raises(ConfigError, match="--for"):
            pause_for(bad)
        with pytest.raises(ConfigError, match="--from"):
            parse_bound(bad, "--from", 10**13)
