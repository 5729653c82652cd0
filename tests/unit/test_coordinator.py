"""A group coordinator that is moving or loading (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS:
Apache Kafka answers them for a moment) is asked again by the callers that need an answer:
GroupConsumer's synchronous commit and ``committed(ask_again=True)`` (redrive's cursor),
and the Spark planner's group offsets. Any other refusal is not asked again. Fakes stand in
for confluent_kafka's Consumer; the waits are real but short (the first back-off, 0.1 s)."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException, TopicPartition

from runtime.errors import KafkaError, RingmasterError
from runtime.kafka import coordinator
from runtime.kafka.consumer import ConsumerState, GroupConsumer
from runtime.spark import offsets as ko

BUSY = [CKError.NOT_COORDINATOR, CKError.COORDINATOR_LOAD_IN_PROGRESS]


def refusal(code: int) -> KafkaException:
    return KafkaException(CKError(code))


class Client:
    """confluent_kafka.Consumer's commit() and committed(): each call takes the next scripted
    answer (an exception to raise, or a function of the partitions asked for)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls: list[list[tuple[str, int, int]]] = []

    def _next(self, parts: list[TopicPartition]) -> Any:
        self.calls.append([(p.topic, p.partition, p.offset) for p in parts])
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer(parts)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> Any:
        assert not asynchronous
        return self._next(offsets)

    def committed(self, parts: list[TopicPartition], timeout: float) -> Any:
        return self._next(parts)

    def close(self) -> None:
        pass


def accepted(parts: list[TopicPartition]) -> list[Any]:
    return [SimpleNamespace(topic=p.topic, partition=p.partition, offset=p.offset, error=None) for p in parts]


def refusing(code: int, partition: int) -> Callable[[list[TopicPartition]], list[Any]]:
    """The partition ``partition`` refused with ``code``, the others accepted."""
    def answer(parts: list[TopicPartition]) -> list[Any]:
        return [SimpleNamespace(topic=p.topic, partition=p.partition, offset=p.offset,
                                error=CKError(code) if p.partition == partition else None) for p in parts]
    return answer


def at(offset: int) -> Callable[[list[TopicPartition]], list[TopicPartition]]:
    return lambda parts: [TopicPartition(p.topic, p.partition, offset) for p in parts]


def consumer_with(client: Client) -> GroupConsumer:
    gc = GroupConsumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"}, client=client)  # type: ignore[arg-type]
    gc.state = ConsumerState.CONSUMING
    return gc


@pytest.mark.parametrize("code", BUSY)
def test_is_busy_knows_a_moving_or_loading_coordinator(code: int) -> None:
    assert coordinator.is_busy(refusal(code))
    assert coordinator.is_busy(CKError(code))
    assert not coordinator.is_busy(refusal(CKError.REBALANCE_IN_PROGRESS))
    assert not coordinator.is_busy(None)


def test_until_answered_asks_a_busy_coordinator_again_then_gives_up_at_its_deadline() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    calls = []

    def call() -> str:
        calls.append(now[0])
        raise refusal(CKError.NOT_COORDINATOR)

    with pytest.raises(KafkaException):
        coordinator.until_answered(call, 3.0, "unit", clock=lambda: now[0], sleep=sleep)
    assert len(calls) > 3 and now[0] <= 3.0  # asked again, never past its deadline
    assert all(0 < s <= coordinator.MAX_WAIT_S for s in slept)


def test_until_answered_does_not_ask_again_after_another_error() -> None:
    client = Client(refusal(CKError.GROUP_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        coordinator.until_answered(lambda: client.committed([], 1), 30.0, "unit", sleep=lambda s: None)
    assert len(client.calls) == 1


@pytest.mark.parametrize("code", BUSY)
def test_a_synchronous_commit_a_busy_coordinator_refused_is_sent_again(code: int) -> None:
    client = Client(refusal(code), refusing(code, 1), accepted)
    gc = consumer_with(client)
    result = gc.commit({("t", 0): 10, ("t", 1): 20}, asynchronous=False, timeout_s=30)
    assert result.ok and not result.busy
    assert [sorted(call) for call in client.calls] == [
        [("t", 0, 10), ("t", 1, 20)], [("t", 0, 10), ("t", 1, 20)], [("t", 1, 20)]]
    assert gc.acknowledged == {("t", 0): 10, ("t", 1): 20}


def test_a_commit_refused_for_another_reason_is_not_sent_again() -> None:
    client = Client(refusing(CKError.REBALANCE_IN_PROGRESS, 0))
    gc = consumer_with(client)
    result = gc.commit({("t", 0): 10, ("t", 1): 20}, asynchronous=False, timeout_s=30)
    assert not result.ok and set(result.refused) == {("t", 0)} and not result.busy
    assert len(client.calls) == 1


def test_a_coordinator_busy_past_half_the_timeout_is_reported_busy() -> None:
    client = Client(*[refusal(CKError.COORDINATOR_LOAD_IN_PROGRESS)] * 100)
    gc = consumer_with(client)
    result = gc.commit({("t", 0): 10}, asynchronous=False, timeout_s=0.5)
    assert not result.ok and result.busy == {("t", 0)}
    assert not gc.wedged and not gc.abandoned  # each attempt had its answer: the client is fine


def test_committed_asks_a_busy_coordinator_again_only_when_told() -> None:
    gc = consumer_with(Client(refusal(CKError.NOT_COORDINATOR)))
    with pytest.raises(KafkaError, match="committed offsets"):
        gc.committed([("t", 0)])  # the supervisor's loop asks again on its next turn
    gc = consumer_with(Client(refusal(CKError.NOT_COORDINATOR),
                              refusal(CKError.COORDINATOR_LOAD_IN_PROGRESS), at(7)))
    assert gc.committed([("t", 0)], timeout_s=30, ask_again=True) == {("t", 0): 7}


def test_spark_group_offsets_are_read_and_committed_through_a_busy_coordinator() -> None:
    reader = Client(refusal(CKError.NOT_COORDINATOR), at(7))
    assert ko.committed(reader, [("t", 0)]) == {"t": {"0": 7}}  # type: ignore[arg-type]
    writer = Client(refusal(CKError.COORDINATOR_LOAD_IN_PROGRESS),
                    refusing(CKError.NOT_COORDINATOR, 0), accepted)
    ko.commit(writer, {"t": {"0": 5, "1": 6}})  # type: ignore[arg-type]
    assert writer.calls[-1] == [("t", 0, 5)]


def test_spark_group_offsets_refused_for_another_reason_are_an_error_naming_them() -> None:
    writer = Client(refusing(CKError.UNKNOWN_MEMBER_ID, 1))
    with pytest.raises(RingmasterError, match=r"not committed for t\[1\]"):
        ko.commit(writer, {"t": {"0": 5, "1": 6}})  # type: ignore[arg-type]
    assert len(writer.calls) == 1
