"""runtime.execution.deadletter_format: a dead letter is always writable. It goes whole when it
fits, truncated (with the original sizes in headers) when it does not, and as a reference
record when the broker refuses even that; the reason headers are never lost."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution.deadletter_format import (
    _MARGIN_BYTES,
    HEADER_PREFIX,
    MAX_MESSAGE_BYTES,
    MAX_TRACEBACK_BYTES,
    REDRIVE_COUNT,
    DeadLetter,
    dead_letter_headers,
    fit_dead_letter,
    reference_dead_letter,
)

Headers = list[tuple[str, bytes | None]]


def reason(original: Headers | None = None, *, error_type: str = "ValueError", message: str = "bad",
           traceback: str = "Traceback...", topic: str = "in", partition: int = 3,
           offset: int = 42) -> Headers:
    return dead_letter_headers(original, error_type=error_type, message=message, traceback=traceback,
                               topic=topic, partition=partition, offset=offset, attempts=2,
                               worker="worker-0.1")  # type: ignore[return-value]


def as_dict(headers: Headers) -> dict[str, bytes | None]:
    return dict(headers)


def wire_size(letter: DeadLetter) -> int:
    """What librdkafka counts against message.max.bytes, plus the module's per-header framing."""
    return len(letter.key or b"") + len(letter.value or b"") + \
        sum(len(k.encode()) + len(v or b"") + 16 for k, v in letter.headers)


# ---------------------------------------------------------------------- dead_letter_headers
def test_reason_headers_say_why_and_where_and_keep_the_original_headers_first() -> None:
    headers = reason([("app", b"1"), ("trace-id", None)])
    assert headers[:2] == [("app", b"1"), ("trace-id", None)]
    d = as_dict(headers)
    assert d[HEADER_PREFIX + "error.type"] == b"ValueError"
    assert d[HEADER_PREFIX + "error.message"] == b"bad"
    assert d[HEADER_PREFIX + "source.topic"] == b"in"
    assert d[HEADER_PREFIX + "source.partition"] == b"3"
    assert d[HEADER_PREFIX + "source.offset"] == b"42"
    assert d[HEADER_PREFIX + "attempts"] == b"2"
    assert d[HEADER_PREFIX + "worker"] == b"worker-0.1"
    assert int(d[HEADER_PREFIX + "failed_at_ms"] or b"0") > 1_600_000_000_000


def test_original_ringmaster_headers_are_replaced_not_duplicated() -> None:
    # A record that was dead-lettered once and replayed from the dead-letter topic.
    old = [("app", b"1"), (HEADER_PREFIX + "error.type", b"OldError"),
           (HEADER_PREFIX + "source.offset", b"7"), (HEADER_PREFIX + "custom", b"x")]
    headers = reason(old, error_type="NewError")
    names = [k for k, _ in headers]
    assert len(names) == len(set(names)), f"duplicated headers: {names}"
    d = as_dict(headers)
    assert d[HEADER_PREFIX + "error.type"] == b"NewError"
    assert d[HEADER_PREFIX + "source.offset"] == b"42"
    assert HEADER_PREFIX + "custom" not in d
    assert d["app"] == b"1"


def test_the_redrive_count_of_a_failing_record_is_carried_into_its_dead_letter_in_every_form() -> None:
    # A record `ringmaster redrive` sent back, failing again: its count must survive, or a
    # record that always fails would be redriven for ever (runtime/redrive/).
    original = [("app", b"1"), (REDRIVE_COUNT, b"2"), (HEADER_PREFIX + "error.type", b"Old")]
    headers = reason(original)
    assert [v for k, v in headers if k == REDRIVE_COUNT] == [b"2"]
    assert as_dict(headers)[HEADER_PREFIX + "error.type"] == b"ValueError"
    cut = fit_dead_letter(b"k", b"v" * 2_000_000, headers, 1_000_000)
    assert cut.form == "truncated" and as_dict(cut.headers)[REDRIVE_COUNT] == b"2"
    ref = reference_dead_letter(cut, "in", 3, 42)
    assert as_dict(ref.headers)[REDRIVE_COUNT] == b"2"
    assert REDRIVE_COUNT not in as_dict(reason([("app", b"1")])), "no count on a record never redriven"


def test_the_traceback_and_message_are_capped_keeping_the_end_of_the_traceback() -> None:
    tb = "start\n" + "x" * (3 * MAX_TRACEBACK_BYTES) + "\nValueError: the last line"
    d = as_dict(reason(traceback=tb, message="m" * (5 * MAX_MESSAGE_BYTES)))
    kept = d[HEADER_PREFIX + "error.traceback"] or b""
    assert len(kept) == MAX_TRACEBACK_BYTES
    assert kept.endswith(b"ValueError: the last line"), "the end of a traceback says what happened"
    assert len(d[HEADER_PREFIX + "error.message"] or b"") == MAX_MESSAGE_BYTES


