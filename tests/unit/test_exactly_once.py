"""Exactly-once's pieces without a broker (the guarantee itself is judged on Apache Kafka:
tests/integration/test_exactly_once_kafka.py): what check refuses, the group metadata handed from
the supervisor to the workers, a supervisor that commits nothing, and a worker's transaction
per batch (runtime/worker/transactional.py) on fakes."""

from __future__ import annotations

import dataclasses
import threading
import time
import types
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from fakes import TP0, assign, make

from runtime.config import Settings, guarantee_problem
from runtime.errors import ConfigError, FrameError, OutputRejected, TransactionAborted
from runtime.kafka.producer import Refusal
from runtime.kafka.transactions import BatchTransactions, commit_timeout_s
from runtime.plugin import Output, Plugin
from runtime.transport.board import BOARD_BYTES, PHASE_CALL, PHASE_FENCE, PHASE_OFFSETS, Board
from runtime.transport.frames import (
    COMMITTED,
    DEFERRED,
    DONE,
    EXHAUSTED,
    BatchFrame,
    Columns,
    decode_frame,
    encode_letters,
    peek_header,
)
from runtime.transport.groupmeta import GROUP_METADATA_BYTES, GroupMetadataCell
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec
from runtime.worker.transactional import TransactionalRunner


def settings(**over: Any) -> Settings:
    raw: dict[str, Any] = {"kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["in"]},
                           "workers": {"plugin": "p", "processes": 1},
                           "output": {"topic": "out", "guarantee": "exactly-once"}}
    for section, values in over.items():
        raw.setdefault(section, {}).update(values)
    return Settings.model_validate(raw)


@pytest.mark.parametrize(("producer", "output", "refused"), [
    ({"transaction.timeout.ms": 15000}, {}, True),  # message.timeout.ms from delivery_timeout_s 30 s
    ({"transaction.timeout.ms": 15000}, {"delivery_timeout_s": 10}, False),
    ({"transaction.timeout.ms": "15000", "message.timeout.ms": "20000"}, {"delivery_timeout_s": 10}, True),
    ({"transaction.timeout.ms": 120000}, {}, False),
    ({}, {"delivery_timeout_s": 300}, False),  # the runtime's own follows message.timeout.ms
])
def test_a_transaction_timeout_below_the_message_timeout_is_refused_in_one_line(
        producer: dict[str, Any], output: dict[str, Any], refused: bool) -> None:
    """librdkafka refuses that producer, and every worker would exit at its start (the cluster
    matrix's short-transaction row found it): one line at check time instead."""
    problem = guarantee_problem(settings(kafka={"producer": producer}, output=output))
    assert (problem is not None) == refused, problem
    if refused:
        assert problem and "transaction.timeout.ms" in problem and "\n" not in problem
    at_least_once = {**output, "guarantee": "at-least-once"}
    assert guarantee_problem(settings(kafka={"producer": producer}, output=at_least_once)) is None


@pytest.mark.parametrize("ordering", ["key", "unordered"])
def test_check_refuses_exactly_once_where_batches_of_a_partition_finish_out_of_order(ordering: str) -> None:
    problem = guarantee_problem(settings(workers={"ordering": ordering}))
    assert problem is not None and "workers.ordering" in problem and "\n" not in problem
    assert guarantee_problem(settings()) is None
    assert guarantee_problem(settings(workers={"ordering": ordering},
                                      output={"guarantee": "at-least-once"})) is None


def test_check_accepts_exactly_once_with_until_caught_up() -> None:
    """The run is judged by the group's committed offsets, which the transactions write
    (caught_up.py), not by the supervisor's own commits."""
    assert guarantee_problem(settings(supervisor={"stop_when_caught_up": True})) is None


def test_load_settings_refuses_it_in_one_line(tmp_path: Any) -> None:
    from runtime.config import load_settings

    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "x:1"\ngroup_id = "g"\ntopics = ["in"]\n'
                   '[workers]\nplugin = "p"\nordering = "key"\n[output]\nguarantee = "exactly-once"\n')
    with pytest.raises(ConfigError, match=r"needs workers\.ordering"):
        load_settings(cfg, check_plugin=False)


