"""Reading a topic the caller has just created: Apache Kafka's brokers learn of a new topic
from the controller a moment after CreateTopics returns, and answer UNKNOWN_TOPIC_OR_PART or
LEADER_NOT_AVAILABLE until then. The reader asks again until its deadline instead of taking
that for an answer (it stopped every daemon's start on a fresh control topic)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError as _CKError

from runtime.errors import KafkaError
from runtime.kafka.topic_reader import _partitions_once_known


class Cluster:
    """list_topics answering from a script of (error code or None, partitions)."""

    def __init__(self, *answers: tuple[int | None, list[int]]) -> None:
        self.answers = list(answers)
        self.asked = 0

    def list_topics(self, topic: str, timeout: float) -> Any:
        code, parts = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        err = None if code is None else _CKError(code)
        meta = SimpleNamespace(error=err, partitions={p: None for p in parts})
        return SimpleNamespace(topics={topic: meta})


@pytest.mark.parametrize("not_yet", [_CKError.UNKNOWN_TOPIC_OR_PART, _CKError.LEADER_NOT_AVAILABLE])
def test_a_topic_the_broker_does_not_know_yet_is_asked_for_again(not_yet: int) -> None:
    c = Cluster((not_yet, []), (not_yet, []), (None, [0]))
    assert _partitions_once_known(c, "t", time.monotonic() + 60, "control topic") == [0]  # type: ignore[arg-type]
    assert c.asked == 3


def test_a_topic_without_partitions_yet_is_asked_for_again() -> None:
    c = Cluster((None, []), (None, [0, 1]))
    assert _partitions_once_known(c, "t", time.monotonic() + 60, "control topic") == [0, 1]  # type: ignore[arg-type]


def test_another_error_is_the_answer_at_once() -> None:
    c = Cluster((_CKError.TOPIC_AUTHORIZATION_FAILED, []), (None, [0]))
    with pytest.raises(KafkaError, match="control topic 't'"):
        _partitions_once_known(c, "t", time.monotonic() + 60, "control topic")  # type: ignore[arg-type]
    assert c.asked == 1


def test_past_the_deadline_the_broker_not_knowing_it_is_the_answer() -> None:
    c = Cluster((_CKError.UNKNOWN_TOPIC_OR_PART, []))
    with pytest.raises(KafkaError, match="control topic 't'"):
        _partitions_once_known(c, "t", time.monotonic() - 1, "control topic")  # type: ignore[arg-type]
