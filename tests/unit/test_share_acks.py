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
from runtime.kafka.share_consumer import Outcome, ShareGroupConsumer
from runtime.supervisor.group.commits import ShareCommitter, committer_for
from runtime.supervisor.partition.acknowledgements import AckTracker, Intent


def _settings(**kafka: Any) -> Settings:
    workers = kafka.pop("workers", {"plugin": "probe", "ordering": "unordered"})
    supervisor = kafka.pop("supervisor", {})
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"], "group_type": "share",
                  **kafka},
        "workers": workers, "supervisor": supervisor})


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
    record of the previous poll is not acknowledged."""

    def __init__(self, polls: list[list[_Msg]]) -> None:
        self.polls = polls
        self.out: set[tuple[int, int]] = set()
        self.acks: list[tuple[int, int, int]] = []
        self.sent = 0
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

    def commit_async(self) -> None:
        self.sent += 1

    def close(self) -> None:
        self.closed = True


def _consumer(polls: list[list[_Msg]]) -> tuple[ShareGroupConsumer, _Client, list[list[Any]]]:
    client = _Client(polls)
    waits: list[float] = []
    c = ShareGroupConsumer({"bootstrap.servers": "x:1", "group.id": "g"}, waits.append, client=client)
    assigned: list[list[Any]] = []
    c.subscribe(["t"], assigned.append, lambda tps: None, lambda tps: None)
    return c, client, assigned


def test_no_poll_while_a_record_is_not_acknowledged_and_acks_go_out_when_all_are() -> None:
    c, client, assigned = _consumer([[_Msg(0, 3), _Msg(0, 1), _Msg(0, 2)], [_Msg(0, 9)]])
    assert c.consume(500, 0.0).count == 0, "a new partition is announced; its records come next call"
    assert assigned == [[("t", 0)]]
    got = c.consume(500, 0.0)
    assert [m.offset() for m in got.runs[("t", 0)]] == [1, 2, 3], "offset order, as the intake expects"
    assert c.consume(500, 0.0).count == 0 and c.held == 3, "the barrier: no poll"
    assert c.acknowledge(("t", 0), 1, 2, Outcome.ACCEPT) == 2
    assert client.sent == 0 and c.consume(500, 0.0).count == 0
    assert c.acknowledge(("t", 0), 3, 3, Outcome.RELEASE) == 1
    assert client.sent == 1, "everything acknowledged: sent at once"
    assert c.consume(500, 0.0).count == 1
    assert c.counts.as_dict() == {"acquired": 4, "accepted": 2, "released": 1, "rejected": 0,
                                  "lock_expiries": 0}
    assert client.acks == [(0, 1, AcknowledgeType.ACCEPT), (0, 2, AcknowledgeType.ACCEPT),
                           (0, 3, AcknowledgeType.RELEASE)]


def test_records_of_a_paused_partition_are_released_and_close_releases_the_rest() -> None:
    c, client, _ = _consumer([[_Msg(0, 1), _Msg(1, 5)]])
    c.consume(500, 0.0)
    c.pause([("t", 1)])
    got = c.consume(500, 0.0)
    assert list(got.runs) == [("t", 0)] and got.count == 1
    assert (1, 5, AcknowledgeType.RELEASE) in client.acks
    assert c.consume(500, 0.0).count == 0, "paused: no poll"
    assert c.close(5.0) and client.closed
    assert (0, 1, AcknowledgeType.RELEASE) in client.acks and c.held == 0


def test_a_refused_acknowledgement_counts_as_a_lock_expiry() -> None:
    from confluent_kafka import KafkaError, KafkaException, TopicPartition
    c, client, _ = _consumer([])
    client.cb({TopicPartition("t", 0): {1, 2}}, KafkaException(KafkaError(KafkaError.INVALID_RECORD_STATE)))
    client.cb({TopicPartition("t", 0): {3}}, None)
    assert c.counts.lock_expiries == 2


def test_the_share_committer_hands_intents_over_every_tick() -> None:
    c, client, _ = _consumer([[_Msg(0, 1), _Msg(0, 2)]])
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    p = partition(("t", 0), 10, share=True)
    committer = committer_for(True, c, {p.tp: p}, 60.0, lambda: 0.0, 1.0)
    assert isinstance(committer, ShareCommitter)
    p.register([(7, 1, 2)], 0.0)
    p.done(7, 2, 0, 0, 0, 0.0)
    committer.commit_if_due()
    assert c.held == 0 and client.sent == 1
    assert committer.share_counts() == c.counts.as_dict()


def test_the_share_committer_releases_what_is_not_done_at_a_stop() -> None:
    c, _, _ = _consumer([[_Msg(0, 1), _Msg(0, 2), _Msg(0, 3)]])
    c.consume(500, 0.0)
    c.consume(500, 0.0)
    p = partition(("t", 0), 10, share=True)
    committer = committer_for(True, c, {p.tp: p}, 60.0, lambda: 0.0, 1.0)
    p.register([(1, 1, 1), (2, 2, 3)], 0.0)
    p.done(1, 1, 0, 0, 0, 0.0)
    answers = committer.commit([p], asynchronous=False)  # the end of a release: fenced, batches back
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

        def acknowledge(self, tp: Any, first: int, last: int, outcome: Any, /) -> int:
            return 0

    for group_type, expected in (("share", 0), ("consumer", 1)):
        pool = FakePool(1)
        consumer = ShareConsumer() if group_type == "share" else FakeConsumer()
        sup = Supervisor(_settings(group_type=group_type), consumer, pool, pool.epochs, clock=Clock())
        sup.subscribe()
        consumer.callbacks["on_assign"]([("t", 0)])  # inside a consume(): its first record came
        sup.rebalanced(Fetched())
        assert ("t", 0) in sup.partitions and sup.rebalance.rebalances == expected, group_type