def test_the_group_metadata_cell_hands_over_the_latest_metadata_whole() -> None:
    cell = GroupMetadataCell(memoryview(bytearray(GROUP_METADATA_BYTES)))
    assert cell.read() is None, "nothing before the first assignment"
    cell.write(b"CGMDv2:generation-1")
    cell.write(b"CGMDv2:gen-2")  # shorter: nothing of the longer one shows
    assert cell.read() == b"CGMDv2:gen-2"
    with pytest.raises(FrameError):
        cell.write(b"x" * GROUP_METADATA_BYTES)
    assert cell.read() == b"CGMDv2:gen-2"


def test_a_transactional_supervisor_commits_nothing_itself() -> None:
    """Its commit could land after a later transaction's and move the group's offset back."""
    sup, consumer, clock, _pool = make()
    sup.commits.transactional = True
    assign(sup, consumer, [TP0])
    p = sup.partitions[TP0]
    p.tracker.register(1, 0, 9)
    p.tracker.complete(1)
    clock.now += 10
    sup.commits.commit_if_due()
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)
    assert consumer.commits == []


class _Producer:
    broken = False

    def __init__(self) -> None:
        self.produced: list[bytes] = []

    def produce(self, topic: str, value: bytes, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
        self.produced.append(value)

    def deliver(self, timeout_s: float, beat: Any = None) -> None:
        pass

    def discard(self) -> None:
        self.discarded = True


class _Transactions:
    def __init__(self, refuse_commits: int = 0) -> None:
        self.log: list[Any] = []
        self.refuse = refuse_commits
        self.abort_acknowledged = True

    def begin(self) -> None:
        self.log.append("begin")

    def commit(self, offsets: dict[Any, int], group: bytes) -> None:
        if self.refuse:
            self.refuse -= 1
            self.log.append("refused")
            raise TransactionAborted("Broker: Specified group generation id is not valid")
        self.log.append(("commit", offsets, group))

    def abort(self) -> bool:
        self.log.append("abort")
        return self.abort_acknowledged


def _runner(process: Any, committed: int | None = None, refuse: int = 0,
            group: bytes | Any | None = b"meta", starts: list[Any] | None = None,
            ) -> tuple[TransactionalRunner, _Transactions, list[_Producer]]:
    """``starts``: each start of the transactions (init_transactions) is appended the producer
    it was for; one that is an exception raises it."""
    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1,
                      transactional_id="t")
    board = Board(memoryview(bytearray(BOARD_BYTES)))
    producers = [_Producer()]
    txn = _Transactions(refuse)
    plain = BatchRunner(Plugin("p", process, None, None), spec, board, producers[0])  # type: ignore[arg-type]

    def new_producer() -> Any:
        producers.append(_Producer())
        return producers[-1]

    offsets = types.SimpleNamespace(of=lambda tp, timeout_s: committed, close=lambda: None)

    def start(p: Any) -> Any:
        if starts is not None:
            outcome = starts.pop(0) if starts and isinstance(starts[0], Exception) else None
            if outcome is not None:
                raise outcome
            starts.append(p)
        return txn

    metadata = group if callable(group) else lambda: group
    runner = TransactionalRunner(plain, spec, board, offsets, metadata,  # type: ignore[arg-type]
                                 start, new_producer)  # type: ignore[arg-type]
    return runner, txn, producers


def _frame(first: int, n: int) -> BatchFrame:
    values: list[bytes | None] = [f"v{first + i}".encode() for i in range(n)]
    return BatchFrame(1, 0, 1, "in", 3, Columns(first, None, [None] * n, values, None, 0, [0] * n))


def echo(batch: Any) -> Any:
    return [Output(r.value) for r in batch]


def test_a_batch_commits_its_outputs_with_the_next_offset_and_the_groups_metadata() -> None:
    runner, txn, producers = _runner(echo)
    result = runner.run(_frame(10, 3))
    assert result.kind == DONE and result.processed == 3
    assert txn.log == ["begin", ("commit", {("in", 3): 13}, b"meta")]
    assert producers[0].produced == [b"v10", b"v11", b"v12"]


