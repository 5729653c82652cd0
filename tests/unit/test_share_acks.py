"""Share groups (KIP-932) without a broker: the config checks, the acknowledgement tracker
(every way a batch ends becomes one acknowledgement of its records), and the share consumer
adapter's barrier (no poll while a record of the last one is not acknowledged) on a fake
client. The real thing, with real processes on Apache Kafka: tests/integration/test_share_groups.py."""

from __future__ import annotations

from typing import Any

import fakes
import pytest
from confluent_kafka import AcknowledgeType
from fakes import partition

from runtime.config import Settings, share_group_problems
from runtime.errors import ConfigError
from runtime.kafka.consumer import Fetched
from runtime.kafka.properties import share_consumer_properties
from runtime.kafka.share_consumer import Outcome, ShareGroupConfig, ShareGroupConsumer
from runtime.supervisor.group.commits import ShareCommitter, committer_for
from runtime.supervisor.partition.acknowledgements import AckTracker, Intent


def _settings(**kafka: Any) -> Settings:
    workers = kafka.pop("workers", {"plugin": "probe", "ordering": "unordered"})
    supervisor = kafka.pop("supervisor", {})
    dead_letter = kafka.pop("dead_letter", {})
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"], "group_type": "share",
                  **kafka},
        "workers": workers, "supervisor": supervisor, "dead_letter": dead_letter})


# ---------------------------------------------------------------------------- config
def test_a_share_group_refuses_what_it_cannot_honour_one_line_each() -> None:
    s = _settings(workers={"plugin": "probe", "ordering": "key"}, supervisor={"stop_when_caught_up": True},
                  consumer={"auto.offset.reset": "latest", "group.protocol": "consumer"})
    problems = share_group_problems(s)
    assert len(problems) == 4
    assert problems[0].startswith('kafka.group_type = "share" hands records out in no order')
    assert "stop_when_caught_up" in problems[1]
    assert problems[2].startswith("kafka.consumer.auto.offset.reset does not apply")
    assert "share.auto.offset.reset" in problems[2]
    assert all("\n" not in p for p in problems)


def test_the_session_and_heartbeat_the_share_client_refuses_are_one_line_each() -> None:
    """librdkafka's share consumer refuses them when it is built: without this check the run
    ended in a traceback ("internal error") instead of a line `ringmaster check` says."""
    problems = share_group_problems(_settings(consumer={"session.timeout.ms": 6000,
                                                        "heartbeat.interval.ms": 500}))
    assert [p.split(" ", 1)[0] for p in problems] == ["kafka.consumer.heartbeat.interval.ms",
                                                      "kafka.consumer.session.timeout.ms"]
    assert "share.session.timeout.ms" in problems[1]
    ShareConsumer = pytest.importorskip("confluent_kafka").ShareConsumer
    for key, value in (("session.timeout.ms", 6000), ("heartbeat.interval.ms", 500)):
        with pytest.raises(ValueError, match="not supported"):  # what the check spares the user
            ShareConsumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", key: value})


def test_a_consumer_group_and_a_clean_share_group_have_no_problem() -> None:
    assert share_group_problems(_settings()) == []
    assert share_group_problems(_settings(group_type="consumer", workers={"plugin": "probe"})) == []


def test_load_settings_refuses_a_share_group_in_partition_order(tmp_path: Any) -> None:
    from runtime.config import load_settings
    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "x:1"\ngroup_id = "g"\ntopics = ["t"]\n'
                   'group_type = "share"\n[workers]\nplugin = "json"\n')
    with pytest.raises(ConfigError, match=r'set workers\.ordering = "unordered"'):
        load_settings(cfg, env={}, check_plugin=False)


def test_share_consumer_properties_acknowledge_explicitly() -> None:
    props = share_consumer_properties(_settings(consumer={"fetch.max.bytes": 1000}))
    assert props["share.acknowledgement.mode"] == "explicit"
    assert props["group.id"] == "g" and props["fetch.max.bytes"] == 1000
    assert "enable.auto.commit" not in props and "auto.offset.reset" not in props


