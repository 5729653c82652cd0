"""runtime.dev.records, behind `ringmaster produce` and `tail`: how lines become records,
which topic is meant, and how a record (a dead letter above all) becomes one line."""

from __future__ import annotations

import pytest

from runtime.config import Settings
from runtime.dev import records
from runtime.errors import ConfigError
from runtime.execution import deadletter_format
from runtime.kafka.topic_reader import Item


def settings(topics: list[str], **sections: object) -> Settings:
    return Settings.model_validate({"kafka": {"bootstrap_servers": "b:1", "group_id": "g", "topics": topics},
                                    "workers": {"plugin": "p"}, **sections})


def test_lines_become_records_with_an_optional_key() -> None:
    assert list(records.records_of(["hello\n", "a=b=c\r\n", "plain", ""], "=")) == [
        (None, b"hello"), (b"a", b"b=c"), (None, b"plain"), (None, b"")]
    assert list(records.records_of(["k=v"], None)) == [(None, b"k=v")]


def test_the_topic_is_the_configs_only_input_topic_or_must_be_named() -> None:
    assert records.input_topic(settings(["in"]), None) == "in"
    assert records.input_topic(settings(["a", "b"]), "b") == "b"
    with pytest.raises(ConfigError, match=r"reads 2 topics \(a, b\); say which with --topic"):
        records.input_topic(settings(["a", "b"]), None)
    assert records.output_topic(settings(["in"], output={"topic": "out"}), None, False) == "out"
    with pytest.raises(ConfigError, match=r"no \[output\] topic"):
        records.output_topic(settings(["in"]), None, False)


def test_a_record_is_one_line_and_a_dead_letter_says_where_from_and_why() -> None:
    assert records.describe(Item(0, 5, b"k", b"multi\nline", []), keys=False) == "multi\\nline"
    assert records.describe(Item(0, 5, None, b"\xff", []), keys=True) == "\t\\xff"
    headers = deadletter_format.dead_letter_headers(
        None, error_type="ValueError", message="bad input", traceback="...", topic="in", partition=3,
        offset=41, attempts=3, worker="worker-0.1")
    assert records.describe(Item(0, 0, None, b"payload", headers), keys=False) == \
        "in[3]@41 ValueError: bad input | payload"
    assert records.describe(Item(0, 0, None, b"", headers), keys=False) == "in[3]@41 ValueError: bad input"


def test_the_dead_letter_header_prefix_is_the_workers_own() -> None:
    assert records.HEADER_PREFIX == deadletter_format.HEADER_PREFIX