def test_a_workers_transactions_start_before_its_first_batch_fencing_what_its_slot_left_open() -> None:
    """Issue 40: a daemon SIGKILLed and replaced on its host left transactions open under its
    slots' ids; the replacement's workers fence them as they start, not at a first batch that
    may never come (the partitions went to the other member, which waited for
    transaction.timeout.ms to read their committed offsets)."""
    starts: list[Any] = []
    runner, _txn, producers = _runner(echo, starts=starts)
    runner.prepare()
    assert starts == [producers[0]], "init_transactions at start"
    assert runner.run(_frame(10, 2)).kind == DONE
    assert starts == [producers[0]], "not started again for the batch"


def test_a_start_the_coordinator_does_not_answer_is_tried_again_at_the_first_batch() -> None:
    starts: list[Any] = [TransactionAborted("cannot start transactions: Coordinator not available")]
    runner, _txn, producers = _runner(echo, starts=starts)
    runner.prepare()
    assert len(producers) == 2 and starts == [], "a new producer, nothing started yet"
    assert runner.run(_frame(10, 2)).kind == DONE
    assert starts == [producers[1]]


def test_a_batch_commits_with_the_group_metadata_of_its_start_not_the_latest() -> None:
    """Issue 40: a member whose session expired behind a frozen coordinator leaves its batch
    in progress to finish; had the member joined again and got the partition back, the latest
    metadata would let that batch commit beside the new run of its records. With the metadata
    of its start, the broker refuses it (another generation)."""
    now = [b"generation-1"]

    def rejoined_meanwhile(batch: Any) -> Any:
        now[0] = b"generation-2"  # the supervisor wrote the new generation's metadata
        return echo(batch)

    runner, txn, _ = _runner(rejoined_meanwhile, group=lambda: now[0])
    assert runner.run(_frame(10, 2)).kind == DONE
    assert txn.log[-1] == ("commit", {("in", 3): 12}, b"generation-1")


def test_a_committed_offset_the_group_cannot_answer_defers_the_batch_and_keeps_the_producer() -> None:
    """The group's answer failed, not the producer: replacing it cost an init_transactions per
    deferral while a coordinator moved (issue 40)."""
    runner, txn, producers = _runner(echo)

    def unanswered(tp: Any, timeout_s: float) -> int | None:
        raise TransactionAborted("cannot read the partition's committed offset: Broker: Not coordinator")

    runner._offsets = types.SimpleNamespace(of=unanswered, close=lambda: None)
    result = runner.run(_frame(10, 2))
    assert result.kind == DEFERRED and "Not coordinator" in result.detail
    assert len(producers) == 1 and txn.log == [], "the producer kept, no transaction begun"


def test_the_committed_offset_is_asked_again_while_the_coordinator_moves() -> None:
    from confluent_kafka import TopicPartition

    from runtime.kafka.committed_offsets import CommittedOffsets

    answers: list[Any] = [KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)),
                          KafkaException(KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)),
                          [TopicPartition("in", 3, 42)]]

    class Client:
        def __init__(self, props: dict[str, Any]) -> None:
            assert props["isolation.level"] == "read_committed", "require_stable: librdkafka's under it"

        def committed(self, parts: Any, timeout: float) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        def close(self) -> None:
            pass

    offsets = CommittedOffsets({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}, new_client=Client)
    try:
        assert offsets.of(("in", 3), 10.0) == 42 and answers == []
    finally:
        offsets.close()