# ---------------------------------------------------------------------------- the tracker
def test_a_done_batch_is_accepted_once_and_a_duplicate_result_accepts_nothing() -> None:
    t = AckTracker()
    t.register(1, 10, 19)
    t.register(2, 5, 7)  # a redelivered record below what came before: no order in a share group
    assert t.take_intents() == []
    assert t.complete(2)
    assert not t.complete(2)
    assert t.take_intents() == [Intent(5, 7, Outcome.ACCEPT)]
    assert t.unfinished == 1 and t.committable is None and not t.needs_commit()


def test_a_rewind_releases_what_is_not_done_and_keeps_what_is() -> None:
    t = AckTracker()
    t.register(1, 0, 4)
    t.register(2, 5, 9)
    t.complete(1)
    assert t.restart_offset() == 5
    t.discard_unfinished()
    assert t.take_intents() == [Intent(0, 4, Outcome.ACCEPT), Intent(5, 9, Outcome.RELEASE)]
    assert not t.complete(2), "a late result of a released batch acknowledges nothing"


def test_a_deferral_keeps_what_is_not_done_and_a_batch_given_up_is_released_or_rejected() -> None:
    t = AckTracker()
    t.register(1, 0, 4)
    t.register(2, 5, 9)
    t.register(3, 10, 10)
    assert t.give_up(3, Outcome.REJECT) and not t.give_up(3)
    t.discard_unfinished(keep=True)
    assert t.take_intents() == [Intent(10, 10, Outcome.REJECT), Intent(0, 4, None), Intent(5, 9, None)]


def test_a_bisected_batch_is_accepted_part_by_part() -> None:
    t = AckTracker()
    t.register(1, 0, 9)
    t.split(1, [(2, 0, 4), (3, 5, 9)])
    assert not t.is_pending(1) and t.unfinished == 2
    t.complete(3)
    t.complete(2)
    assert t.take_intents() == [Intent(5, 9, Outcome.ACCEPT), Intent(0, 4, Outcome.ACCEPT)]
    with pytest.raises(ValueError):
        t.split(1, [(4, 0, 1)])


def test_share_partitions_get_an_ack_tracker() -> None:
    assert isinstance(partition(("t", 0), 10, share=True).tracker, AckTracker)
    assert not isinstance(partition(("t", 0), 10).tracker, AckTracker)


# ---------------------------------------------------------------------------- the adapter
class _Msg:
    def __init__(self, partition: int, offset: int, count: int = 1) -> None:
        self._p, self._o, self._n = partition, offset, count

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o

    def delivery_count(self) -> int:
        return self._n


class _Client:
    """A ShareConsumer as confluent-kafka's behaves in explicit mode: poll() refuses while a
    record of the previous poll is not acknowledged; commit_async() sends what was acknowledged
    and serves the broker's answers (``refuse``: the next answer is an error)."""

    def __init__(self, polls: list[list[_Msg]]) -> None:
        self.polls = polls
        self.out: set[tuple[int, int]] = set()
        self.acks: list[tuple[int, int, int]] = []
        self.pending: dict[tuple[str, int], set[int]] = {}
        self.sent = 0
        self.refuse: Exception | None = None
        self.closed = False

    def set_acknowledgement_commit_callback(self, cb: Any) -> None:
        self.cb = cb

    def subscribe(self, topics: list[str]) -> None:
        pass

    def poll(self, timeout: float) -> list[_Msg]:
        assert not self.out, "poll() with records of the last poll not acknowledged"
        batch = self.polls.pop(0) if self.polls else []
        self.out = {(m.partition(), m.offset()) for m in batch}
        return batch

    def acknowledge(self, m: _Msg, kind: int) -> None:
        self.out.discard((m.partition(), m.offset()))
        self.acks.append((m.partition(), m.offset(), kind))
        self.pending.setdefault(("t", m.partition()), set()).add(m.offset())

    def commit_async(self) -> None:
        from confluent_kafka import TopicPartition
        if self.pending:
            self.sent += 1
            answer, self.pending = self.pending, {}
            refuse, self.refuse = self.refuse, None
            self.cb({TopicPartition(t, p): offs for (t, p), offs in answer.items()}, refuse)

    def commit_sync(self, timeout: float) -> None:
        self.commit_async()

    def close(self) -> None:
        self.closed = True


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _consumer(polls: list[list[_Msg]], lock_s: float = 30.0, limit: int = 5,
              clock: Any = None) -> tuple[ShareGroupConsumer, _Client, list[list[Any]]]:
    client = _Client(polls)
    waits: list[float] = []
    c = ShareGroupConsumer({"bootstrap.servers": "x:1", "group.id": "g"}, waits.append, client=client,
                           group=ShareGroupConfig(lock_s, limit), clock=clock or _Clock())
    assigned: list[list[Any]] = []
    c.subscribe(["t"], assigned.append, lambda tps: None, lambda tps: None)
    return c, client, assigned


