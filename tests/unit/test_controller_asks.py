"""What a daemon asks of the cluster's controller at its start, against fake admin clients: a
topic the metadata lists is never asked of the controller, and a create, or a share group's
config, that timed out is asked again by a new client (CONTROLLER_WAIT in
runtime/kafka/admin.py; tests/cluster/test_topic_creation.py does it on a cluster with a node
killed)."""

from __future__ import annotations

import concurrent.futures
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError as CKError
from confluent_kafka import KafkaException

import runtime.kafka.admin as admin_module
from runtime.errors import KafkaError, KafkaUnreachable
from runtime.kafka.admin import create_topic
from runtime.kafka.share_consumer import prepare_share_group


@dataclass
class _Topic:
    error: Any = None


@dataclass
class _Metadata:
    topics: dict[str, _Topic]


@dataclass
class Cluster:
    """What the fake clients are told, one entry an attempt (the last one repeats)."""

    listed: list[bool | None]  # None: the metadata request was not answered
    created: list[int | None]  # None: created; else the error code of the answer
    clients: int = 0
    creates: int = 0
    timeouts: list[float] = field(default_factory=list)

    def client(self, conf: dict[str, Any]) -> FakeAdmin:
        self.clients += 1
        return FakeAdmin(self, self.clients - 1)


class _Future:
    def __init__(self, code: int | None) -> None:
        self.code = code

    def result(self, timeout: float | None = None) -> None:
        if self.code is not None:
            raise KafkaException(CKError(self.code))


class FakeAdmin:
    def __init__(self, cluster: Cluster, attempt: int) -> None:
        self.cluster, self.attempt = cluster, attempt

    def _at(self, answers: list[Any]) -> Any:
        return answers[min(self.attempt, len(answers) - 1)]

    def list_topics(self, timeout: float = -1) -> _Metadata:
        listed = self._at(self.cluster.listed)
        if listed is None:
            raise KafkaException(CKError(CKError._TRANSPORT))
        return _Metadata({"t": _Topic()} if listed else {"other": _Topic()})

    def create_topics(self, topics: list[Any], operation_timeout: float = 0,
                      request_timeout: float = 0) -> dict[str, _Future]:
        self.cluster.creates += 1
        self.cluster.timeouts.append(request_timeout)
        return {t.topic: _Future(self._at(self.cluster.created)) for t in topics}

    def poll(self, timeout: float = 0) -> int:
        return 0


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> Cluster:
    fake = Cluster(listed=[False], created=[None])
    monkeypatch.setattr(admin_module, "AdminClient", fake.client)
    monkeypatch.setattr(admin_module, "_RETRY_AFTER_S", 0.01)
    return fake


PROPS = {"bootstrap.servers": "k:9092"}


def test_a_topic_the_metadata_lists_is_not_asked_of_the_controller(cluster: Cluster) -> None:
    cluster.listed = [True]
    assert create_topic(PROPS, "t") is False
    assert (cluster.clients, cluster.creates) == (1, 0)


def test_a_create_that_timed_out_is_asked_again_by_a_new_client(cluster: Cluster) -> None:
    cluster.created = [CKError._TIMED_OUT, None]
    assert create_topic(PROPS, "t", timeout_s=30.0) is True
    assert (cluster.clients, cluster.creates) == (2, 2)
    assert max(cluster.timeouts) <= admin_module._ATTEMPT_S, "no attempt waits the whole timeout"


def test_a_topic_made_meanwhile_is_found_by_the_next_look(cluster: Cluster) -> None:
    # The broker's REQUEST_TIMED_OUT: the topic made, not yet everywhere.
    cluster.listed, cluster.created = [False, True], [CKError.REQUEST_TIMED_OUT]
    assert create_topic(PROPS, "t") is False
    assert (cluster.clients, cluster.creates) == (2, 1)


def test_a_topic_that_exists_at_the_controller_is_not_an_error(cluster: Cluster) -> None:
    cluster.created = [CKError.TOPIC_ALREADY_EXISTS]
    assert create_topic(PROPS, "t") is False