def test_a_short_traceback_is_kept_whole_and_undecodable_text_does_not_fail() -> None:
    d = as_dict(reason(traceback="tb\udcff", message="\ud800m"))
    assert d[HEADER_PREFIX + "error.traceback"] == b"tb?"
    assert d[HEADER_PREFIX + "error.message"] == b"?m"


# ---------------------------------------------------------------------- fit_dead_letter
def test_a_letter_that_fits_goes_whole_and_unchanged() -> None:
    headers = reason([("app", b"1")])
    letter = fit_dead_letter(b"key", b"value" * 100, headers, 1_000_000)
    assert letter == DeadLetter(b"key", b"value" * 100, headers, "whole")


def test_a_letter_exactly_at_the_budget_is_whole_and_one_byte_more_is_truncated() -> None:
    headers = reason()
    budget = 100_000 - _MARGIN_BYTES
    head = sum(len(k.encode()) + len(v or b"") + 16 for k, v in headers)
    value = b"v" * (budget - head - 3)
    assert fit_dead_letter(b"key", value, headers, 100_000).form == "whole"
    assert fit_dead_letter(b"key", value + b"v", headers, 100_000).form == "truncated"


def test_a_value_too_large_is_cut_and_its_original_size_recorded() -> None:
    value = bytes(random.Random(1).randbytes(3_000_000))
    letter = fit_dead_letter(b"key", value, reason([("app", b"1")]), 1_000_000)
    assert letter.form == "truncated"
    d = as_dict(letter.headers)
    assert d[HEADER_PREFIX + "value.truncated"] == b"3000000"
    assert HEADER_PREFIX + "key.truncated" not in d and HEADER_PREFIX + "headers.dropped" not in d
    assert letter.key == b"key" and d["app"] == b"1"
    assert letter.value is not None and value.startswith(letter.value)
    assert len(letter.value) > 900_000, "the value keeps most of the room"
    assert wire_size(letter) <= 1_000_000 - _MARGIN_BYTES


def test_a_key_too_large_is_cut_and_its_original_size_recorded() -> None:
    key = b"K" * 2_000_000
    letter = fit_dead_letter(key, b"small", reason(), 1_000_000)
    d = as_dict(letter.headers)
    assert letter.form == "truncated"
    assert d[HEADER_PREFIX + "key.truncated"] == b"2000000"
    assert letter.key is not None and 0 < len(letter.key) < len(key) and key.startswith(letter.key)
    assert letter.value == b"small" and HEADER_PREFIX + "value.truncated" not in d
    assert wire_size(letter) <= 1_000_000 - _MARGIN_BYTES


def test_original_headers_that_do_not_fit_are_dropped_and_counted() -> None:
    original: Headers = [(f"h{i}", b"x" * 1000) for i in range(5000)]
    letter = fit_dead_letter(b"k", b"v", reason(original), 1_000_000)
    d = as_dict(letter.headers)
    kept = [(k, v) for k, v in letter.headers if not k.startswith(HEADER_PREFIX)]
    assert letter.form == "truncated"
    assert 0 < len(kept) < 5000 and kept == original[:len(kept)], "a prefix of the headers is kept"
    assert d[HEADER_PREFIX + "headers.dropped"] == str(5000 - len(kept)).encode()
    assert (letter.key, letter.value) == (b"k", b"v")
    assert d[HEADER_PREFIX + "error.type"] == b"ValueError"
    assert wire_size(letter) <= 1_000_000 - _MARGIN_BYTES


def test_a_null_key_and_value_stay_null_when_the_headers_are_cut() -> None:
    original: Headers = [(f"h{i}", b"x" * 1000) for i in range(100)]
    letter = fit_dead_letter(None, None, reason(original), 20_000)
    assert letter.form == "truncated" and letter.key is None and letter.value is None


@st.composite
def letters(draw: st.DrawFn) -> tuple[bytes | None, bytes | None, Headers, dict[str, str], int]:
    rng = random.Random(draw(st.integers(0, 2**32)))
    big = st.one_of(st.integers(0, 200), st.integers(0, 20_000), st.integers(0, 3_000_000))
    key = None if draw(st.booleans()) else rng.randbytes(draw(big))
    value = None if draw(st.integers(0, 9)) == 0 else rng.randbytes(draw(big))
    n_headers = draw(st.one_of(st.integers(0, 5), st.integers(0, 5000)))
    name_max = draw(st.sampled_from([8, 200, 5000]))
    value_max = draw(st.sampled_from([0, 50, 2000, 300_000]))
    original: Headers = []
    for i in range(n_headers):
        name = f"h{i}-" + "n" * rng.randint(0, name_max)
        original.append((name, None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, value_max))))
    facts = {"error.type": "E" * draw(st.integers(1, 60)),
             "source.topic": "t" * draw(st.integers(1, 249)),
             "source.partition": str(draw(st.integers(0, 10_000))),
             "source.offset": str(draw(st.integers(0, 2**62)))}
    headers = dead_letter_headers(
        original, error_type=facts["error.type"],
        message="m" * draw(st.integers(0, 3 * MAX_MESSAGE_BYTES)),
        traceback="t" * draw(st.integers(0, 3 * MAX_TRACEBACK_BYTES)),
        topic=facts["source.topic"], partition=int(facts["source.partition"]),
        offset=int(facts["source.offset"]), attempts=3, worker="worker-1.2")
    max_bytes = draw(st.integers(10_000, 2_000_000))
    return key, value, headers, facts, max_bytes  # type: ignore[return-value]


