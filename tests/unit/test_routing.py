"""Where outputs go (runtime/execution/routing.py), the one policy of every backend."""

from __future__ import annotations

import logging

import pytest

from runtime.execution.routing import OutputRoute
from runtime.plugin import Output


def test_an_outputs_own_topic_wins_then_the_configured_one() -> None:
    route = OutputRoute("out")
    assert route.topic(Output(b"v", topic="retry")) == "retry"
    assert route.topic(Output(b"v")) == "out"
    assert route.take_discarded() == 0


def test_without_a_topic_outputs_are_counted_and_said_once(caplog: pytest.LogCaptureFixture) -> None:
    route = OutputRoute(None, counted_in="status")
    with caplog.at_level(logging.WARNING):
        assert [route.topic(Output(b"v")) for _ in range(3)] == [None, None, None]
    assert route.take_discarded() == 3 and route.take_discarded() == 0
    (line,) = [r.getMessage() for r in caplog.records]
    assert "discarded (counted in status)" in line


def test_a_sink_that_keeps_topicless_outputs_counts_nothing() -> None:
    route = OutputRoute(None, keep_unrouted=True)
    assert route.topic(Output(b"v")) is None and route.discarded == 0
