"""GroupConsumer's shutdown edge: close() is bounded, and rebalance callbacks that librdkafka
runs while closing are not passed on to the runtime (it has already let go)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from runtime.errors import KafkaError as KafkaErrorOfOurs
from runtime.kafka.consumer import ConsumerState, GroupConsumer

UNIT = {"bootstrap.servers": "127.0.0.1:9", "group.id": "unit"}
COOPERATIVE = {**UNIT, "partition.assignment.strategy": "cooperative-sticky"}


class ClientThatHangsOnClose:
    """Stands in for confluent_kafka.Consumer: close() blocks like librdkafka#4527."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.callbacks: dict[str, Any] = {}
        self.assigned: list[list[TopicPartition]] = []

    def subscribe(self, topics: list[str], **callbacks: Any) -> None:
        self.callbacks = callbacks
        self.topics = topics

    def list_topics(self, timeout: float = -1) -> Any:
        return SimpleNamespace(topics=dict.fromkeys(self.topics))

    def incremental_assign(self, parts: list[TopicPartition]) -> None:
        self.assigned.append(parts)

    def close(self) -> None:
        self.release.wait(60)


def consumer_with(client: ClientThatHangsOnClose) -> GroupConsumer:
    gc = GroupConsumer(COOPERATIVE, client=client)  # type: ignore[arg-type]
    return gc


def test_close_gives_up_when_the_client_hangs_and_says_so() -> None:
    client = ClientThatHangsOnClose()
    gc = consumer_with(client)
    try:
        assert gc.close(0.2) is False
        assert gc.abandoned
        assert gc.state is ConsumerState.CLOSING
        assert gc.close(0.2) is False  # a second close does not wait again
    finally:
        client.release.set()


def test_close_that_finishes_is_clean() -> None:
    client = ClientThatHangsOnClose()
    client.release.set()
    gc = consumer_with(client)
    assert gc.close(5) is True
    assert gc.state is ConsumerState.CLOSED and not gc.abandoned


def test_callbacks_during_close_reach_librdkafka_but_not_the_runtime() -> None:
    client = ClientThatHangsOnClose()
    gc = consumer_with(client)
    seen: list[tuple[str, list[Any]]] = []
    gc.subscribe(["t"], on_assign=lambda tps: seen.append(("assign", tps)),
                 on_revoke=lambda tps: seen.append(("revoke", tps)),
                 on_lost=lambda tps: seen.append(("lost", tps)))
    parts = [TopicPartition("t", 0)]
    client.callbacks["on_assign"](client, parts)
    assert seen == [("assign", [("t", 0)])]
    try:
        gc.close(0.1)
        client.callbacks["on_assign"](client, [TopicPartition("t", 1)])
        client.callbacks["on_revoke"](client, parts)
        client.callbacks["on_lost"](client, parts)
    finally:
        client.release.set()
    assert seen == [("assign", [("t", 0)])], "the runtime took on partitions while closing"
    assert len(client.assigned) == 2, "librdkafka must still get its assign call"