@settings(max_examples=150, deadline=None)
@given(letters())
def test_a_fitted_dead_letter_always_fits_and_always_says_why(
        case: tuple[bytes | None, bytes | None, Headers, dict[str, str], int]) -> None:
    key, value, headers, facts, max_bytes = case
    letter = fit_dead_letter(key, value, headers, max_bytes)
    assert wire_size(letter) <= max_bytes - _MARGIN_BYTES
    d = as_dict(letter.headers)
    for name, expected in facts.items():
        assert d.get(HEADER_PREFIX + name) == expected.encode(), f"lost or altered {name}"
    if value is None:
        assert letter.value is None
    else:
        assert letter.value is not None and value.startswith(letter.value)
    if key is None:
        assert letter.key is None
    else:
        assert letter.key is not None and key.startswith(letter.key)
    if letter.form == "whole":
        assert (letter.key, letter.value, letter.headers) == (key, value, headers)
        return
    assert letter.form == "truncated"
    if value is not None and len(letter.value or b"") < len(value):
        assert d[HEADER_PREFIX + "value.truncated"] == str(len(value)).encode()
    else:
        assert HEADER_PREFIX + "value.truncated" not in d
    if key is not None and len(letter.key or b"") < len(key):
        assert d[HEADER_PREFIX + "key.truncated"] == str(len(key)).encode()
    theirs = [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]
    kept = [(k, v) for k, v in letter.headers if not k.startswith(HEADER_PREFIX)]
    assert kept == theirs[:len(kept)]
    if len(kept) < len(theirs):
        assert d[HEADER_PREFIX + "headers.dropped"] == str(len(theirs) - len(kept)).encode()
    else:
        assert HEADER_PREFIX + "headers.dropped" not in d


# ---------------------------------------------------------------------- reference_dead_letter
def test_a_reference_letter_keeps_only_where_the_record_is_and_why_it_failed() -> None:
    original: Headers = [("app", b"1" * 10_000)]
    fitted = fit_dead_letter(b"k" * 5000, b"v" * 3_000_000,
                             reason(original, traceback="T" * MAX_TRACEBACK_BYTES), 1_000_000)
    ref = reference_dead_letter(fitted, "in", 3, 42)
    assert ref.form == "reference"
    assert ref.key == b"in/3/42" and ref.value is None
    d = as_dict(ref.headers)
    assert "app" not in d, "no original header in a reference record"
    assert all(k.startswith(HEADER_PREFIX) for k, _ in ref.headers)
    assert d[HEADER_PREFIX + "value.omitted"] == b"true"
    assert d[HEADER_PREFIX + "error.type"] == b"ValueError"
    assert (d[HEADER_PREFIX + "source.topic"], d[HEADER_PREFIX + "source.partition"],
            d[HEADER_PREFIX + "source.offset"]) == (b"in", b"3", b"42")
    assert all(len(v or b"") <= 1024 for _, v in ref.headers), "reason headers are capped too"
    assert len(d[HEADER_PREFIX + "error.traceback"] or b"") == 1024


def test_a_reference_letter_of_a_whole_letter_also_drops_the_record() -> None:
    ref = reference_dead_letter(fit_dead_letter(None, b"v", reason([("app", b"1")]), 1_000_000),
                                "orders", 0, 0)
    assert (ref.key, ref.value) == (b"orders/0/0", None)
    assert "app" not in as_dict(ref.headers)


# ---------------------------------------------------------------------- known gaps
def test_the_traceback_header_is_at_most_max_traceback_bytes_even_for_non_ascii_text() -> None:
    d = as_dict(reason(traceback="é" * (2 * MAX_TRACEBACK_BYTES), message="é" * (2 * MAX_MESSAGE_BYTES)))
    assert len(d[HEADER_PREFIX + "error.traceback"] or b"") <= MAX_TRACEBACK_BYTES
    assert len(d[HEADER_PREFIX + "error.message"] or b"") <= MAX_MESSAGE_BYTES
