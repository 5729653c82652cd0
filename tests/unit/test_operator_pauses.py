"""Operator pauses applied to the supervisor's partitions (runtime/supervisor/control/operator.py),
with the real OperatorPauses (runtime/ops/control.py) reading a fake control topic: a pause
record rewinds the partitions it covers, a tombstone or a resume record releases them, a
malformed record changes nothing either way, a partition assigned under a pause is held
before it fetches, and a --for pause ends by itself."""

from __future__ import annotations

from typing import Any

from fakes import TP0, TP1, RingWorker, assign, feed, make, msgs, start

from runtime.ops.control import OperatorPauses
from runtime.ops.control_records import ALL, Pause, scope_key
from runtime.supervisor.partition.partition import PauseReason

Record = tuple[bytes | None, bytes | None]
WALL_MS = 1_700_000_000_000


class ControlTopic:
    """The control topic: ``load`` reads what it holds, ``poll`` what arrived since."""

    def __init__(self, records: list[Record]) -> None:
        self.records = list(records)
        self.arrived: list[Record] = []

    def read_to_end(self, apply: Any, timeout_s: float, what: str) -> int:
        for offset, (k, v) in enumerate(self.records):
            apply(k, v, offset)
        return len(self.records)

    def poll(self, apply: Any, max_records: int = 100) -> int:
        batch, self.arrived = self.arrived, []
        for k, v in batch:
            self.records.append((k, v))
            apply(k, v, len(self.records) - 1)
        return len(batch)

    def close(self) -> None:
        pass


class Wall:
    ms = WALL_MS

    def __call__(self) -> int:
        return self.ms


def pause(scope: str = ALL, reason: str = "maintenance", until_ms: int | None = None) -> Record:
    return Pause(scope, True, reason, "op@host", WALL_MS, until_ms).record()


def resume(scope: str = ALL) -> Record:
    return Pause(scope, False, "resumed", "op@host", WALL_MS + 1).record()


def supervisor(records: list[Record] = ()) -> tuple[Any, Any, Any, Any, ControlTopic, Wall]:  # type: ignore[assignment]
    topic, wall = ControlTopic(list(records)), Wall()
    sup, consumer, clock, pool = make(batch_max_records=10, batch_max_wait_ms=0)
    sup.operator.pauses = OperatorPauses("ctl", {}, reader=lambda t, props: topic, wall_ms=wall)
    sup.operator.load()
    return sup, consumer, clock, pool, topic, wall


def held(sup: Any, tp: Any) -> bool:
    return PauseReason.OPERATOR in sup.partitions[tp].pause.holds


def test_a_pause_record_rewinds_the_partitions_it_covers_and_a_tombstone_releases_them() -> None:
    sup, consumer, _clock, pool, topic, _ = supervisor()
    start(sup, consumer, [TP0, TP1])
    feed(sup, consumer, TP0, msgs(TP0, *range(30)))
    worker = RingWorker(pool, 0)
    worker.step()
    sup.apply_operator_pauses()
    assert not held(sup, TP0), "nothing paused yet"
    topic.arrived.append(pause(scope_key("t")))
    sup.apply_operator_pauses()
    p = sup.partitions[TP0]
    assert held(sup, TP0) and held(sup, TP1) and p.rewinding, "a pause is a rewind: stop now"
    assert consumer.paused == {TP0, TP1}
    sup.applier.collect()  # the batch in progress finishes; the queued frame is skipped
    sup.starts.read_again()
    assert worker.fenced and consumer.seeks == [(TP0, 10)]
    topic.arrived.append((scope_key("t").encode(), None))  # a tombstone resumes its scope
    sup.apply_operator_pauses()
    assert not held(sup, TP0) and not held(sup, TP1)
    sup.flow.reconcile()
    assert consumer.paused == set(), "flow control resumes what no hold keeps"


def test_a_resume_record_releases_and_a_narrower_pause_holds_only_its_partition() -> None:
    sup, consumer, _clock, _pool, topic, _ = supervisor([pause()])
    start(sup, consumer, [TP0, TP1])
    sup.apply_operator_pauses()
    assert held(sup, TP0) and held(sup, TP1)
    topic.arrived += [resume(), pause(scope_key("t", 1))]
    sup.apply_operator_pauses()
    assert not held(sup, TP0) and held(sup, TP1)


def test_a_malformed_record_neither_pauses_nor_resumes() -> None:
    sup, consumer, _clock, _pool, topic, _ = supervisor([pause(scope_key("t", 0))])
    start(sup, consumer, [TP0, TP1])
    sup.apply_operator_pauses()
    assert held(sup, TP0) and not held(sup, TP1)
    topic.arrived += [(scope_key("t", 0).encode(), b"not json"),  # on the paused scope's key
                      (scope_key("t", 1).encode(), b'{"paused": "true"}'),  # a string is not a bool
                      (b"everything", b'{"paused": true}'),  # not a scope
                      (b"*", b'{"paused": true, "until_ms": 1e400}')]
    sup.apply_operator_pauses()
    assert held(sup, TP0) and not held(sup, TP1), "each scope keeps what its last valid record said"


def test_a_new_reason_updates_the_hold_without_a_second_rewind() -> None:
    sup, consumer, _clock, _pool, topic, _ = supervisor([pause(reason="first")])
    start(sup, consumer, [TP0])
    sup.apply_operator_pauses()
    p = sup.partitions[TP0]
    sup.starts.read_again()
    epoch = p.epoch
    topic.arrived.append(pause(reason="second"))
    sup.apply_operator_pauses()
    hold = p.holding(PauseReason.OPERATOR)
    assert hold is not None and "second" in hold.detail and p.epoch == epoch


def test_a_partition_assigned_under_a_pause_is_held_before_it_fetches() -> None:
    sup, consumer, _clock, _pool, _topic, _ = supervisor([pause()])
    assign(sup, consumer, [TP0, TP1])  # inside the rebalance callback, before any consume()
    assert held(sup, TP0) and held(sup, TP1)
    assert consumer.paused == {TP0, TP1}, "librdkafka started them fetching; the runtime paused them"


def test_a_pause_for_a_while_ends_by_itself() -> None:
    sup, consumer, _clock, _pool, _topic, wall = supervisor([pause(until_ms=WALL_MS + 5000)])
    start(sup, consumer, [TP0])
    sup.apply_operator_pauses()
    assert held(sup, TP0)
    wall.ms += 4999
    sup.apply_operator_pauses()
    assert held(sup, TP0)
    wall.ms += 1
    sup.apply_operator_pauses()
    assert not held(sup, TP0), "the pause ended at its time"