def _offsets(f: Any, p: int = 0) -> list[int]:
    return [m.offset() for m in f.runs.get(("t", p), [])]


def test_no_poll_while_a_record_is_not_acknowledged_and_acks_go_out_batch_by_batch() -> None:
    """Issue 44: acknowledgements used to wait for the whole poll; a member SIGKILLed then left
    every record it had processed to run again elsewhere (8,499 duplicates)."""
    c, client, assigned = _consumer([[_Msg(0, 3), _Msg(0, 1), _Msg(0, 2)], [_Msg(0, 9)]])
    assert c.consume(500, 0.0).count == 0, "a new partition is announced; its records come next call"
    assert assigned == [[("t", 0)]]
    got = c.consume(500, 0.0)
    assert _offsets(got) == [1, 2, 3], "offset order, as the intake expects"
    assert c.consume(500, 0.0).count == 0 and c.held == 3, "the barrier: no poll"
    assert c.acknowledge(("t", 0), 1, 2, Outcome.ACCEPT) == 2
    assert client.sent == 0, "recorded: sent with the next tick's"
    assert c.consume(500, 0.0).count == 0 and client.sent == 1, "sent, with a record of the poll still out"
    assert c.counts.accepted == 2, "counted on the broker's answer"
    assert c.acknowledge(("t", 0), 3, 3, Outcome.RELEASE) == 1
    assert _offsets(c.consume(500, 0.0)) == [9], "sent; nothing held: the next poll (a known partition)"
    assert c.counts.as_dict() == {"acquired": 4, "accepted": 2, "released": 1, "rejected": 0,
                                  "lock_expiries": 0}
    assert client.acks == [(0, 1, AcknowledgeType.ACCEPT), (0, 2, AcknowledgeType.ACCEPT),
                           (0, 3, AcknowledgeType.RELEASE)]


def test_the_counts_are_the_brokers_answers_and_the_locks_clock_and_they_add_up() -> None:
    """An acknowledgement refused by the broker, or sent after the record's lock ended (the
    broker answers those without an error: Apache Kafka 4.4), is a lock expiry, never an
    accept; nothing is counted before the answer. acquired = accepted + released + rejected +
    lock_expiries once nothing is held or unanswered."""
    from confluent_kafka import KafkaError, KafkaException
    clock = _Clock()
    c, client, _ = _consumer([[_Msg(0, o) for o in range(6)]], lock_s=10.0, clock=clock)
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    c.acknowledge(("t", 0), 0, 1, Outcome.ACCEPT)
    assert c.counts.accepted == 0
    client.refuse = KafkaException(KafkaError(KafkaError.INVALID_RECORD_STATE))
    c.consume(500, 0.0)
    assert (c.counts.accepted, c.counts.lock_expiries) == (0, 2), "refused: expired"
    c.acknowledge(("t", 0), 2, 2, Outcome.REJECT)
    clock.now += 10.0  # the lock has ended
    c.acknowledge(("t", 0), 3, 5, Outcome.ACCEPT)
    c.consume(500, 0.0)
    counts = c.counts
    assert (counts.rejected, counts.accepted, counts.lock_expiries) == (1, 0, 5), counts
    assert c.held == 0 and counts.acquired == counts.settled == 6


