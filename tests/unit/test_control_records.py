"""runtime.ops.control_records: every value of every control record is read strictly at the
edge. A record is a valid pause or resume, or InvalidControlRecord naming what is wrong;
nothing else ever comes out of it (no OverflowError, no OSError), and whatever a valid
record holds can be described and shown in bounded space."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import ConfigError, InvalidControlRecord
from runtime.ops.control_records import (
    ALL,
    MAX_BY_BYTES,
    MAX_MS,
    MAX_REASON_BYTES,
    MAX_VALUE_BYTES,
    Pause,
    check_reason,
    iso,
    parse_duration,
    parse_record,
    parse_scope,
    pause_record,
)


def value(**fields: Any) -> bytes:
    return json.dumps(fields, ensure_ascii=False).encode()


# ---------------------------------------------------------------------------- valid records
def test_a_pause_as_ringmaster_pause_writes_it_is_read_back_whole() -> None:
    p = pause_record("topic:events", "deploying v2", "root@vm", 1_700_000_000_000, 600)
    key, val = p.record()
    assert parse_record(key, val) == p
    assert p.until_ms == 1_700_000_600_000


def test_only_paused_is_required_and_unknown_fields_are_ignored() -> None:
    p = parse_record(b"*", b'{"paused": true, "colour": "blue", "scope": "topic:other"}')
    assert p == Pause(ALL, True), "the key names the scope, never the value"


def test_a_tombstone_resumes_its_scope() -> None:
    assert parse_record(b"partition:events:3", None) == Pause("partition:events:3", False)


def test_long_texts_are_cut_to_their_caps_not_refused() -> None:
    """A pause written with a long reason (an older version wrote any) stays a pause."""
    raw = value(paused=True, reason="é" * 450_000, by="x" * 10_000)
    assert len(raw) > 900_000
    p = parse_record(b"*", raw)
    assert p.paused
    assert len(p.reason.encode()) <= MAX_REASON_BYTES and p.reason.endswith("…")
    assert len(p.by.encode()) <= MAX_BY_BYTES
    assert len(p.describe()) < 300, "one line per partition in status: short"


def test_control_characters_in_texts_are_replaced() -> None:
    p = parse_record(b"*", value(paused=True, reason="line1\nline2\x1b[31mred\u202eevil", by="a\x00b"))
    assert p.reason == "line1 line2\ufffd[31mred\ufffdevil" and p.by == "a\ufffdb"


def test_the_extreme_times_in_range_are_described() -> None:
    p = parse_record(b"*", value(paused=True, at_ms=0, until_ms=MAX_MS))
    assert "9999-12-31T23:59:59Z" in p.describe() and "1970-01-01T00:00:00Z" in p.describe()


@pytest.mark.parametrize("key", [b"*", b"topic:events", b"topic:a.b_c-D9", b"partition:events:0",
                                 b"partition:events:2147483647", b"partition:t:12",
                                 b"topic:" + b"x" * 249])
def test_scope_forms_that_are_valid(key: bytes) -> None:
    assert parse_scope(key) == key.decode()


# ---------------------------------------------------------------------------- invalid records
BAD_VALUES = {
    "until_ms 1e400": (b'{"paused": true, "until_ms": 1e400}', "until_ms"),
    "until_ms 1e20 (a float)": (b'{"paused": true, "until_ms": 1e20}', "until_ms"),
    "until_ms 10**20": (b'{"paused": true, "until_ms": 100000000000000000000}', "until_ms"),
    "until_ms 5000 digits": (b'{"paused": true, "until_ms": ' + b"9" * 5000 + b"}", "value"),
    "until_ms negative": (b'{"paused": true, "until_ms": -1}', "until_ms"),
    "until_ms a string": (b'{"paused": true, "until_ms": "soon"}', "until_ms"),
    "until_ms NaN": (b'{"paused": true, "until_ms": NaN}', "until_ms"),
    "at_ms a float": (b'{"paused": true, "at_ms": 1700000000000.5}', "at_ms"),
    "at_ms past year 9999": (value(paused=True, at_ms=MAX_MS + 1), "at_ms"),
    "at_ms true": (b'{"paused": true, "at_ms": true}', "at_ms"),
    "paused the string false": (b'{"paused": "false"}', "paused"),
    "paused 0": (b'{"paused": 0}', "paused"),
    "paused null": (b'{"paused": null}', "paused"),
    "paused missing": (b'{"reason": "x"}', "paused"),
    "reason a number": (b'{"paused": true, "reason": 5}', "reason"),
    "by a list": (b'{"paused": true, "by": ["a"]}', "by"),
    "not JSON": (b"\xff\xfe garbage", "value"),
    "empty": (b"", "value"),
    "a JSON array": (b"[true]", "value"),
    "a JSON string": (b'"paused"', "value"),
    "JSON null": (b"null", "value"),
    "nested 100k deep": (b"[" * 100_000, "value"),
    "larger than the cap": (b'{"paused": true, "reason": "' + b"x" * MAX_VALUE_BYTES + b'"}', "value"),
}


@pytest.mark.parametrize("name", list(BAD_VALUES))
def test_a_value_that_is_not_a_pause_is_refused_with_what_is_wrong(name: str) -> None:
    raw, kind = BAD_VALUES[name]
    with pytest.raises(InvalidControlRecord) as info:
        parse_record(b"*", raw)
    assert info.value.kind == kind
    assert len(str(info.value)) < 300, "the problem is one short line, whatever the record held"


BAD_KEYS = [None, b"", b"\xff\xfe", b"bogus", b"*x", b"topic:", b"topic:a b", b"topic:" + b"x" * 250,
            b"partition:t", b"partition:t:", b"partition::1", b"partition:t:-1", b"partition:t:01",
            b"partition:t:2147483648", b"partition:t:1e3", b"partition:t:\xd9\xa3", b"x" * 600]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_key_that_is_not_a_scope_is_refused(key: bytes | None) -> None:
    with pytest.raises(InvalidControlRecord) as info:
        parse_record(key, b'{"paused": true}')
    assert info.value.kind == "key"
    with pytest.raises(InvalidControlRecord):
        parse_record(key, None)  # a tombstone too: it names nothing


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([b"*", b"topic:t", b"partition:t:1"])),
       st.one_of(st.none(), st.binary(max_size=200),
                 st.dictionaries(st.sampled_from(["paused", "reason", "by", "at_ms", "until_ms", "x"]),
                                 st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                                           st.text(max_size=30)), max_size=6).map(
                     lambda d: json.dumps(d).encode())))
def test_any_bytes_give_a_pause_or_an_invalid_record_never_another_error(key: bytes | None,
                                                                         raw: bytes | None) -> None:
    try:
        p = parse_record(key, raw)
    except InvalidControlRecord:
        return
    p.describe()
    p.provenance()
    assert parse_record(*p.record()) == p, "what is read can be written back as it is"


@pytest.mark.parametrize("ms", [-(10**30), -1, 0, MAX_MS, 10**17, 10**30])
def test_describe_never_raises_whatever_a_pause_was_built_with(ms: int) -> None:
    Pause(ALL, True, "r", "b", ms, ms).describe()
    assert iso(ms)


# ---------------------------------------------------------------------------- what the CLI writes
@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("2h", 7200), ("1d", 86400),
                                           ("1s", 1), ("366d", 366 * 86400), (" 1.5 h ", 5400)])
def test_durations_in_bounds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0", "0.5s", "367d", "1000000000000d", "9" * 400, "1y", "-5s", "",
                                  "abc"])
def test_durations_out_of_bounds_or_malformed_are_one_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_duration(text)
    assert "--for" in str(info.value)


def test_a_reason_is_one_line_of_at_most_1_kib() -> None:
    assert check_reason("deploying v2 — see INC-42") == "deploying v2 — see INC-42"
    for bad in ("x" * (MAX_REASON_BYTES + 1), "é" * 513, "two\nlines", "bell\x07"):
        with pytest.raises(ConfigError):
            check_reason(bad)


def test_the_message_without_a_reason_reads_naturally() -> None:
    p = Pause(ALL, True, "", "root@vm", 0)
    assert p.describe() == "paused by root@vm since 1970-01-01T00:00:00Z"
    assert Pause(ALL, True, "deploy", "root@vm", 0).describe() == \
        "deploy (paused by root@vm since 1970-01-01T00:00:00Z)"
    assert Pause(ALL, False, "resumed", "me@h", 0).describe() == "resumed by me@h at 1970-01-01T00:00:00Z"
    assert Pause(ALL, True).describe() == "paused"