def test_a_refusal_is_said_at_once_and_not_asked_again(cluster: Cluster) -> None:
    cluster.created = [CKError.INVALID_REPLICATION_FACTOR]
    with pytest.raises(KafkaError, match="cannot create the control topic 't'") as raised:
        create_topic(PROPS, "t", what="control topic")
    assert not isinstance(raised.value, KafkaUnreachable)
    assert (cluster.clients, cluster.creates) == (1, 1)


def test_a_cluster_that_never_answers_is_given_up_on_at_the_timeout(cluster: Cluster) -> None:
    cluster.listed, cluster.created = [None], [CKError._TIMED_OUT]
    began = time.monotonic()
    with pytest.raises(KafkaUnreachable, match=r"did not answer within 0\.3 s"):
        create_topic(PROPS, "t", timeout_s=0.3)
    assert time.monotonic() - began < 5.0
    assert cluster.clients >= 2, "asked again before giving up"


def test_an_answer_that_never_comes_is_a_timeout(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    def hangs(self: _Future, timeout: float | None = None) -> None:
        raise concurrent.futures.TimeoutError

    monkeypatch.setattr(_Future, "result", hangs)
    with pytest.raises(KafkaUnreachable):
        create_topic(PROPS, "t", timeout_s=0.2)


# ---------------------------------------------------------------------------- a share group's config
@dataclass
class _Entry:
    value: str
    is_default: bool


class _Answer:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome

    def result(self, timeout: float | None = None) -> Any:
        if isinstance(self.outcome, int):
            raise KafkaException(CKError(self.outcome))
        return self.outcome


@dataclass
class GroupConfigs:
    """Each attempt's answers: an error code, or what the broker answered."""

    described: list[Any]
    altered: list[Any]
    clients: int = 0
    asked: list[str] = field(default_factory=list)

    def client(self, conf: dict[str, Any]) -> Any:
        self.clients += 1
        configs = self

        class Admin:
            def describe_configs(self, resources: list[Any],
                                 request_timeout: float = 0) -> dict[Any, _Answer]:
                configs.asked.append("describe")
                return {resources[0]: _Answer(configs.described.pop(0))}

            def incremental_alter_configs(self, resources: list[Any],
                                          request_timeout: float = 0) -> dict[Any, _Answer]:
                configs.asked.append("alter")
                return {resources[0]: _Answer(configs.altered.pop(0))}

            def poll(self, timeout: float = 0) -> int:
                return 0

        return Admin()


DEFAULTS = {"share.auto.offset.reset": _Entry("latest", True),
            "share.delivery.count.limit": _Entry("5", True),
            "share.record.lock.duration.ms": _Entry("30000", True)}


def test_a_share_groups_config_that_timed_out_is_asked_again_by_a_new_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = GroupConfigs(described=[CKError._TIMED_OUT, DEFAULTS], altered=[CKError._TIMED_OUT, None])
    monkeypatch.setattr(admin_module, "AdminClient", fake.client)
    monkeypatch.setattr(admin_module, "_RETRY_AFTER_S", 0.01)
    group = prepare_share_group(PROPS, "g", timeout_s=30.0)
    assert (group.lock_s, group.delivery_limit) == (30.0, 5)
    assert fake.asked == ["describe", "describe", "alter", "alter"] and fake.clients == 4


def test_a_share_group_never_answered_is_an_unreachable_cluster_not_one_without_share_groups(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = GroupConfigs(described=[CKError._TIMED_OUT] * 1000, altered=[])
    monkeypatch.setattr(admin_module, "AdminClient", fake.client)
    monkeypatch.setattr(admin_module, "_RETRY_AFTER_S", 0.01)
    with pytest.raises(KafkaUnreachable, match="describing share group 'g'"):
        prepare_share_group(PROPS, "g", timeout_s=0.2)


def test_a_cluster_without_share_groups_is_said_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = GroupConfigs(described=[CKError.INVALID_REQUEST], altered=[])
    monkeypatch.setattr(admin_module, "AdminClient", fake.client)
    with pytest.raises(KafkaError, match="share groups") as raised:
        prepare_share_group(PROPS, "g", timeout_s=30.0)
    assert not isinstance(raised.value, KafkaUnreachable) and fake.clients == 1
