"""runtime.kafka.group_offsets.GroupOffsets: where the whole group stands is asked for off the
loop (never waited for), each partition's end taken once – the first time it is seen – so a
topic written to all the time still ends; the committed offsets only when asked for; nothing
is complete until every partition named has its end and the group has answered once."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition

from runtime.kafka.group_committed import Committed
from runtime.kafka.group_offsets import GAP_MAX, GroupOffsets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def done(value: Any) -> Future[Any]:
    f: Future[Any] = Future()
    if isinstance(value, Exception):
        f.set_exception(value)
    else:
        f.set_result(value)
    return f


class FakeAdmin:
    def __init__(self) -> None:
        self.partitions: dict[str, int] = {"t": 2}
        self.ends: dict[tuple[str, int], int] = {("t", 0): 10, ("t", 1): 20}
        self.committed: list[tuple[str, int, int]] = []
        self.asked: list[str] = []
        self.isolation: list[Any] = []
        self.hold = False  # answers not in yet
        self.unstable = 0  # stable reads answered with a pending transaction's error first
        self.no_controller = False  # the topics' asks time out waiting for the controller

    def _f(self, value: Any) -> Future[Any]:
        return Future() if self.hold else done(value)

    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Future[Any]]:
        self.asked.append("topics")
        def described(t: str) -> Any:
            if self.no_controller:
                return KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                                 "Failed while waiting for controller: Local: Timed out"))
            if t not in self.partitions:
                return KafkaException("UNKNOWN_TOPIC_OR_PART")
            return SimpleNamespace(partitions=[SimpleNamespace(id=i) for i in range(self.partitions[t])])
        return {t: self._f(described(t)) for t in topics.topic_names}

    def list_offsets(self, requests: dict[TopicPartition, Any],
                     **kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        self.asked.append("ends")
        self.isolation.append(kwargs["isolation_level"])
        return {tp: self._f(SimpleNamespace(offset=self.ends[(tp.topic, tp.partition)])) for tp in requests}

    def read_committed(self, names: Any, patterns: Any, stable: bool,
                       timeout_s: float | None = None) -> Future[Any]:
        """GroupCommitted.ask: the topics named and those of the metadata (``partitions``) the
        patterns match, and the group's offsets there."""
        self.asked.append("stable" if stable else "committed")
        topics = {t for t in self.partitions if t in names or any(p.search(t) for p in patterns)}
        offsets = {(t, p): o for t, p, o in self.committed if t in topics}
        refused = {}
        if self.unstable and offsets:  # a transaction's offsets pending: the broker answers one so
            self.unstable -= 1
            refused[min(offsets)] = "UNSTABLE_OFFSET_COMMIT"
            offsets.pop(min(offsets))
        return self._f(Committed(offsets, refused, frozenset(topics)))


def turns(group: GroupOffsets, committed: bool, n: int = 3) -> None:
    """The loop's turns: an answer is taken in on the turn after it came (metadata, then ends)."""
    for _ in range(n):
        group.refresh(committed)


class FakeGaps:
    """EmptyGaps.ask: ``empty`` names the partitions whose gap holds nothing a reader gets;
    a partition in ``unknown`` is left out of the answer (no answer in time)."""

    def __init__(self) -> None:
        self.empty: set[tuple[str, int]] = set()
        self.unknown: set[tuple[str, int]] = set()
        self.asked: list[dict[tuple[str, int], tuple[int, int]]] = []
        self.hold = False

    def __call__(self, gaps: Any) -> Future[Any]:
        self.asked.append(dict(gaps))
        answer = {tp: tp in self.empty for tp in gaps if tp not in self.unknown}
        return Future() if self.hold else done(answer)


class FakeReadEnds:
    """ReadEnds.ask: a reader from each start reaches ``further[tp]`` past it (0: a broker
    whose ListOffsets is exact); a partition in ``unknown`` is left out (no end in time)."""

    def __init__(self) -> None:
        self.further: dict[tuple[str, int], int] = {}
        self.unknown: set[tuple[str, int]] = set()
        self.asked: list[dict[tuple[str, int], int]] = []
        self.held: list[Future[Any]] = []
        self.hold = False  # the read not over yet

    def __call__(self, starts: Any) -> Future[Any]:
        self.asked.append(dict(starts))
        if self.hold:
            self.held.append(Future())
            return self.held[-1]
        return done({tp: at + self.further.get(tp, 0) for tp, at in starts.items() if tp not in self.unknown})


