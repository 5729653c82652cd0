"""The redrive's pure rules: --from/--to parsing, what a letter's verdict is and in which order
the reasons apply, the token bucket behind --rate, the ledger that says what may be committed."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import ConfigError
from runtime.execution.deadletter_format import REDRIVE_COUNT, dead_letter_headers
from runtime.redrive.ledger import Ledger
from runtime.redrive.letters import read_letter
from runtime.redrive.pacing import TokenBucket
from runtime.redrive.selection import OffsetBound, Selection, Skip, Stop, TimeBound, parse_bound

NOW = 1_800_000_000_000
UTC14 = int(datetime(2026, 11, 21, 14, tzinfo=UTC).timestamp() * 1000)


# ---------------------------------------------------------------------- --from / --to
@pytest.mark.parametrize(("text", "bound"), [
    ("0", OffsetBound(every=0)),
    (" 1200 ", OffsetBound(every=1200)),
    ("0:1200,3:80", OffsetBound(partitions={0: 1200, 3: 80})),
    ("90s", TimeBound(NOW - 90_000)),
    ("15m", TimeBound(NOW - 900_000)),
    ("2h", TimeBound(NOW - 7_200_000)),
    ("1h30m", TimeBound(NOW - 5_400_000)),
    ("1d", TimeBound(NOW - 86_400_000)),
    ("1w", TimeBound(NOW - 604_800_000)),
    ("250ms", TimeBound(NOW - 250)),
    ("2026-11-21T14:00:00Z", TimeBound(UTC14)),
    ("2026-11-21T16:00:00+02:00", TimeBound(UTC14)),
])
def test_bounds_are_offsets_offsets_per_partition_times_ago_or_iso_times(text: str, bound: object) -> None:
    assert parse_bound(text, "--from", NOW) == bound


def test_an_iso_time_without_a_zone_is_local_time() -> None:
    local = datetime(2026, 11, 21, 14, 0).astimezone()
    assert parse_bound("2026-11-21T14:00:00", "--to", NOW) == TimeBound(int(local.timestamp() * 1000))


@pytest.mark.parametrize("text", ["", "-5", "yesterday", "2h ago", "1:2,1:3", "1:", "12x", "2026-13-01"])
def test_a_bound_that_means_nothing_is_one_error_naming_the_option_and_the_forms(text: str) -> None:
    with pytest.raises(ConfigError, match="--to") as info:
        parse_bound(text, "--to", NOW)
    assert "ISO-8601" in str(info.value) or "twice" in str(info.value)


@pytest.mark.parametrize(("text", "says"), [
    ("9" * 5000, "not an offset"),  # more digits than int() takes (issue 29)
    (str(2**63), "not an offset"),
    (str(2**63 - 1) + "0", "not an offset"),
    ("007", "not an offset"),
    ("\u0661\u0662", "ISO-8601"),  # Arabic-Indic digits: \d and int() take them, Kafka does not
    (f"{2**31}:5", "not a partition"),
    ("0:" + "9" * 5000, "not an offset"),
    ("9" * 5000 + "s", "ISO-8601"),  # a duration longer than the regex takes
    ("999999999999w", "before 1970"),
    ("0001-01-01T00:00:00Z", "between 1970 and 9999"),
    ("x" * 100_000, "characters"),
])
def test_a_bound_out_of_range_is_one_short_config_error_not_a_crash(text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="--from") as info:
        parse_bound(text, "--from", NOW)
    assert says in str(info.value) and len(str(info.value)) < 300


def test_the_largest_bounds_are_taken() -> None:
    assert parse_bound(str(2**63 - 1), "--to", NOW) == OffsetBound(every=2**63 - 1)
    assert parse_bound(f"{2**31 - 1}:0", "--to", NOW) == OffsetBound(partitions={2**31 - 1: 0})


def test_an_offset_bound_per_partition_applies_to_those_partitions_only() -> None:
    b = OffsetBound(partitions={1: 10})
    assert (b.at(1), b.at(0)) == (10, None)
    assert OffsetBound(every=5, partitions={1: 10}).at(0) == 5


# ---------------------------------------------------------------------- verdicts
def letter(offset: int = 5, partition: int = 0, error_type: str = "ValueError", topic: str = "in",
           count: int | None = None, failed_at_ms: int | None = NOW, headers: bool = True) -> object:
    original = [] if count is None else [(REDRIVE_COUNT, str(count).encode())]
    h = dead_letter_headers(original, error_type=error_type, message="m", traceback="", topic=topic,
                            partition=0, offset=offset, attempts=1, worker="w") \
        if headers else [("app", b"1")]
    if failed_at_ms is not None:
        h = [(k, str(failed_at_ms).encode() if k.endswith("failed_at_ms") else v) for k, v in h]
    else:
        h = [(k, v) for k, v in h if not k.endswith("failed_at_ms")]
    return read_letter(partition, offset, b"k", b"v", h, (1, NOW - 1))


def test_a_letter_of_this_configs_topics_within_the_bounds_is_redriven() -> None:
    assert Selection(["in"]).judge(letter()) is None
    assert Selection(["^i.$"]).judge(letter()) is None, "kafka.topics may be a regex"


@pytest.mark.parametrize(("selection", "kwargs", "verdict"), [
    (Selection(["in"], end=OffsetBound(every=5)), {}, Stop.AFTER_TO),
    (Selection(["in"], end=OffsetBound(every=6)), {}, None),
    (Selection(["in"], end=OffsetBound(partitions={1: 0})), {}, None),
    (Selection(["in"], end=TimeBound(NOW)), {}, Stop.AFTER_TO),
    (Selection(["in"], end=TimeBound(NOW + 1)), {}, None),
    (Selection(["in"], start=OffsetBound(every=6)), {}, Skip.BEFORE_FROM),
    (Selection(["in"], start=TimeBound(NOW + 1)), {}, Skip.BEFORE_FROM),
    (Selection(["in"], start=TimeBound(NOW)), {}, None),
    (Selection(["in"], start=TimeBound(NOW)), {"failed_at_ms": None}, Skip.BEFORE_FROM),  # record ts: NOW-1
    (Selection(["in"]), {"headers": False}, Skip.NOT_A_DEAD_LETTER),
    (Selection(["in"]), {"count": 2**31}, Skip.MALFORMED),
    (Selection(["in"], error_types=frozenset({"X"})), {"count": 2**40}, Skip.MALFORMED),
    (Selection(["in"]), {"topic": "elsewhere"}, Skip.OTHER_SOURCE),
    (Selection(["in"], error_types=frozenset({"KeyError"})), {}, Skip.NOT_SELECTED),
    (Selection(["in"], error_types=frozenset({"KeyError", "ValueError"})), {}, None),
    (Selection(["in"], max_redrives=3), {"count": 3}, Skip.MAX_REDRIVES),
    (Selection(["in"], max_redrives=3), {"count": 2}, None),
    (Selection(["in"], through_plugin=True), {"error_type": "WorkerCrashed"}, Skip.CRASHED_A_WORKER),
    (Selection(["in"]), {"error_type": "WorkerCrashed"}, None),
    # precedence: the end first (the run stops there), then the window, then what the letter is
    (Selection(["in"], end=OffsetBound(every=5), start=OffsetBound(every=9)), {}, Stop.AFTER_TO),
    (Selection(["in"], start=OffsetBound(every=9)), {"headers": False}, Skip.BEFORE_FROM),
    (Selection(["in"], error_types=frozenset({"X"})), {"topic": "elsewhere"}, Skip.OTHER_SOURCE),
    (Selection(["in"], error_types=frozenset({"X"})), {"count": 9}, Skip.NOT_SELECTED),
])
def test_each_reason_and_their_order(selection: Selection, kwargs: dict[str, object],
                                     verdict: object) -> None:
    assert selection.judge(letter(**kwargs)) is verdict  # type: ignore[arg-type]


# ---------------------------------------------------------------------- the token bucket
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@given(st.floats(0.05, 5000), st.lists(st.floats(0, 2), min_size=1, max_size=200))
def test_the_bucket_never_lets_more_than_the_rate_plus_one_burst_through(rate: float,
                                                                         steps: list[float]) -> None:
    clock = Clock()
    bucket = TokenBucket(rate, clock)
    start, sent = clock.now, 0
    for step in steps:
        clock.now += step
        while bucket.delay() == 0:
            bucket.take()
            sent += 1
        assert sent <= rate * (clock.now - start) + bucket.burst + 1e-6
    wait = bucket.delay()
    assert 0 < wait <= 1 / rate + 1e-9, "the next record waits at most one interval"
    clock.now += wait
    assert bucket.delay() == 0


def test_the_burst_is_a_tenth_of_a_second_and_at_least_one_record() -> None:
    assert TokenBucket(1000, Clock()).burst == 100
    assert TokenBucket(2, Clock()).burst == 1
    with pytest.raises(ValueError):
        TokenBucket(0, Clock())


# ---------------------------------------------------------------------- the ledger
@given(st.lists(st.tuples(st.integers(1, 3), st.booleans()), min_size=1, max_size=60), st.randoms())
def test_the_committable_offset_is_the_first_letter_not_settled(steps: list[tuple[int, bool]],
                                                                rnd: object) -> None:
    """A model check: letters taken in order (with gaps, as a compacted topic has), some passed
    over, settled in any order; the committable offset never passes an unsettled letter."""
    ledger = Ledger()
    offset, open_, last = 10, [], None
    for gap, passed in steps:
        offset += gap
        if passed:
            ledger.pass_over(offset)
        else:
            ledger.take(offset)
            open_.append(offset)
        last = offset
        if open_ and rnd.random() < 0.5:  # type: ignore[attr-defined]
            ledger.settle(open_.pop(rnd.randrange(len(open_))))  # type: ignore[attr-defined]
        expected = min(open_) if open_ else last + 1
        assert ledger.committable() == expected
        assert ledger.in_flight == len(open_)


def test_an_empty_ledger_commits_nothing_and_letters_go_in_order() -> None:
    ledger = Ledger()
    assert ledger.committable() is None
    ledger.take(5)
    with pytest.raises(ValueError):
        ledger.take(5)
    ledger.settle(99)  # never taken: nothing happens
    assert ledger.committable() == 5