def test_a_committed_offset_read_stuck_in_its_client_is_given_up_at_a_deadline_its_client_replaced() -> None:
    """Issue 40: after a supervisor SIGKILL on a three-node cluster a worker sat over 3 minutes
    inside librdkafka's committed(), though it was given a timeout, and its partition stayed
    behind. The read waits for the client only until its deadline (the timeout and a grace),
    then defers the batch and reads with a new client; the stuck one is closed on its own
    thread once its call returns."""
    from confluent_kafka import TopicPartition

    from runtime.kafka.committed_offsets import CommittedOffsets

    release = threading.Event()
    clients: list[Any] = []

    class Client:
        def __init__(self, props: dict[str, Any]) -> None:
            self.closed = threading.Event()
            self.stuck = not clients  # the first one never returns until released
            clients.append(self)

        def committed(self, parts: Any, timeout: float) -> Any:
            if self.stuck:
                release.wait()  # librdkafka past its timeout
                return [TopicPartition("in", 3, 7)]
            return [TopicPartition("in", 3, 42)]

        def close(self) -> None:
            self.closed.set()

    offsets = CommittedOffsets({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}, new_client=Client,
                               grace_s=0.2)
    outcome: list[BaseException | int | None] = []

    def read() -> None:
        try:
            outcome.append(offsets.of(("in", 3), 0.3))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    try:
        assert not reader.is_alive(), "the read waited for a client stuck past its deadline"
        [aborted] = outcome
        assert isinstance(aborted, TransactionAborted) and "not read within 0.5 s" in aborted.reason
        assert len(clients) == 2 and offsets.given_up == 1, "a new client for the next read"
        assert offsets.of(("in", 3), 1.0) == 42
        assert not clients[0].closed.is_set(), "the stuck client is not closed under its call"
    finally:
        release.set()
    assert clients[0].closed.wait(5), "the stuck client is closed once its call returns"
    offsets.close()
    assert clients[1].closed.is_set()


def test_past_max_stuck_clients_still_stuck_the_worker_leaves_instead_of_leaking_another() -> None:
    """Each client given up holds its threads and sockets until its call returns; a librdkafka
    that never returns would leak one per batch. Past MAX_STUCK the worker is replaced: the
    batch is not done and runs again on a new worker (EXHAUSTED, not the records' fault)."""
    from runtime.kafka.committed_offsets import MAX_STUCK, CommittedOffsets

    release = threading.Event()
    made: list[Any] = []

    class Stuck:
        def __init__(self, props: dict[str, Any]) -> None:
            made.append(self)

        def committed(self, parts: Any, timeout: float) -> Any:
            release.wait()
            return []

        def close(self) -> None:
            pass

    offsets = CommittedOffsets({"bootstrap.servers": "127.0.0.1:9", "group.id": "g"}, new_client=Stuck,
                               grace_s=0.01)
    runner, txn, _ = _runner(echo)
    runner._offsets = offsets
    runner.spec = dataclasses.replace(runner.spec, delivery_timeout_s=0.05)  # the read's timeout
    try:
        kinds = [runner.run(_frame(10, 2)).kind for _ in range(MAX_STUCK + 1)]
        assert kinds == [DEFERRED] * MAX_STUCK + [EXHAUSTED]
        assert len(made) == MAX_STUCK + 1 and txn.log == []
    finally:
        release.set()


def test_the_board_says_a_batch_waits_for_its_committed_offset_and_a_failed_read_defers_it() -> None:
    """The supervisor's bound on the read applies (PHASE_OFFSETS, workforce.py), not the
    plugin's deadline; the plugin's calls are PHASE_CALL again."""
    runner, txn, producers = _runner(echo)
    phases: list[int] = []

    def of(tp: Any, timeout_s: float) -> int | None:
        phases.append(runner.board.phase)
        raise TransactionAborted("the partition's committed offset was not read within 35 s")

    runner._offsets = types.SimpleNamespace(of=of, close=lambda: None)
    runner.board.begin(1, 0)  # as the worker's fence does when it admits the batch
    result = runner.run(_frame(10, 2))
    assert phases == [PHASE_OFFSETS] and runner.board.phase == PHASE_CALL
    assert result.kind == DEFERRED and "not read within" in result.detail and txn.log == []
    assert len(producers) == 1, "the producer kept: the group's answer failed, not the producer"