def make(topics: list[str] | None = None, gaps: FakeGaps | None = None, reader: FakeReadEnds | None = None,
         **props: Any) -> tuple[GroupOffsets, FakeAdmin, Clock]:
    clock, admin = Clock(), FakeAdmin()
    group = GroupOffsets({"group.id": "g", **props}, topics or ["t"], interval_s=1.0, timeout_s=10.0,
                         clock=clock, admin=lambda: admin, gaps=gaps or FakeGaps(),
                         read_ends=reader or FakeReadEnds(), committed=admin.read_committed)
    return group, admin, clock


def test_the_ends_are_taken_once_and_the_committed_offsets_only_when_asked_for() -> None:
    group, admin, clock = make()
    group.refresh(False)
    group.refresh(False)
    assert admin.asked == ["topics", "ends"], "the ends of the partitions the metadata named"
    assert not group.standing().complete, "no committed offsets yet"
    assert not group.standing().mapped, "the ends' answer is taken in on the next turn"
    group.refresh(False)
    s = group.standing()
    assert s.mapped and not s.complete, "every partition named has its end; no committed offsets yet"
    assert s.all_held({("t", 0), ("t", 1)}) and not s.all_held({("t", 0)})
    assert admin.isolation == [IsolationLevel.READ_COMMITTED], "the consumer's default isolation"
    admin.ends = {("t", 0): 99, ("t", 1): 99}  # a busy topic: the end first seen stays its end
    admin.committed = [("t", 0, 10), ("t", 1, 5), ("other", 0, 1)]
    clock.now += 1.5
    group.refresh(True)
    group.refresh(True)
    s = group.standing()
    assert s.complete and dict(s.ends) == {("t", 0): 10, ("t", 1): 20}
    assert dict(s.committed) == {("t", 0): 10, ("t", 1): 5}, "only the group's topics"
    assert s.left(set()) == {("t", 1): 5}
    assert s.left({("t", 1)}) == {}, "what the member holds it judges itself"


def test_a_partition_added_later_gets_its_end_when_first_seen() -> None:
    group, admin, clock = make()
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    turns(group, True)
    assert group.standing().complete
    admin.partitions["t"] = 3
    admin.ends[("t", 2)] = 7
    clock.now += 1.5
    group.refresh(True)
    group.refresh(True)
    assert not group.standing().complete, "t[2] named, its end not taken yet"
    assert not group.standing().all_held({("t", 0), ("t", 1)}), "t[2] is nobody's known work yet"
    group.refresh(True)
    s = group.standing()
    assert s.complete and s.left(set()) == {("t", 2): None}, "nothing committed there"


def test_an_end_is_where_a_reader_from_the_listoffsets_answer_reaches_not_the_answer_itself() -> None:
    """Tansu answers ListOffsets "latest" with the last batch's base offset + 1: a partition
    judged by it counted as caught up with most of it uncommitted (docs/brokers.md)."""
    reader = FakeReadEnds()
    reader.further = {("t", 1): 480}  # ListOffsets said 20; a reader from 20 reaches 500
    group, admin, _ = make(reader=reader)
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    turns(group, True)
    assert reader.asked == [{("t", 0): 10, ("t", 1): 20}], "read from where ListOffsets said"
    s = group.standing()
    assert s.complete and dict(s.ends) == {("t", 0): 10, ("t", 1): 500}
    assert s.left(set()) == {("t", 1): 20}, "committed at the answer, short of the end"


def test_an_end_the_reader_could_not_reach_stays_unknown_and_is_asked_again() -> None:
    reader = FakeReadEnds()
    reader.unknown = {("t", 1)}
    group, admin, clock = make(reader=reader)
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    turns(group, True)
    assert not group.standing().complete, "t[1] has no end: nothing is judged yet"
    reader.unknown = set()
    clock.now += 1.5
    turns(group, True)
    assert reader.asked[-1] == {("t", 1): 20}, "only the partition still without an end"
    s = group.standing()
    assert s.complete and dict(s.ends) == {("t", 0): 10, ("t", 1): 20}