class AssigningClient(ClientThatHangsOnClose):
    """Records which of librdkafka's assign calls the callback used."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.full: list[list[TopicPartition]] = []

    def assign(self, parts: list[TopicPartition]) -> None:
        self.full.append(parts)


@pytest.mark.parametrize(("props", "incremental"), [
    ({"group.protocol": "consumer"}, True),  # KIP-848: incremental by design, no strategy set
    ({"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"}, True),
    ({"partition.assignment.strategy": "range"}, False),  # eager: each assignment is the whole
])
def test_an_assignment_is_applied_incrementally_under_kip848_and_cooperative_sticky(
        props: dict[str, str], incremental: bool) -> None:
    """librdkafka's callbacks under KIP-848 carry only the change: applied as a full
    assignment, it would drop every partition held before."""
    client = AssigningClient()
    gc = GroupConsumer({**UNIT, **props}, client=client)  # type: ignore[arg-type]
    gc.subscribe(["t"], on_assign=lambda tps: None, on_revoke=lambda tps: None, on_lost=lambda tps: None)
    client.callbacks["on_assign"](client, [TopicPartition("t", 1)])
    assert (client.assigned, client.full) == (([[TopicPartition("t", 1)]], []) if incremental
                                              else ([], [[TopicPartition("t", 1)]]))
    gc.close(5)


class ResumingClient(ClientThatHangsOnClose):
    """Positions as librdkafka gives them after consume(): past the last record returned, or
    none (-1001) where nothing was consumed since an assign or a seek."""

    def __init__(self, positions: dict[int, int], refuse_seek: int | None = None) -> None:
        super().__init__()
        self.release.set()
        self.positions = positions
        self.refuse_seek = refuse_seek
        self.calls: list[tuple[str, list[tuple[int, int]]]] = []

    def pause(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("pause", [(p.partition, p.offset) for p in parts]))

    def resume(self, parts: list[TopicPartition]) -> None:
        self.calls.append(("resume", [(p.partition, p.offset) for p in parts]))

    def position(self, parts: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition, self.positions[p.partition]) for p in parts]

    def seek(self, part: TopicPartition) -> None:
        assert part.leader_epoch is None, "an epoch makes librdkafka validate it first: a round trip"
        if part.partition == self.refuse_seek:
            raise KafkaException(KafkaError(KafkaError._STATE))
        self.calls.append(("seek", [(part.partition, part.offset)]))


def test_a_resume_seeks_each_paused_partition_to_where_it_was_to_fetch_from_which_wakes_its_fetcher() -> None:
    """tests/integration/test_consumer_resume.py shows why, on the real brokers. Partition 1
    has no position to seek to; partition 3 was never paused (the flow control's once-a-second
    repair resumes such partitions too): a seek would only drop what it had prefetched."""
    client = ResumingClient({0: 1200, 1: -1001, 2: 7, 3: 55}, refuse_seek=0)
    gc = consumer_with(client)
    gc.pause([("t", 0), ("t", 1), ("t", 2)])
    gc.resume([("t", 0), ("t", 1), ("t", 2), ("t", 3)])
    assert client.calls[1:] == [("resume", [(0, -1001), (1, -1001), (2, -1001), (3, -1001)]),
                                ("seek", [(2, 7)])], "a refused seek must not stop the others"
    client.refuse_seek = None
    gc.pause([("t", 0)])
    gc.resume([("t", 0)])
    assert client.calls[-1] == ("seek", [(0, 1200)])
    gc.close(5)


class CoordinatorLoadingClient(ClientThatHangsOnClose):
    """Refuses the first committed-offsets fetch as a whole, as a fresh Apache Kafka broker
    does while its coordinator loads (NOT_COORDINATOR), then answers: 40 committed on
    partition 0, none on partition 1."""

    def __init__(self) -> None:
        super().__init__()
        self.release.set()
        self.asked = 0
        self.plain_assigned: list[list[tuple[int, int]]] = []

    def committed(self, parts: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        self.asked += 1
        if self.asked == 1:
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))
        return [TopicPartition(p.topic, p.partition, 40 if p.partition == 0 else -1001) for p in parts]

    def assign(self, parts: list[TopicPartition]) -> None:
        self.plain_assigned.append([(p.partition, p.offset) for p in parts])


@pytest.mark.parametrize(("reset", "no_commit"), [("earliest", -2), ("latest", -1)])
def test_a_look_without_joining_assigns_the_committed_offsets_it_read_itself(reset: str,
                                                                             no_commit: int) -> None:
    """librdkafka#5586: assigned at OFFSET_STORED, a partition whose offset fetch was refused as
    a whole (NOT_COORDINATOR) is never fetched. ``assign()`` reads the committed offsets
    itself, asking again past the refusal, and assigns them (the reset position, -2 earliest
    or -1 latest, where none was committed): librdkafka has nothing left to fetch for it."""
    client = CoordinatorLoadingClient()
    gc = GroupConsumer({**UNIT, "auto.offset.reset": reset}, client=client)  # type: ignore[arg-type]
    gc.assign([("t", 0), ("t", 1)], timeout_s=5)
    assert client.asked == 2, "a refused fetch is asked again"
    assert client.plain_assigned == [[(0, 40), (1, no_commit)]]
    assert gc.state is ConsumerState.CONSUMING
    gc.close(5)


def test_a_member_that_asks_for_it_is_assigned_the_committed_offsets_read_in_the_callback() -> None:
    """The same for a member (``subscribe(read_start_s=...)``, the redrive's): its assignment is
    given explicit offsets read in the callback, past one refusal; a fetch that stays refused
    leaves the partitions to librdkafka, as before, rather than failing the assignment."""
    client = CoordinatorLoadingClient()
    gc = GroupConsumer(COOPERATIVE, client=client)  # type: ignore[arg-type]
    seen: list[list[tuple[str, int]]] = []
    gc.subscribe(["t"], seen.append, lambda tps: None, lambda tps: None, read_start_s=5)
    client.callbacks["on_assign"](client, [TopicPartition("t", 0), TopicPartition("t", 1)])
    assert [[(p.partition, p.offset) for p in parts] for parts in client.assigned] == [[(0, 40), (1, -2)]]
    assert seen == [[("t", 0), ("t", 1)]]
    client.asked = 0

    def refused(parts: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))

    client.committed = refused  # type: ignore[method-assign]
    gc.subscribe(["t"], seen.append, lambda tps: None, lambda tps: None, read_start_s=0.3)
    client.callbacks["on_assign"](client, [TopicPartition("t", 2)])
    assert [(p.partition, p.offset) for p in client.assigned[-1]] == [(2, -1001)]
    gc.close(5)


def test_a_resumed_partition_with_no_position_is_woken_where_it_was_last_sought() -> None:
    """A partition rewound (sought) while paused has no position until consume() returns one
    of its records: it fetches from where it was sought, so that is where the wake seeks it.
    One never sought (librdkafka found its start) is not sought at all; one let go forgets it."""
    client = ResumingClient({0: -1001, 1: -1001, 2: -1001})
    gc = consumer_with(client)
    gc.pause([("t", 0), ("t", 1), ("t", 2)])
    assert gc.seek(("t", 0), 500) and gc.seek(("t", 2), 9)
    gc._let_go([("t", 2)])
    gc.resume([("t", 0), ("t", 1), ("t", 2)])
    seeks = [c[1][0] for c in client.calls if c[0] == "seek"]
    assert seeks == [(0, 500), (2, 9), (0, 500)], "the rewinds, then the wake of partition 0 only"
    gc.close(5)


def test_a_rewind_to_a_logical_offset_or_under_a_reset_to_the_end_is_not_sought_again() -> None:
    """librdkafka resolves a logical offset (the start, the end) once; sought again, the end
    would be a newer one, skipping what came in between. Under a reset to the end a real
    offset that turned out of range would be reset anew, to a newer end: no second seek."""
    client = ResumingClient({0: -1001, 1: -1001})
    gc = consumer_with(client)
    gc.pause([("t", 0), ("t", 1)])
    assert gc.seek(("t", 0), -1) and gc.seek(("t", 1), 70)
    gc.resume([("t", 0), ("t", 1)])
    assert [c[1][0] for c in client.calls if c[0] == "seek"] == [(0, -1), (1, 70), (1, 70)]
    gc.close(5)
    client = ResumingClient({0: -1001})
    gc = GroupConsumer({**COOPERATIVE, "auto.offset.reset": "latest"}, client=client)  # type: ignore[arg-type]
    gc.pause([("t", 0)])
    assert gc.seek(("t", 0), 70)
    gc.resume([("t", 0)])
    assert [c[1][0] for c in client.calls if c[0] == "seek"] == [(0, 70)]
    gc.close(5)


def test_a_partition_refused_by_the_coordinator_is_no_committed_offset() -> None:
    """A partition's own error in the answer is not "nothing committed": read so, a member
    would start it at the reset position. ``committed()`` refuses the whole read, naming it;
    the supervisor's start seeks the partitions answered and returns the refused one, which it
    holds and asks again for."""

    class Refusing(ResumingClient):
        def committed(self, parts: list[TopicPartition], timeout: float = -1) -> list[Any]:
            # As the client answers, with the last partition refused (its error is read-only
            # on a TopicPartition, so a stand-in).
            return [SimpleNamespace(topic=p.topic, partition=p.partition, offset=5,
                                    error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
                                    if i == len(parts) - 1 else None) for i, p in enumerate(parts)]

    client = Refusing({})
    gc = consumer_with(client)
    with pytest.raises(KafkaErrorOfOurs, match=r"reading committed offsets failed: t\[1\]"):
        gc.committed([("t", 0), ("t", 1)])
    assert gc.seek_to_start([("t", 0), ("t", 1)]) == [("t", 1)]
    assert client.calls == [("seek", [(0, 5)])], "the answered partition starts at once"
    gc.close(5)


def test_a_member_closing_does_not_read_the_offsets_of_a_late_assignment() -> None:
    """While closing, the coordinator refuses the offset fetches of a group that is leaving, and
    the read would be asked again for read_start_s, holding close(): librdkafka is left to it."""
    client = CoordinatorLoadingClient()
    gc = GroupConsumer(COOPERATIVE, client=client)  # type: ignore[arg-type]
    gc.subscribe(["t"], lambda tps: None, lambda tps: None, lambda tps: None, read_start_s=5)
    gc.state = ConsumerState.CLOSING
    client.callbacks["on_assign"](client, [TopicPartition("t", 0)])
    assert client.asked == 0
    assert [(p.partition, p.offset) for p in client.assigned[-1]] == [(0, -1001)]
    gc.state = ConsumerState.CONSUMING
    gc.close(5)


class QueuedClient(ClientThatHangsOnClose):
    """consume() hands out what is queued, as librdkafka does: records and events together."""

    def __init__(self, queued: list[Any]) -> None:
        super().__init__()
        self.release.set()
        self.queued = queued

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Any]:
        out, self.queued = self.queued[:num_messages], self.queued[num_messages:]
        return out


def _record(partition: int, offset: int) -> Message:
    return Message(topic="t", partition=partition, offset=offset, value=b"r%d" % offset)


def _event(partition: int, offset: int, code: int = KafkaError._PARTITION_EOF) -> Message:
    return Message(topic="t", partition=partition, offset=offset, error=KafkaError(code))


@pytest.mark.parametrize("topics", [["t"], ["t", "u"]], ids=["one topic", "two topics"])
def test_an_event_between_a_partitions_records_is_never_handed_out_as_a_record(topics: list[str]) -> None:
    """INVARIANT (1): a run holds records only. One consume() takes what librdkafka queued:
    partition 0's records, its end (at 22), the records fetched after it; partition 1's end;
    partition 0's next records with a transient fetch error between them. Each of partition
    0's runs begins and ends with a record. Looked for at a run's edges only, the end at 22
    went into the run as a record at offset 22, beside the real 22: the plugin ran the
    error's text and the cut went backwards (the cluster matrix's "span [24..24] overlaps or
    goes backwards")."""
    queued = [_record(0, 20), _record(0, 21), _event(0, 22), _record(0, 22), _record(0, 23), _event(1, 7),
              _record(0, 24), _event(0, 25, KafkaError._TRANSPORT), _record(0, 25)]
    gc = GroupConsumer(UNIT, client=QueuedClient(queued))  # type: ignore[arg-type]
    gc.subscribe(topics, lambda tps: None, lambda tps: None, lambda tps: None)
    fetched = gc.consume(100, 0)
    run = fetched.runs[("t", 0)]
    assert [m.offset() for m in run] == [20, 21, 22, 23, 24, 25]
    assert all(m.error() is None for m in run)
    assert fetched.count == 6
    # The end at 22 is handed on: Partition.reached_end drops it, records came after it.
    assert fetched.eof == {("t", 0): 22, ("t", 1): 7}
    gc.close(5)
