"""runtime.redrive.letters and the redrive count in runtime.execution.deadletter_format: a
redriven record carries its original headers exactly plus the count; a record that fails
again keeps the count in its dead letter, in every form; the next redrive raises it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.execution.deadletter_format import (
    HEADER_PREFIX,
    REDRIVE_COUNT,
    dead_letter_headers,
    fit_dead_letter,
    reference_dead_letter,
)
from runtime.redrive.letters import (
    Form,
    Source,
    original_headers,
    read_letter,
    redrive_count,
    redriven_headers,
    stands_for,
)

Headers = list[tuple[str, bytes | None]]

names = st.one_of(st.sampled_from(["trace", "app", "", HEADER_PREFIX + "error.type", REDRIVE_COUNT,
                                   HEADER_PREFIX + "custom", "ringmaster", "Ringmaster.x"]),
                  st.text(max_size=12))
values = st.one_of(st.none(), st.binary(max_size=24))
header_lists = st.lists(st.tuples(names, values), max_size=10)


def fail(headers: Headers, offset: int = 42) -> Headers:
    """What a worker writes when a record with these headers fails."""
    return dead_letter_headers(headers, error_type="ValueError", message="m", traceback="tb", topic="in",
                               partition=3, offset=offset, attempts=2, worker="worker-0.1")


def theirs(headers: Headers | None) -> Headers:
    return [(k, v) for k, v in headers or [] if not k.startswith(HEADER_PREFIX)]


@given(header_lists, st.integers(0, 10_000))
def test_a_redriven_record_carries_the_original_headers_exactly_then_the_count(orig: Headers,
                                                                              count: int) -> None:
    sent = redriven_headers(fail(orig), count + 1)
    assert sent[:-1] == theirs(orig), "order, duplicates and null values kept; diagnostics gone"
    assert sent[-1] == (REDRIVE_COUNT, str(count + 1).encode())
    assert [k for k, _ in sent].count(REDRIVE_COUNT) == 1


@given(header_lists, st.integers(0, 10_000))
def test_a_record_that_fails_again_keeps_its_count_and_the_next_redrive_raises_it(orig: Headers,
                                                                                  count: int) -> None:
    sent = redriven_headers(fail(orig), count + 1)
    letter = read_letter(0, 7, b"k", b"v", fail(sent), (1, 1000))
    assert letter.problem is None and letter.count == count + 1
    assert original_headers(letter.headers) == theirs(orig)
    assert redriven_headers(letter.headers, letter.count + 1)[-1] == (REDRIVE_COUNT, str(count + 2).encode())


@given(st.integers(0, 99), st.integers(0, 3_000_000), st.integers(0, 200_000), st.integers(0, 3000))
def test_the_count_survives_truncated_and_reference_letters(count: int, value_size: int, key_size: int,
                                                             header_count: int) -> None:
    original = [(f"h{i}", b"x" * 50) for i in range(header_count)] + [(REDRIVE_COUNT, str(count).encode())]
    letter = fit_dead_letter(b"k" * key_size, b"v" * value_size, fail(original), 1_000_000)
    read = read_letter(0, 0, letter.key, letter.value, letter.headers, (1, 5))
    assert read.count == count and read.source == Source("in", 3, 42)
    assert read.form.value == letter.form
    ref = reference_dead_letter(letter, "in", 3, 42)
    read_ref = read_letter(0, 0, ref.key, ref.value, ref.headers, (1, 5))
    assert read_ref.count == count and read_ref.form is Form.REFERENCE
    assert read_ref.source == Source("in", 3, 42)


def test_the_last_count_wins_and_a_record_without_one_counts_zero() -> None:
    assert redrive_count([(REDRIVE_COUNT, b"1"), (REDRIVE_COUNT, b"4")]) == 4
    assert redrive_count([("app", b"1")]) == 0 and redrive_count(None) == 0
    assert redrive_count([(REDRIVE_COUNT, b"-1")]) is None and redrive_count([(REDRIVE_COUNT, b"x")]) is None
    h = fail([(REDRIVE_COUNT, b"1"), (REDRIVE_COUNT, b"4")])
    assert [v for k, v in h if k == REDRIVE_COUNT] == [b"4"], "one count in a dead letter"


def test_what_is_not_a_readable_dead_letter_says_why() -> None:
    plain = read_letter(0, 1, b"k", b"v", [("app", b"1")], (1, 99))
    assert plain.problem is not None and plain.source is None
    bad_offset = [(k, b"x" if k.endswith("source.offset") else v) for k, v in fail([])]
    assert read_letter(0, 1, b"k", b"v", bad_offset, (1, 99)).problem is not None
    bad_count = [*fail([]), (REDRIVE_COUNT, b"lots")]
    assert "redrive.count" in (read_letter(0, 1, b"k", b"v", bad_count, (1, 99)).problem or "")


def test_when_a_letter_failed_is_its_header_else_its_timestamp() -> None:
    h = [(k, b"1234" if k.endswith("failed_at_ms") else v) for k, v in fail([])]
    assert read_letter(0, 0, None, None, h, (1, 99)).when_ms == 1234
    without = [(k, v) for k, v in fail([]) if not k.endswith("failed_at_ms")]
    assert read_letter(0, 0, None, None, without, (1, 99)).when_ms == 99
    assert read_letter(0, 0, None, None, without, (0, -1)).when_ms is None


def test_a_truncated_letter_stands_for_its_source_record_only_if_sizes_and_prefixes_match() -> None:
    value, key = b"V" * 5000 + b"end", b"K" * 10
    cut = fit_dead_letter(key, value, fail([("a", b"1")]), 2048)
    letter = read_letter(0, 0, cut.key, cut.value, cut.headers, (1, 1))
    assert letter.form is Form.TRUNCATED
    assert stands_for(letter, key, value)
    assert not stands_for(letter, key, value + b"x"), "another size"
    assert not stands_for(letter, key, b"W" + value[1:]), "another prefix"
    assert not stands_for(letter, b"other", value), "the key was kept whole: it must be equal"
    assert not stands_for(letter, None, value)
    whole = read_letter(0, 0, b"k", b"v", fail([]), (1, 1))
    assert whole.form is Form.WHOLE and stands_for(whole, b"anything", None)


# ---------------------------------------------------------------------- bounded fields (issue 29)
def _with(name: str, raw: bytes) -> Headers:
    return [(k, v) for k, v in fail([]) if k != name] + [(name, raw)]


@pytest.mark.parametrize(("name", "raw", "says"), [
    (REDRIVE_COUNT, b"9" * 5000, "redrive.count"),
    (REDRIVE_COUNT, str(2**31).encode(), "redrive.count"),
    (REDRIVE_COUNT, b"+1", "redrive.count"),
    (REDRIVE_COUNT, "\u0661".encode(), "redrive.count"),  # an Arabic-Indic one: a digit to str.isdigit
    (HEADER_PREFIX + "source.partition", str(2**32).encode(), "source.partition"),
    (HEADER_PREFIX + "source.partition", str(2**31).encode(), "source.partition"),
    (HEADER_PREFIX + "source.partition", b"-1", "source.partition"),
    (HEADER_PREFIX + "source.offset", b"9" * 5000, "source.offset"),
    (HEADER_PREFIX + "source.offset", str(2**63).encode(), "source.offset"),
    (HEADER_PREFIX + "source.offset", b"007", "source.offset"),
    (HEADER_PREFIX + "source.topic", b"no such topic!", "source.topic"),
    (HEADER_PREFIX + "source.topic", b"t" * 250, "source.topic"),
    (HEADER_PREFIX + "failed_at_ms", b"9" * 5000, "failed_at_ms"),
    (HEADER_PREFIX + "value.truncated", b"9" * 5000, "value.truncated"),
])
def test_a_header_out_of_its_bounds_makes_the_letter_malformed_naming_it(name: str, raw: bytes,
                                                                          says: str) -> None:
    letter = read_letter(0, 1, b"k", b"v", _with(name, raw), (1, 99))
    assert letter.malformed and letter.problem is not None and says in letter.problem
    assert len(letter.problem) < 200, "the problem is one short line, whatever the header held"
    src = letter.source
    assert src is None or (0 <= src.partition < 2**31 and 0 <= src.offset < 2**63)
    assert 0 <= letter.count < 2**31


@pytest.mark.parametrize(("name", "raw"), [
    (REDRIVE_COUNT, str(2**31 - 1).encode()),
    (HEADER_PREFIX + "source.partition", str(2**31 - 1).encode()),
    (HEADER_PREFIX + "source.offset", str(2**63 - 1).encode()),
    (HEADER_PREFIX + "source.topic", b"a.b_c-D9" + b"x" * 241),
])
def test_a_header_at_its_bound_is_read(name: str, raw: bytes) -> None:
    letter = read_letter(0, 1, b"k", b"v", _with(name, raw), (1, 99))
    assert letter.problem is None and not letter.malformed


def test_a_long_error_type_is_cut_not_refused() -> None:
    letter = read_letter(0, 1, b"k", b"v", _with(HEADER_PREFIX + "error.type", b"E" * 100_000), (1, 99))
    assert letter.problem is None and len(letter.error_type) == 256