def test_a_read_not_over_within_the_bound_is_abandoned_asked_again_and_its_late_answer_dropped() -> None:
    reader = FakeReadEnds()
    reader.hold = True
    group, admin, clock = make(reader=reader)
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    turns(group, True)
    assert len(reader.asked) == 1 and not group.standing().complete
    clock.now += 11  # past timeout_s: abandoned
    turns(group, True)
    assert len(reader.asked) == 2, "asked again"
    reader.held[0].set_result({("t", 0): 999, ("t", 1): 999})  # the first read, late
    turns(group, True)
    assert dict(group.standing().ends) == {}, "the abandoned read's answer is not taken"
    reader.held[1].set_result({("t", 0): 10, ("t", 1): 20})
    turns(group, True)
    s = group.standing()
    assert s.complete and dict(s.ends) == {("t", 0): 10, ("t", 1): 20}


def test_a_partition_listoffsets_did_not_answer_is_not_read_and_stays_unknown() -> None:
    reader = FakeReadEnds()
    group, admin, _ = make(reader=reader)
    real = admin.list_offsets

    def one_refused(requests: dict[TopicPartition, Any], **kwargs: Any) -> dict[TopicPartition, Future[Any]]:
        answers = real(requests, **kwargs)
        return {tp: done(KafkaException("NOT_LEADER_OR_FOLLOWER")) if tp.partition == 1 else f
                for tp, f in answers.items()}

    admin.list_offsets = one_refused  # type: ignore[method-assign]
    admin.committed = [("t", 0, 10)]
    turns(group, True)
    assert reader.asked == [{("t", 0): 10}]
    assert not group.standing().complete


def test_nothing_is_waited_for_and_a_late_answer_is_asked_again() -> None:
    group, admin, clock = make()
    admin.hold = True
    group.refresh(True)
    assert admin.asked == ["topics", "committed"]
    clock.now += 5
    group.refresh(True)
    assert admin.asked == ["topics", "committed"], "one request of a kind in flight"
    clock.now += 6
    admin.hold = False
    turns(group, True)  # the first ones are past timeout_s: forgotten, asked again
    assert admin.asked[2:] == ["topics", "committed", "ends"]
    assert group.standing().complete


def test_read_uncommitted_asks_for_the_high_watermark_and_an_empty_partition_is_at_its_end() -> None:
    group, admin, _ = make(**{"isolation.level": "read_uncommitted"})
    admin.ends = {("t", 0): 0, ("t", 1): 0}
    turns(group, True)
    assert admin.isolation == [IsolationLevel.READ_UNCOMMITTED]
    assert group.standing().complete and group.standing().left(set()) == {}


def test_under_a_pattern_the_topics_are_those_the_metadata_matches_and_those_assigned() -> None:
    group, admin, clock = make(["^in-.*"])
    admin.partitions = {"in-a": 1, "in-b": 1, "out": 1}
    admin.ends = {("in-a", 0): 5, ("in-b", 0): 6}
    admin.committed = [("in-b", 0, 6), ("out", 0, 3)]
    group.refresh(True)
    assert admin.asked == ["committed"], "no topic known yet: the committed read finds them"
    clock.now += 1.5
    turns(group, True)
    s = group.standing()
    assert s.complete and dict(s.ends) == {("in-a", 0): 5, ("in-b", 0): 6}
    assert dict(s.committed) == {("in-b", 0): 6}, "not the topic the pattern does not match"
    assert s.left(set()) == {("in-a", 0): None}
    group2, admin2, _ = make(["^in-.*"])
    admin2.partitions = {}  # the metadata has not the topic yet, the member was assigned it
    group2.note([("in-c", 0)])
    group2.refresh(True)
    assert admin2.asked[:1] == ["topics"], "an assigned topic is the group's"


def test_under_a_pattern_holding_every_partition_known_says_nothing_until_the_read_found_the_topics() -> None:
    """A member assigned in-a alone knows in-a's end early, but in-b (another member's) only
    once the committed offsets' read answers with the topics the pattern matches."""
    group, admin, _ = make(["^in-.*"])
    admin.partitions = {"in-a": 1, "in-b": 1}
    admin.ends = {("in-a", 0): 5, ("in-b", 0): 6}
    group.note([("in-a", 0)])
    turns(group, False)
    s = group.standing()
    assert dict(s.ends) == {("in-a", 0): 5}, "only the assigned topic is known so far"
    assert not s.mapped and not s.all_held({("in-a", 0)}), "in-b may exist: not judged yet"