def test_a_poll_is_handed_out_no_more_than_the_loop_asks_and_the_rest_released_before_its_lock_ends() -> None:
    """The loop takes what its workers start well within the lock (intake.py); what it does
    not take by the last quarter of the lock is released, so that it runs with a fresh lock
    (here or elsewhere), not after its lock ran out in a ring (issue 44: every record twice)."""
    clock = _Clock()
    c, client, _ = _consumer([[_Msg(0, o) for o in range(10)]], lock_s=20.0, clock=clock)
    c.consume(4, 0.0)
    assert _offsets(c.consume(4, 0.0)) == [0, 1, 2, 3]
    assert c.consume(0, 0.0).count == 0 and c.held == 10
    clock.now += 15.0  # the last quarter of the lock
    got = c.consume(0, 0.0)
    assert got.count == 0 and c.held == 4, "the six not handed out released"
    assert [o for _, o, k in client.acks] == list(range(4, 10))
    assert all(k == AcknowledgeType.RELEASE for _, _, k in client.acks)
    assert c.counts.released == 6


def test_a_deferred_record_is_kept_not_released_and_handed_out_again_on_resume() -> None:
    """A release spends a delivery (issue 44: an outage released records again and again, and
    the broker archived them at its limit): a deferral's records are kept and run again here."""
    c, client, _ = _consumer([[_Msg(0, 1), _Msg(0, 2)]])
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    c.pause([("t", 0)])
    assert c.keep(("t", 0), 1, 2) == 2
    assert c.consume(500, 0.0).count == 0 and client.acks == [], "paused: kept, no poll"
    c.resume([("t", 0)])
    assert _offsets(c.consume(500, 0.0)) == [1, 2] and client.acks == []


def test_a_record_at_its_last_delivery_is_never_released_and_is_dead_lettered_before_its_lock_ends() -> None:
    clock = _Clock()
    c, client, _ = _consumer([[_Msg(0, 1, count=3), _Msg(0, 2, count=2)]], lock_s=20.0, limit=3, clock=clock)
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    assert c.acknowledge(("t", 0), 1, 2, Outcome.RELEASE) == 1, "the one at its last delivery is kept"
    assert [(o, k) for _, o, k in client.acks] == [(2, AcknowledgeType.RELEASE)]
    c.pause([("t", 0)])
    assert not c.consume(500, 0.0).last_deliveries
    clock.now += 15.0
    due = c.consume(500, 0.0)
    assert [m.offset() for m in due.last_deliveries[("t", 0)]] == [1], "the loop dead-letters it"
    assert not c.consume(500, 0.0).last_deliveries, "once"
    c.close(5.0)
    assert [(o, k) for _, o, k in client.acks] == [(2, AcknowledgeType.RELEASE)], "never released"


def test_a_record_at_its_last_delivery_not_handed_out_yet_is_handed_out_first() -> None:
    clock = _Clock()
    c, _, _ = _consumer([[_Msg(0, 1), _Msg(0, 2), _Msg(0, 3, count=5)]], lock_s=20.0, clock=clock)
    c.consume(1, 0.0)
    assert _offsets(c.consume(1, 0.0)) == [3], "the last delivery first"
    clock.now += 15.0
    got = c.consume(0, 0.0)
    assert got.count == 0 and not got.last_deliveries and c.held == 1, "the others released"


def test_a_crashing_records_letter_is_this_members_while_its_lock_holds_or_at_its_last_delivery() -> None:
    clock = _Clock()
    c, _, _ = _consumer([[_Msg(0, 1), _Msg(0, 2, count=5)]], lock_s=20.0, clock=clock)
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    assert c.may_dead_letter(("t", 0), 1) and c.may_dead_letter(("t", 0), 2)
    clock.now += 16.0
    assert not c.may_dead_letter(("t", 0), 1), "another member may get it once the lock ends"
    assert c.may_dead_letter(("t", 0), 2), "no other member will get it"
    assert not c.may_dead_letter(("t", 0), 7), "not held here"


def test_records_of_a_paused_partition_stay_and_close_releases_the_rest() -> None:
    c, client, _ = _consumer([[_Msg(0, 1), _Msg(1, 5)]])
    c.consume(500, 0.0)
    c.pause([("t", 1)])
    got = c.consume(500, 0.0)
    assert list(got.runs) == [("t", 0)] and got.count == 1
    assert c.consume(500, 0.0).count == 0, "paused: no poll"
    c.release(("t", 1), [], False)  # an operator's pause: what is not handed out goes to the others
    assert (1, 5, AcknowledgeType.RELEASE) in client.acks
    assert c.close(5.0) and client.closed
    assert (0, 1, AcknowledgeType.RELEASE) in client.acks and c.held == 0