def test_records_an_earlier_transaction_committed_are_left_out() -> None:
    """A worker killed after its commit, before its report: the batch comes back."""
    seen: list[bytes] = []

    def process(batch: Any) -> Any:
        seen.extend(r.value for r in batch)
        return echo(batch)

    runner, txn, _ = _runner(process, committed=13)
    result = runner.run(_frame(10, 3))
    assert result.kind == DONE and result.processed == 3 and seen == [] and txn.log == []
    runner, txn, _ = _runner(process, committed=12)
    result = runner.run(_frame(10, 3))
    assert result.kind == DONE and result.processed == 3 and seen == [b"v12"]
    assert txn.log == ["begin", ("commit", {("in", 3): 13}, b"meta")]


def test_a_refused_commit_defers_the_batch_and_its_next_run_writes_every_output_again() -> None:
    """The aborted transaction's outputs are invisible: nothing may be skipped as written."""
    runner, txn, producers = _runner(echo, refuse=1)
    first = runner.run(_frame(10, 2))
    assert first.kind == DEFERRED and first.cause == "transaction"
    assert len(producers) == 2, "a new producer (the same transactional id fences the old one)"
    second = runner.run(_frame(10, 2))
    assert second.kind == DONE
    assert producers[0].produced == [b"v10", b"v11"] and producers[1].produced == [b"v10", b"v11"]
    assert txn.log == ["begin", "refused", "begin", ("commit", {("in", 3): 12}, b"meta")]


def test_a_deferred_batch_aborts_and_without_group_metadata_nothing_commits() -> None:
    from runtime.plugin import Backoff

    def backoff(batch: Any) -> Any:
        raise Backoff(1.0, "later")

    runner, txn, _ = _runner(backoff)
    assert runner.run(_frame(0, 2)).kind == DEFERRED
    assert txn.log == ["begin", "abort"]
    runner, txn, _ = _runner(echo, group=None)
    assert runner.run(_frame(0, 2)).kind == DEFERRED
    assert not any(isinstance(e, tuple) for e in txn.log)


def test_outputs_written_before_a_deferral_are_written_again_in_the_next_transaction() -> None:
    """At-least-once skips, on the batch's next run, what the broker took before it was
    deferred; under exactly-once that transaction was aborted, so nothing may be skipped."""
    from runtime.plugin import Backoff

    calls: list[list[bytes]] = []

    def process(batch: Any) -> Any:
        calls.append([r.value for r in batch])
        if len(calls) <= 2 and len(batch) == 2:
            raise ValueError("the whole batch fails: bisected")
        if calls[-1] == [b"v11"] and len(calls) == 4:
            raise Backoff(0.1, "later")
        return echo(batch)

    runner, txn, producers = _runner(process)
    assert runner.run(_frame(10, 2)).kind == DEFERRED
    assert producers[0].produced == [b"v10"], "the first half was written, in the aborted transaction"
    assert txn.log == ["begin", "abort"]
    assert runner.run(_frame(10, 2)).kind == DONE
    assert producers[0].produced == [b"v10", b"v10", b"v11"]
    assert txn.log[-1] == ("commit", {("in", 3): 12}, b"meta")


def _letters(offset: int) -> BatchFrame:
    headers = [[("ringmaster.error.type", b"WorkerCrashed")]]
    cols = Columns(offset, None, [b"k"], [b"letter"], headers, 0, [-1])
    raw = encode_letters(4, 0, 1, "in", 3, cols)
    assert peek_header(raw) == (4, 0, 1), "fenced like any batch"
    frame = decode_frame(raw)
    assert frame is not None and frame.letters
    return frame


def _no_plugin(batch: Any) -> Any:
    pytest.fail("the plugin ran a dead letter")


def test_a_letters_batch_commits_its_letter_with_the_offset_past_its_record_and_no_plugin() -> None:
    """The letter of a record that kept crashing workers (results.py): one transaction holds
    it and the offset after the record, so the partition's next owner never reads it again."""
    runner, txn, producers = _runner(_no_plugin, committed=42)
    result = runner.run(_letters(42))
    assert (result.kind, result.cause, result.dead_letters, result.processed) == (DONE, COMMITTED, 1, 1)
    assert producers[0].produced == [b"letter"]
    assert txn.log == ["begin", ("commit", {("in", 3): 43}, b"meta")]