def test_a_stopping_member_asks_for_nothing_more() -> None:
    group, admin, clock = make()
    group.abandon()
    clock.now += 100
    group.refresh(True)
    assert admin.asked == []


def test_a_settled_read_is_stable_waited_for_and_asked_again_while_a_transaction_is_pending() -> None:
    """Exactly-once's verdict: the offsets of a transaction whose commit returned reach the
    group with its markers; a stable read is answered only once none is pending."""
    group, admin, clock = make()
    turns(group, False)
    slept: list[float] = []
    group._sleep = lambda s: (slept.append(s), setattr(clock, "now", clock.now + s))  # type: ignore[assignment]
    group.abandon()  # the member is stopping: the settled read is its last word all the same
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    admin.unstable = 2
    s = group.settle(5.0)
    assert admin.asked[-3:] == ["stable"] * 3 and len(slept) == 2, "asked again until no error"
    assert s.complete and dict(s.committed) == {("t", 0): 10, ("t", 1): 20}


def test_a_settled_read_gives_up_at_its_bound_with_what_it_knew() -> None:
    group, admin, clock = make()
    admin.committed = [("t", 0, 4), ("t", 1, 20)]
    turns(group, True)
    group._sleep = lambda s: setattr(clock, "now", clock.now + s)  # type: ignore[assignment]
    admin.committed = [("t", 0, 10), ("t", 1, 20)]
    admin.unstable = 1_000
    s = group.settle(1.0)
    assert dict(s.committed) == {("t", 0): 4, ("t", 1): 20}, "never the pending answer"


# ---------------------------------------------------------------------- gaps no reader is handed
def test_a_gap_of_markers_on_a_partition_not_held_is_at_its_end_asked_once_per_committed_offset() -> None:
    """Issue 26: a transactional input ends with a commit marker no record's offset commits;
    the member holding t[1] committed 19 of 20 and the other waited out its timeout."""
    gaps = FakeGaps()
    group, admin, clock = make(gaps=gaps)
    admin.committed = [("t", 0, 10), ("t", 1, 19)]
    gaps.empty = {("t", 1)}
    turns(group, True, 4)
    s = group.standing()
    assert gaps.asked == [{("t", 1): (19, 20)}], "the one gap, once, not t[0] (at its end)"
    assert s.at(("t", 1)) == 20 and s.left(set()) == {}
    assert dict(s.committed) == {("t", 0): 10, ("t", 1): 19}, "the committed offsets as they are"
    for _ in range(3):
        clock.now += 1.5
        turns(group, True)
    assert len(gaps.asked) == 1, "not asked again while the committed offset stays"
    admin.committed = [("t", 0, 10), ("t", 1, 18)]  # a new offset (a reset): the answer was for 19
    gaps.empty = set()  # offset 18 a record
    clock.now += 1.5
    turns(group, True)
    assert gaps.asked[-1] == {("t", 1): (18, 20)}, "asked again at the new offset"
    assert group.standing().left(set()) == {("t", 1): 18}


def test_a_gap_with_a_record_is_left_and_held_or_wide_gaps_are_not_asked_about() -> None:
    gaps = FakeGaps()
    group, admin, _ = make(gaps=gaps)
    admin.ends = {("t", 0): 10 + GAP_MAX + 1, ("t", 1): 20}
    admin.committed = [("t", 0, 10), ("t", 1, 17)]
    turns(group, True, 4)
    assert gaps.asked == [{("t", 1): (17, 20)}], "t[0]'s gap is a member's work, not markers"
    assert group.standing().left(set()) == {("t", 0): 10, ("t", 1): 17}, "a record there: work left"
    group2, admin2, _ = make(gaps=(gaps2 := FakeGaps()))
    admin2.committed = [("t", 0, 9), ("t", 1, 19)]
    for _ in range(4):
        group2.refresh(True, held={("t", 0)})
    assert gaps2.asked == [{("t", 1): (19, 20)}], "this member judges what it holds itself"