def test_the_share_committer_hands_intents_over_every_tick() -> None:
    c, client, _ = _consumer([[_Msg(0, 1), _Msg(0, 2), _Msg(0, 3)]])
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    p = partition(("t", 0), 10, share=True)
    committer = committer_for(True, c, {p.tp: p}, 60.0, lambda: 0.0, 1.0)
    assert isinstance(committer, ShareCommitter)
    p.register([(7, 1, 2), (8, 3, 3)], 0.0)
    p.done(7, 2, 0, 0, 0, 0.0)
    p.tracker.discard_unfinished(keep=True)
    committer.commit_if_due()
    c.consume(500, 0.0)
    assert c.held == 1 and client.sent == 1 and [o for _, o, _ in client.acks] == [1, 2]
    assert committer.share_counts() == {**c.counts.as_dict(), "held": 1, "kept": 0, "waiting": 0,
                                        "unanswered": 0}


def test_the_share_committer_releases_what_is_not_done_at_a_stop() -> None:
    c, _, _ = _consumer([[_Msg(0, 1), _Msg(0, 2), _Msg(0, 3)]])
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    p = partition(("t", 0), 10, share=True)
    committer = committer_for(True, c, {p.tp: p}, 60.0, lambda: 0.0, 1.0)
    p.register([(1, 1, 1), (2, 2, 3)], 0.0)
    p.done(1, 1, 0, 0, 0, 0.0)
    answers = committer.commit([p], asynchronous=False)  # the end of a release: fenced, batches back
    # Sent and answered before the stop's last status, not with a consume() that never comes.
    assert c.counts.accepted == 1 and c.counts.released == 2 and c.held == 0
    assert answers[p.tp].offset is None


# ---------------------------------------------------------------------------- delivery counts
def test_delivery_counts_reach_the_plugin_and_the_dead_letter() -> None:
    from runtime.execution.run import Failure, copy_records
    from runtime.plugin import Record
    from runtime.transport.frames import Columns, batch_head, decode_frame, encode_columns, peek_header
    from runtime.worker.decoding import records_of

    cols = Columns(5, None, [b"k", None], [b"v", b"w"], None, 0, [1, 2])
    frame_bytes = encode_columns(batch_head(9, 0, 1, "t", 0, [1, 3]), cols)
    assert peek_header(frame_bytes) == (9, 0, 1)
    frame = decode_frame(frame_bytes)
    assert frame is not None and frame.delivery_counts == [1, 3]
    records = records_of(frame)
    assert [r.delivery_count for r in records] == [1, 3]
    assert [r.delivery_count for r in copy_records(records)] == [1, 3], "the plugin's copies carry it"
    plain = decode_frame(encode_columns(batch_head(9, 0, 1, "t", 0), cols))
    assert plain is not None and [r.delivery_count for r in records_of(plain)] == [None, None]
    assert Record("t", 0, 1, None, b"", None, (0, 0)).delivery_count is None
    letter = Failure(records[1], "ValueError", "bad", "", 3).dead_letter("w", 1_000_000)
    assert dict(letter.headers)["ringmaster.delivery_count"] == b"3"