def test_a_letters_batch_an_earlier_transaction_committed_writes_nothing_again() -> None:
    """A worker killed after the letter's commit, before its report: the batch comes back."""
    runner, txn, producers = _runner(_no_plugin, committed=43)
    result = runner.run(_letters(42))
    assert result.kind == DONE and producers[0].produced == [] and txn.log == []


def test_a_letters_batch_whose_commit_is_refused_is_deferred_and_written_again_in_a_new_transaction() -> None:
    runner, txn, producers = _runner(_no_plugin, refuse=1)
    assert runner.run(_letters(42)).kind == DEFERRED
    assert runner.run(_letters(42)).kind == DONE
    assert producers[0].produced == [b"letter"] and producers[1].produced == [b"letter"]
    assert txn.log == ["begin", "refused", "begin", ("commit", {("in", 3): 43}, b"meta")]


def test_an_abort_not_acknowledged_replaces_the_producer_before_the_next_transaction() -> None:
    """An abort that timed out twice (an epoch bump after a broker stall) leaves a producer
    that librdkafka says must not begin the next transaction: a new one takes its place."""
    from runtime.plugin import Backoff

    def backoff(batch: Any) -> Any:
        raise Backoff(1.0, "later")

    runner, txn, producers = _runner(backoff)
    assert runner.run(_frame(0, 2)).kind == DEFERRED
    assert len(producers) == 1, "an acknowledged abort keeps the producer"
    txn.abort_acknowledged = False
    assert runner.run(_frame(0, 2)).kind == DEFERRED
    assert len(producers) == 2 and runner.runner.producer is producers[1], "replaced"
    assert getattr(producers[0], "discarded", False), "the old one let go of at once (its client's threads)"


@pytest.mark.parametrize("failure", ["refused commit", "abort not acknowledged"])
def test_a_replaced_producer_fences_what_the_old_one_left_open_before_the_batch_is_reported(
        failure: str) -> None:
    """A failed commit may leave the partition's offsets in the old producer's open
    transaction: every committed-offset read of the partition (require_stable) waits on it,
    and an abort not acknowledged holds the outputs from read_committed readers. The new
    producer's init_transactions aborts it; done at this worker's next batch, it waited for
    ``transaction.timeout.ms`` when the partition went to another worker meanwhile (issue 40,
    a supervisor SIGKILL's rebalance). It is done before the deferral is reported, in a phase
    the supervisor bounds."""
    from runtime.plugin import Backoff

    def backoff(batch: Any) -> Any:
        raise Backoff(1.0, "later")

    starts: list[Any] = []
    runner, txn, producers = _runner(echo if failure == "refused commit" else backoff,
                                     refuse=1 if failure == "refused commit" else 0, starts=starts)
    txn.abort_acknowledged = failure == "refused commit"
    phases: list[int] = []
    start = runner._start
    runner._start = lambda p: (phases.append(runner.board.phase), start(p))[1]  # type: ignore[assignment]
    runner.prepare()
    runner.board.begin(1, 0)
    assert runner.run(_frame(10, 2)).kind == DEFERRED
    assert len(producers) == 2 and starts == producers, "the new producer's transactions started at once"
    assert phases[-1] == PHASE_FENCE


def test_a_fence_that_fails_is_tried_again_at_the_next_batch() -> None:
    starts: list[Any] = []
    runner, _txn, producers = _runner(echo, refuse=1, starts=starts)
    runner.prepare()
    starts.insert(0, TransactionAborted("cannot start transactions: Local: Timed out"))
    assert runner.run(_frame(10, 2)).kind == DEFERRED
    assert len(producers) == 3 and starts == [producers[0]], "the failed start's producer given up"
    assert [getattr(p, "discarded", False) for p in producers] == [True, True, False]
    assert runner.run(_frame(10, 2)).kind == DONE
    assert starts == [producers[0], producers[2]]


class _TxnClient:
    """confluent_kafka.Producer's transactional calls; ``aborts``: what each abort does."""

    def __init__(self, *aborts: KafkaError | None) -> None:
        self.aborts = list(aborts)
        self.calls = 0

    def init_transactions(self, timeout: float) -> None:
        pass

    def abort_transaction(self, timeout: float) -> None:
        self.calls += 1
        err = self.aborts.pop(0)
        if err is not None:
            raise KafkaException(err)