def test_a_gap_left_unanswered_is_asked_again_and_settle_asks_what_was_not_asked() -> None:
    gaps = FakeGaps()
    group, admin, clock = make(gaps=gaps)
    admin.committed = [("t", 0, 9), ("t", 1, 19)]
    gaps.empty, gaps.unknown = {("t", 0), ("t", 1)}, {("t", 1)}
    turns(group, True, 4)
    assert group.standing().left(set()) == {("t", 1): 19}
    assert gaps.asked[-1] == {("t", 1): (19, 20)}, "asked again: no answer for it the first time"
    gaps.unknown = set()
    turns(group, True)
    assert group.standing().left(set()) == {}
    gaps.hold = True  # an answer in flight when the member stops: settle asks again, and waits
    admin.committed = [("t", 0, 8), ("t", 1, 19)]
    clock.now += 1.5
    turns(group, True, 2)
    group.abandon()
    gaps.hold = False
    s = group.settle(1.0)
    assert gaps.asked[-1] == {("t", 0): (8, 10)} and s.left(set()) == {}


def test_an_admin_client_whose_ask_of_partition_ends_came_back_short_is_replaced() -> None:
    """STALE_LEADERS (runtime/kafka/admin.py): a client whose metadata names a killed leader
    spins on it at every ask, so one whose ask of ends came back short, or not at all, is
    replaced before the next ask; one answered in full is kept."""
    clock, admin, reader = Clock(), FakeAdmin(), FakeReadEnds()
    made: list[FakeAdmin] = []

    def factory() -> FakeAdmin:
        made.append(admin)
        return admin

    group = GroupOffsets({"group.id": "g"}, ["t"], interval_s=1.0, timeout_s=10.0, clock=clock,
                         admin=factory, gaps=FakeGaps(), read_ends=reader, committed=admin.read_committed)
    reader.unknown = {("t", 1)}  # no answer for one partition
    turns(group, False)
    assert admin.asked == ["topics", "ends", "ends"] and len(made) == 1, \
        "asked again at once, but at most one new client an interval"
    clock.now += 1
    turns(group, False)
    assert admin.asked[-1] == "ends" and len(made) == 2, "asked again, by a new client"
    reader.unknown = set()
    for _ in range(3):
        clock.now += 1
        turns(group, False)
    assert group.standing().mapped
    assert len(made) == 3, "the client that answered in full is kept"
    admin.partitions["t"] = 3  # a new partition, and an ask of its end that is never answered
    admin.ends[("t", 2)] = 5
    clock.now += 1
    group.refresh(False)  # the metadata names it
    admin.hold = True
    group.refresh(False)  # its end is asked for
    assert admin.asked[-1] == "ends" and len(made) == 3
    clock.now += 11  # past timeout_s: abandoned
    admin.hold = False
    group.refresh(False)
    assert len(made) == 4, "an ask of ends not answered in time: a new client"


def test_an_admin_client_whose_ask_of_the_topics_timed_out_is_replaced_and_a_missing_topic_is_not() -> None:
    """STALE_LEADERS (runtime/kafka/admin.py): DescribeTopics waits for the node the client's
    metadata names as the controller, and spins connecting to it while it is down (the cluster
    matrix's batch rows: ~12,000 refused connects a second for minutes). An ask of the topics
    that timed out, or was not answered in time, gets a new client; a topic that is not there is
    an answer, not a stale client."""
    clock, admin = Clock(), FakeAdmin()
    made: list[FakeAdmin] = []

    def factory() -> FakeAdmin:
        made.append(admin)
        return admin

    group = GroupOffsets({"group.id": "g"}, ["t", "absent"], interval_s=1.0, timeout_s=10.0, clock=clock,
                         admin=factory, gaps=FakeGaps(), read_ends=FakeReadEnds(),
                         committed=admin.read_committed)
    for _ in range(3):
        turns(group, False)
        clock.now += 1
    assert group.standing().mapped and len(made) == 1, "'absent' is not there: the same client"
    admin.no_controller = True
    turns(group, False)  # asked, answered with the timeout, taken in
    clock.now += 1
    admin.no_controller = False
    turns(group, False)
    assert admin.asked[-1] == "topics" and len(made) == 2, "asked again by a new client"
    clock.now += 1
    turns(group, False)
    assert len(made) == 2, "the client that answered is kept"
    admin.hold = True
    clock.now += 1
    turns(group, False)  # asked, never answered
    assert len(made) == 2
    clock.now += 11  # past timeout_s: abandoned
    admin.hold = False
    turns(group, False)
    assert admin.asked[-1] == "topics" and len(made) == 3, "not answered in time: a new client"