# ---------------------------------------------------------------------------- the loop, on fakes
def test_the_supervisor_accepts_records_only_once_their_batch_is_done() -> None:
    """The share consumer under the real supervisor's rooms (fake pool and client): records
    are cut into batches and sent to a ring; nothing is acknowledged until the worker reports
    the batch DONE, then every record of it is accepted, and only then does the next poll run."""
    from fakes import TP0, Clock, FakePool, msgs

    from runtime.supervisor.daemon.loop import Supervisor
    from runtime.transport.frames import DONE, Result, decode_frame, encode_result

    client = _Client([msgs(TP0, 0, 1, 2, 3), msgs(TP0, 4)])  # type: ignore[list-item]
    consumer = ShareGroupConsumer({"bootstrap.servers": "x:1", "group.id": "g"}, lambda t: None,
                                  client=client)
    pool = FakePool(1)
    s = _settings(workers={"plugin": "workers.enrich", "processes": 1, "ordering": "unordered"})
    sup = Supervisor(s, consumer, pool, pool.epochs, clock=Clock())
    sup.workforce.start_all()
    consumer.subscribe(["t"], sup.rebalance.on_assign, sup.rebalance.on_revoke, sup.rebalance.on_lost)
    fakes.fetch(sup)  # the partition is announced
    fakes.fetch(sup)  # its records
    fakes.cut(sup)
    sup.scheduler.dispatch(sup.capacity())
    frames = pool.handles[0].ring.take()
    assert frames and client.acks == []
    sup.commits.commit_if_due()
    fakes.fetch(sup)
    assert client.acks == [] and consumer.held == 4, "not acknowledged, no new poll, before DONE"
    for raw in frames:
        f = decode_frame(raw)
        assert f is not None and f.delivery_counts == [1] * len(f.columns)
        pool.handles[0].results.messages.append(encode_result(Result(DONE, f.batch_id, f.slot, f.epoch,
                                                                     processed=len(f.columns))))
    sup.applier.collect()
    sup.commits.commit_if_due()
    assert [(o, k) for _, o, k in client.acks] == [(o, AcknowledgeType.ACCEPT) for o in range(4)]
    fakes.fetch(sup)
    assert consumer.counts.acquired == 5, "the next poll once all of the last one is acknowledged"


def test_a_share_groups_partitions_announced_are_no_rebalance() -> None:
    """docs/share-groups.md: nothing is ever revoked; status must not say "rebalances 1"."""
    from fakes import Clock, FakeConsumer, FakePool

    from runtime.supervisor.daemon.loop import Supervisor

    class ShareConsumer(FakeConsumer):
        counts: dict[str, int] = {}

        lock_s = 30.0

        def acknowledge(self, tp: Any, first: int, last: int, outcome: Any, /) -> int:
            return 0

        def keep(self, tp: Any, first: int, last: int, /) -> int:
            return 0

        def may_dead_letter(self, tp: Any, offset: int, /) -> bool:
            return True

        def settle(self, timeout_s: float, /) -> None:
            pass

        def holding(self) -> dict[str, int]:
            return {}

    for group_type, expected in (("share", 0), ("consumer", 1)):
        pool = FakePool(1)
        consumer = ShareConsumer() if group_type == "share" else FakeConsumer()
        sup = Supervisor(_settings(group_type=group_type), consumer, pool, pool.epochs, clock=Clock())
        sup.subscribe()
        consumer.callbacks["on_assign"]([("t", 0)])  # inside a consume(): its first record came
        sup.rebalanced(Fetched())
        assert ("t", 0) in sup.partitions and sup.rebalance.rebalances == expected, group_type


# ---------------------------------------------------------------------------- issue 44, on fakes
def _share_supervisor(polls: list[list[Any]], lock_s: float = 30.0, limit: int = 5, desk: bool = True,
                      **workers: Any) -> tuple[Any, Any, Any, Any, Any]:
    """The real supervisor's rooms over the real share consumer, on a fake client, pool,
    clock and dead-letter producer."""
    from fakes import Clock, FakePool, make_desk

    from runtime.supervisor.daemon.loop import Supervisor
    clock = Clock()
    client = _Client(polls)
    consumer = ShareGroupConsumer({"bootstrap.servers": "x:1", "group.id": "g"}, lambda t: None,
                                  client=client, group=ShareGroupConfig(lock_s, limit), clock=clock)
    pool = FakePool(1)
    letters, producer = make_desk(clock) if desk else (None, None)
    s = _settings(workers={"plugin": "workers.enrich", "processes": 1, "ordering": "unordered",
                           "batch_max_wait_ms": 0, **workers},
                  **({"dead_letter": {"topic": "dlq", "max_crashes": 1}} if desk else {}))
    sup = Supervisor(s, consumer, pool, pool.epochs, clock=clock, dead_letters=letters)
    sup.workforce.start_all()
    consumer.subscribe(["t"], sup.rebalance.on_assign, sup.rebalance.on_revoke, sup.rebalance.on_lost)
    fakes.fetch(sup)  # the partition is announced
    return sup, consumer, client, pool, (clock, producer)