@pytest.mark.parametrize(("aborts", "acknowledged", "calls"), [
    ((None,), True, 1),
    ((KafkaError(KafkaError._TIMED_OUT, retriable=True), None), True, 2),
    ((KafkaError(KafkaError._TIMED_OUT, retriable=True),) * 2, False, 2),
    ((KafkaError(KafkaError._FENCED, fatal=True),), False, 1),
])
def test_a_timed_out_abort_is_asked_again_once_then_given_up(
        aborts: tuple[KafkaError | None, ...], acknowledged: bool, calls: int) -> None:
    client = _TxnClient(*aborts)
    txns = BatchTransactions(client, 2.0)  # type: ignore[arg-type]
    assert txns.abort() is acknowledged
    assert client.calls == calls


def test_a_refused_commit_is_not_aborted_on_top_its_producer_is_replaced() -> None:
    """The commit phase is bounded by one timeout, so the supervisor's bound on it can be
    tight (librdkafka#5511 hangs send_offsets_to_transaction for good): the abort that
    followed a refused commit took up to two more, and the producer is replaced anyway."""
    client = _TxnClient(None)
    waits: list[float] = []
    client.send_offsets_to_transaction = lambda offsets, meta, timeout: waits.append(timeout)  # type: ignore[attr-defined]

    def refused(timeout: float) -> None:
        waits.append(timeout)
        raise KafkaException(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True))

    client.commit_transaction = refused  # type: ignore[attr-defined]
    txns = BatchTransactions(client, 30.0, commit_timeout_s(30.0))  # type: ignore[arg-type]
    with pytest.raises(TransactionAborted, match="not committed"):
        txns.commit({("in", 0): 5}, b"meta")
    assert client.calls == 0, "no abort"
    assert waits[0] == 5.0 and waits[1] <= 5.0, "the commit's own timeout, not the delivery's 30 s"


_WORKERS = '\n[workers]\nplugin = "workers.fingerprint"\n'