def _share_msgs(offsets: range, count: int = 1) -> list[Any]:
    from confluent_kafka import Message
    return [Message(topic="t", partition=0, offset=o, value=f"v{o}".encode(), timestamp=(1, 0),
                    delivery_count=count) for o in offsets]


def _tick(sup: Any) -> None:
    """The loop's tick (daemon/loop.py), its workers' and operator's steps left out."""
    fakes.fetch(sup)
    fakes.cut(sup)
    sup.applier.collect()
    sup.scheduler.dispatch(sup.capacity())
    sup.deliver_dead_letters()
    sup.starts.read_again()
    sup.flow.reconcile()
    sup.commits.commit_if_due()


def _defer(pool: Any, frames: list[bytes], delay_ms: int) -> None:
    """The worker reports each frame DEFERRED by the plugin's Backoff."""
    from runtime.transport.frames import DEFERRED, Result, decode_frame, encode_result
    for raw in frames:
        f = decode_frame(raw)
        assert f is not None
        pool.handles[0].results.messages.append(encode_result(Result(
            DEFERRED, f.batch_id, f.slot, f.epoch, detail="downstream down", cause="backoff",
            delay_ms=delay_ms)))


def _crash(sup: Any, death: Any) -> None:
    """A worker's death, as the loop's manage_workers hands it on."""
    sup.applier.apply(sup.results.redeliver(death, sup.acks.may_dead_letter))


def test_a_share_batch_that_keeps_crashing_workers_is_split_into_records_one_letter_with_its_count() -> None:
    from runtime.supervisor.workers.workforce import Death
    from runtime.transport.frames import DONE, Result, decode_frame, encode_result
    sup, consumer, _client, pool, (_clock, producer) = _share_supervisor([_share_msgs(range(8), count=2)],
                                                                         batch_max_records=8)
    _tick(sup)
    crashes = 0
    for _ in range(20):
        for raw in pool.handles[0].ring.take():
            f = decode_frame(raw)
            assert f is not None
            if 5 in f.columns.offset_list():
                crashes += 1
                _crash(sup, Death(0, f.batch_id, "killed by SIGKILL"))
                break
            pool.handles[0].results.messages.append(encode_result(Result(DONE, f.batch_id, f.slot, f.epoch,
                                                                         processed=len(f.columns))))
        _tick(sup)
    # max_crashes 1, a first crash counted from its delivery count 2: split into 8 at once,
    # then the record alone: 2 crashes, not one a bisection level.
    assert crashes == 2
    (letter,) = producer.sent
    assert letter["headers"]["ringmaster.error.type"] == b"WorkerCrashed"
    assert letter["headers"]["ringmaster.delivery_count"] == b"2"
    producer.deliver_next(None)
    _tick(sup)
    _tick(sup)
    assert consumer.counts.accepted == 8 and consumer.held == 0


def test_a_crashing_record_whose_lock_ends_first_is_released_not_dead_lettered() -> None:
    """Another member may be handed it once the lock ends, and write a letter of its own."""
    from runtime.supervisor.workers.workforce import Death
    from runtime.transport.frames import decode_frame
    sup, _consumer, client, pool, (clock, producer) = _share_supervisor([_share_msgs(range(1), count=2)],
                                                                        lock_s=20.0)
    _tick(sup)
    (raw,) = pool.handles[0].ring.take()
    f = decode_frame(raw)
    assert f is not None
    clock.now += 16.0  # within the lock's last quarter
    _crash(sup, Death(0, f.batch_id, "killed by SIGKILL"))
    _tick(sup)
    assert producer.sent == []
    assert [(o, k) for _, o, k in client.acks] == [(0, AcknowledgeType.RELEASE)]


def test_a_record_deferred_at_its_last_delivery_is_dead_lettered_before_its_lock_ends() -> None:
    """The plugin's Backoff holds the partition; the record is kept, not released, and when its
    lock nears its end at its last delivery the supervisor dead-letters it, with its count and
    what held it, then accepts it."""
    sup, consumer, client, pool, (clock, producer) = _share_supervisor([_share_msgs(range(3), count=5)],
                                                                       lock_s=20.0)
    _tick(sup)
    _defer(pool, pool.handles[0].ring.take(), 60_000)
    _tick(sup)
    _tick(sup)
    assert consumer.holding()["kept"] == 3 and client.acks == [], "kept, never released"
    clock.now += 16.0
    _tick(sup)
    _tick(sup)
    assert len(producer.sent) == 3
    h = producer.sent[0]["headers"]
    assert h["ringmaster.error.type"] == b"DeliveryLimitReached" and h["ringmaster.delivery_count"] == b"5"
    assert b"downstream down" in h["ringmaster.error.message"]
    for _ in range(3):
        producer.deliver_next(None)
    _tick(sup)
    _tick(sup)
    assert [k for _, _, k in client.acks] == [AcknowledgeType.ACCEPT] * 3
    assert consumer.counts.accepted == 3 and consumer.held == 0


def test_the_loop_takes_what_its_workers_start_within_the_lock_and_hands_back_what_waits_behind() -> None:
    """Before any cost is learnt, a batch per worker; then what the workers start within half
    the lock. As the lock nears its end, the batches still in a lane are released (their
    records run elsewhere, or here later, with a fresh lock), and the loop takes less."""
    from runtime.transport.frames import DONE, Result, decode_frame, encode_result
    sup, consumer, client, pool, (clock, _) = _share_supervisor([_share_msgs(range(100))], lock_s=20.0,
                                                                batch_max_records=10)
    _tick(sup)
    assert consumer.holding()["waiting"] == 90, "a batch for the one worker"
    (raw,) = pool.handles[0].ring.take()
    f = decode_frame(raw)
    assert f is not None
    pool.handles[0].results.messages.append(encode_result(Result(DONE, f.batch_id, f.slot, f.epoch,
                                                                 processed=10, busy_ms=2000.0)))
    for _ in range(8):  # 200 ms a record learnt: 20 s × 0.5 / 0.2 s = 50 records out at once
        _tick(sup)
    waiting = consumer.holding()["waiting"]
    assert 40 <= waiting < 90, "more taken, but no more than 50 out"
    assert sup.intake.within_the_lock(10_000) <= 50 - (90 - waiting), "what the loop may take more"
    in_lanes = sum(b.count for lane in sup.scheduler._lanes.values() for b in lane.pending)
    assert in_lanes > 0
    share = sup.intake.lock_share
    clock.now += 15.5
    _tick(sup)
    _tick(sup)
    released = [o for _, o, k in client.acks if k == AcknowledgeType.RELEASE]
    assert len(released) == waiting + in_lanes, "what waited here and what waited in a lane"
    assert sup.intake.lock_share <= share / 2, "at most half: what started of what was taken"


def test_a_deferred_batch_is_kept_by_this_member_and_an_operator_pause_releases_it() -> None:
    """A deferral (the plugin's Backoff here; an outage alike) holds the partition: its records
    are kept by the share consumer, not released (a release spends one of their deliveries,
    issue 44), and run again here when the wait ends. An operator's pause hands them to the
    other members at once: released."""
    from runtime.supervisor.partition.partition import PauseReason
    from runtime.transport.frames import decode_frame
    sup, consumer, client, pool, (clock, _) = _share_supervisor([_share_msgs(range(3))], lock_s=20.0)
    _tick(sup)
    _defer(pool, pool.handles[0].ring.take(), 2_000)
    _tick(sup)
    _tick(sup)
    assert consumer.holding()["kept"] == 3 and client.acks == [], "kept, not released"
    clock.now += 2.5  # the back-off is over: run again here, from what was kept
    _tick(sup)
    _tick(sup)
    frames = pool.handles[0].ring.take()
    assert sum(len(f.columns) for f in map(decode_frame, frames) if f is not None) == 3
    assert client.acks == [], "still nothing released"
    _defer(pool, frames, 2_000)  # deferred again, then an operator pauses the partition during the wait
    _tick(sup)
    _tick(sup)
    assert consumer.holding()["kept"] == 3 and client.acks == []
    sup.partitions[("t", 0)].rewind(PauseReason.OPERATOR, "paused by an operator")  # as operator.py does
    _tick(sup)
    _tick(sup)
    assert sorted(o for _, o, k in client.acks if k == AcknowledgeType.RELEASE) == [0, 1, 2]
    assert consumer.held == 0