@pytest.mark.parametrize(("args", "extra", "needle"), [
    (["check"], _WORKERS + 'ordering = "unordered"\n', "needs workers.ordering"),
    (["spark", "run"], _WORKERS, "Spark backend"),
])
def test_the_cli_refuses_what_exactly_once_cannot_keep_in_one_line_before_kafka(
        tmp_path: Any, args: list[str], extra: str, needle: str) -> None:
    import subprocess
    import sys

    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["in"]\n'
                   '[output]\ntopic = "out"\nguarantee = "exactly-once"' + extra)
    r = subprocess.run([sys.executable, "-m", "runtime.cli", *args, "-c", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == ConfigError.exit_code, r.stderr
    assert len(lines) == 1 and lines[0].startswith("ringmaster: error: ") and needle in lines[0], r.stderr


# -------------------------------------- an output the cluster refuses, inside a transaction (issue 44)
class _RefusingProducer(_Producer):
    """Refuses at delivery every message to MISSING (a topic that does not exist, auto-creation
    off), as the broker does; librdkafka then fails the transaction the message was in."""

    def __init__(self) -> None:
        super().__init__()
        self.queued: list[tuple[str, bytes]] = []
        self.refused: list[Refusal] = []
        self.undelivered: list[Any] | None = None
        self.transaction_failed = False

    def produce(self, topic: str, value: bytes, key: Any, headers: Any, queue_wait_s: float = 0) -> None:
        self.queued.append((topic, value))

    def deliver(self, timeout_s: float, beat: Any = None) -> None:
        queued, self.queued = self.queued, []
        self.produced += [v for t, v in queued if t != MISSING]
        self.refused = [Refusal(t, None, v, True, f"the output to {t!r} was refused: Unknown topic")
                        for t, v in queued if t == MISSING]
        self.undelivered = [] if not self.refused else None
        if self.refused:
            self.transaction_failed = True
            raise OutputRejected(self.refused[0].reason)


MISSING = "missing-topic"


def test_an_output_the_cluster_refuses_is_dead_lettered_in_the_batchs_next_transaction() -> None:
    """The refusal fails the transaction (its commit is refused); the batch runs again at once
    in a new one that refuses the output itself, before producing it: the record is
    dead-lettered as OutputRejected and the transaction commits. It used to be deferred and run
    the same way for ever."""
    def process(batch: Any) -> Any:
        return [Output(r.value, topic=MISSING if r.offset == 11 else None) for r in batch]

    log: list[Any] = []

    class Txn(_Transactions):
        def __init__(self, producer: _RefusingProducer) -> None:
            super().__init__()
            self.producer, self.log = producer, log

        def commit(self, offsets: dict[Any, int], group: bytes) -> None:
            if self.producer.transaction_failed:
                log.append("refused")
                raise TransactionAborted("1 message(s) failed delivery")
            super().commit(offsets, group)

    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1,
                      transactional_id="t")
    board = Board(memoryview(bytearray(BOARD_BYTES)))
    producers = [_RefusingProducer()]
    plain = BatchRunner(Plugin("p", process, None, None), spec, board, producers[0])  # type: ignore[arg-type]
    letters: list[Any] = []
    plain._dead_letter = letters.extend  # type: ignore[method-assign]

    def new_producer() -> Any:
        producers.append(_RefusingProducer())
        return producers[-1]
    offsets = types.SimpleNamespace(of=lambda tp, timeout_s: None, close=lambda: None)
    runner = TransactionalRunner(plain, spec, board, offsets, lambda: b"meta",  # type: ignore[arg-type]
                                 Txn, new_producer)  # type: ignore[arg-type]
    result = runner.run(_frame(10, 3))
    assert result.kind == DONE and result.cause == "committed" and result.dead_letters == 1
    assert log == ["begin", "refused", "begin", ("commit", {("in", 3): 13}, b"meta")]
    assert producers[-1].produced == [b"v10", b"v12"] and not producers[-1].transaction_failed
    assert [(f.record.offset, f.error_type) for f in letters[-1:]] == [(11, "OutputRejected")]
    assert plain.refusals is None, "what was refused is this batch's only"


def test_the_ids_of_slots_no_worker_starts_are_fenced_each_on_a_producer_closed_after() -> None:
    from runtime.kafka.fencing import fence_ids

    made: list[Any] = []

    class Fencer:
        def __init__(self, props: dict[str, Any]) -> None:
            self.tid, self.inits, self.closed = props["transactional.id"], 0, False
            made.append(self)

        def init_transactions(self, timeout: float) -> None:
            self.inits += 1
            if self.tid.endswith("w2"):
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT))

        def close(self) -> None:
            self.closed = True

    failed = fence_ids({"bootstrap.servers": "127.0.0.1:9"}, ["t-w1", "t-w2"], 5.0, new_producer=Fencer)
    assert sorted(f.tid for f in made) == ["t-w1", "t-w2"]
    assert all(f.inits == 1 and f.closed for f in made)
    assert list(failed) == ["t-w2"]
    assert fence_ids({}, [], 5.0, new_producer=Fencer) == {} and len(made) == 2


def test_the_supervisor_fences_the_slots_it_does_not_start_by_their_ids_off_its_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its workers fence their own slots (0 .. processes - 1) as they start; the rest of the
    pool's slots (max_processes, and a reload's one more) are the supervisor's."""
    import runtime.supervisor.daemon.run as run

    seen: list[Any] = []
    monkeypatch.setattr(run, "fence_ids", lambda props, ids, timeout_s: seen.append((ids, timeout_s)))
    s = settings(workers={"plugin": "probe", "processes": 2, "max_processes": 3})
    run._fence_other_slots(s, "h-m0", range(s.workers.processes, s.workers.process_limit + 1))
    for _ in range(100):
        if seen:
            break
        time.sleep(0.01)
    [(ids, timeout_s)] = seen
    assert ids == [f"ringmaster-{s.kafka.group_id}-h-m0-w{i}" for i in (2, 3)]
    assert timeout_s == s.output.delivery_timeout_s
