"""The group consumer: the supervisor's one member of the consumer group.

Runs in: supervisor. Rebalance callbacks run inside ``consume()`` on the supervisor's one
thread. ``runtime/kafka/`` is the only package that imports ``confluent_kafka`` (the Spark
backend aside: it reads offsets and partitions for Spark's planner, runtime/spark/offsets.py).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import KafkaError as _CKError

from runtime.backoff import backoff_s
from runtime.errors import KafkaError
from runtime.kafka import coordinator
from runtime.kafka.client_log import log_client_error, same_line, with_logger
from runtime.kafka.group_offsets import GroupOffsets, GroupStanding
from runtime.kafka.messages import bind_packer, offset_of, tp_of
from runtime.kafka.watermarks import LatestOffsets
from runtime.tp import TP, tp_label
from runtime.transport.packing import Run

log = logging.getLogger(__name__)


def _topic_partition_of(m: Message) -> tuple[str | None, int | None]:
    return m.topic(), m.partition()


def librdkafka_summary(stats: dict[str, Any]) -> dict[str, float]:
    """The few numbers of librdkafka's statistics JSON worth a metric: its queues and the
    brokers' round trips (https://github.com/confluentinc/librdkafka/blob/master/STATISTICS.md)."""
    out: dict[str, float] = {
        "replyq": float(stats.get("replyq", 0)),
        "msg_cnt": float(stats.get("msg_cnt", 0)),
        "rx_messages_total": float(stats.get("rxmsgs", 0)),
        "rx_bytes_total": float(stats.get("rxmsg_bytes", 0)),
    }
    fetchq = 0
    for topic in stats.get("topics", {}).values():
        for part in topic.get("partitions", {}).values():
            fetchq += int(part.get("fetchq_cnt", 0) or 0)
    out["fetch_queue_messages"] = float(fetchq)
    cgrp = stats.get("cgrp") or {}
    if "rebalance_cnt" in cgrp:  # the group's rebalances this client took part in (assign or revoke)
        out["rebalances_total"] = float(cgrp["rebalance_cnt"])
    rtts = [b.get("rtt", {}).get("avg", 0) for b in stats.get("brokers", {}).values()
            if b.get("state") == "UP" and b.get("rtt", {}).get("cnt", 0)]
    if rtts:
        out["broker_rtt_avg_seconds"] = max(rtts) / 1e6
    return out


class ConsumerState(enum.Enum):
    CREATED = "created"
    CONSUMING = "consuming"
    CLOSING = "closing"
    CLOSED = "closed"


@dataclass(slots=True)
class Fetched:
    """What one consume() call returned, grouped by partition, in offset order."""

    runs: dict[TP, Run] = field(default_factory=dict)
    eof: dict[TP, int] = field(default_factory=dict)
    count: int = 0


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What one commit call came to. Asynchronous: only whether it was sent (the broker's
    answer comes later, through on_commit: refused offsets are taken with
    take_refused_commits). Synchronous: the broker's answer, per partition."""

    sent: bool
    refused: dict[TP, str] = field(default_factory=dict)  # synchronous: partition -> why
    # Synchronous: those of ``refused`` that a moving or loading group coordinator refused
    # (runtime/kafka/coordinator.py) after the commit asked again until its time was half gone.
    busy: frozenset[TP] = frozenset()

    @property
    def ok(self) -> bool:
        return self.sent and not self.refused


# Errors that librdkafka reports but recovers from by itself.
_TRANSIENT = {
    _CKError._TRANSPORT, _CKError._ALL_BROKERS_DOWN, _CKError._TIMED_OUT,
    _CKError._MSG_TIMED_OUT, _CKError._RESOLVE, _CKError.NOT_COORDINATOR,
    _CKError.COORDINATOR_NOT_AVAILABLE, _CKError.REBALANCE_IN_PROGRESS,
    _CKError.UNKNOWN_TOPIC_OR_PART, _CKError.LEADER_NOT_AVAILABLE,
    _CKError.NOT_LEADER_FOR_PARTITION, _CKError._NO_OFFSET,
}


class GroupConsumer:
    """A group member. Callbacks receive lists of (topic, partition) tuples."""

    def __init__(self, props: Mapping[str, Any], latest: LatestOffsets | None = None,
                 on_group_metadata: Callable[[bytes], None] | None = None) -> None:
        """``on_group_metadata``: called with the group's serialised metadata (member,
        generation) whenever it changes (exactly-once: runtime/transport/groupmeta.py)."""
        bind_packer()  # the supervisor packs what this consumer hands back
        props = with_logger(props)
        self._on_group_metadata = on_group_metadata
        self._group_metadata = b""
        self._bootstrap = str(props.get("bootstrap.servers", ""))
        # The partitions this member has paused in the client, and their ends asked for by
        # ListOffsets (a paused partition's cached high watermark stands still: watermarks.py).
        self._paused: set[TP] = set()
        # Where each partition was last sought: where it fetches from until consume() returns
        # one of its records and gives it a position (_wake_fetcher).
        self._sought: dict[TP, int] = {}
        self._stopping = False  # stop(): no new requests but the commit and the leave
        self._latest = latest if latest is not None else LatestOffsets(props)
        self._group_props = props  # where the whole group stands, asked for once subscribed
        self._group: GroupOffsets | None = None
        props["error_cb"] = self._on_error
        props["on_commit"] = self._on_commit
        if props.get("statistics.interval.ms"):
            props["stats_cb"] = self._on_stats
        self.stats_summary: dict[str, float] = {}  # the last statistics.interval.ms report, summed up
        self.fatal: str | None = None
        self._refused: dict[TP, int] = {}
        self.acknowledged: dict[TP, int] = {}  # the last offset the broker acknowledged, per partition
        self._c = Consumer(props)
        self.state = ConsumerState.CREATED
        self.abandoned = False  # close() or a commit gave up waiting for librdkafka (see close())
        # A synchronous commit that never returned holds the client: every call on it would
        # wait behind that one (measured: consume, pause, get_watermark_offsets all block).
        self.wedged: str | None = None
        self._in_callback = False  # inside a rebalance callback, i.e. inside consume()
        self._run_key: Callable[[Message], Any] = _topic_partition_of
        # Incremental assignment: cooperative-sticky under the classic protocol, and always
        # under KIP-848 (group.protocol = "consumer"), whose callbacks carry only the change.
        self.cooperative = ("cooperative" in str(props.get("partition.assignment.strategy", ""))
                            or str(props.get("group.protocol", "classic")).strip().lower() == "consumer")
        self._reset_to_end = str(props.get("auto.offset.reset", "earliest")) in ("latest", "end", "largest")
        # Where a partition with no committed offset starts when the runtime seeks it itself.
        self._reset = OFFSET_END if self._reset_to_end else OFFSET_BEGINNING

    def _check(self) -> None:
        if self.state in (ConsumerState.CLOSING, ConsumerState.CLOSED):
            raise KafkaError("the consumer is closed")
        if self.wedged:
            raise KafkaError(self.wedged)

    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log_client_error("kafka consumer", err, self._bootstrap)

    def _on_stats(self, text: str) -> None:
        """Runs in: consume(), every statistics.interval.ms."""
        try:
            self.stats_summary = librdkafka_summary(json.loads(text))
        except (ValueError, TypeError, AttributeError):
            log.debug("unreadable librdkafka statistics")

    def _on_commit(self, err: _CKError | None, parts: list[TopicPartition]) -> None:
        """Runs in: consume()/commit(). Remember refused offsets so they are sent again:
        an asynchronous commit that fails (broker away, REBALANCE_IN_PROGRESS, ...) must
        not be forgotten, or the group lags behind what was done until the next record."""
        for p in parts:
            if err is not None or p.error is not None:
                self._refused[(p.topic, p.partition)] = p.offset
            elif p.offset >= 0:
                self.acknowledged[(p.topic, p.partition)] = p.offset
        if err is not None and err.code() != _CKError._NO_OFFSET:
            log.warning("commit refused; will retry", extra={
                "error": str(err), "partitions": len(parts), "throttle": f"commit refused {err.code()}"})

    def take_refused_commits(self) -> dict[TP, int]:
        refused, self._refused = self._refused, {}
        return refused

    def subscribe(self, topics: list[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None], on_lost: Callable[[list[TP]], None],
                  read_start_s: float | None = None) -> None:
        """``read_start_s``: the committed offsets of each assignment are read in the callback
        (asked again for at most this long) and assigned explicitly, as ``assign()`` does,
        rather than left to librdkafka (librdkafka#5586); if they cannot be read, librdkafka
        reads them. For members that do not seek their partitions after each assignment (the
        supervisor does, off the callback: supervisor/datapath/assignment.py)."""
        self._check()

        def assign_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            with self._callback():
                assign(consumer, parts)

        def assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
            tps = [(p.topic, p.partition) for p in parts]
            self._paused.difference_update(tps)  # librdkafka starts a new assignment fetching
            # Not while closing: the coordinator refuses offset fetches of a group that is
            # leaving, and the read would be asked again until read_start_s, holding close().
            if read_start_s is not None and tps and self.state is ConsumerState.CONSUMING \
                    and not self._stopping:
                try:
                    parts = self._at_committed(tps, read_start_s)
                except KafkaError as exc:
                    log.warning("committed offsets not read; the client reads them itself",
                                extra={"error": str(exc), "partitions": len(tps)})
            # INVARIANT: assign before the runtime re-applies its pause state; a pause on a
            # partition that is not yet assigned is silently ignored by librdkafka.
            if self.cooperative:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)
            self._note_start(parts)
            # While closing, librdkafka turns a late assignment into an unassignment: the
            # runtime has already let go of everything and must not take on new partitions.
            if self.state is ConsumerState.CONSUMING:
                if self._group is not None:
                    self._group.note(tps)
                on_assign(tps)

        def revoke_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            tps = [(p.topic, p.partition) for p in parts]
            self._let_go(tps)
            if self.state is ConsumerState.CONSUMING:
                with self._callback():
                    on_revoke(tps)

        def lost_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            tps = [(p.topic, p.partition) for p in parts]
            self._let_go(tps)
            if self.state is ConsumerState.CONSUMING:
                with self._callback():
                    on_lost(tps)

        # One topic: a run of one partition number is a run of one partition, and the
        # grouping key can be the C method itself (no Python call per record).
        single = len(topics) == 1 and not topics[0].startswith("^")
        self._run_key = Message.partition if single else _topic_partition_of
        self._group = GroupOffsets(self._group_props, topics)
        self._c.subscribe(topics, on_assign=assign_cb, on_revoke=revoke_cb, on_lost=lost_cb)
        self.state = ConsumerState.CONSUMING
        self._warn_of_missing_topics(topics)

    def _warn_of_missing_topics(self, topics: list[str]) -> None:
        """A subscribed topic that does not exist is read from only once it does, and
        librdkafka looks for it again only every topic.metadata.refresh.interval.ms (5 min by
        default): say so at start, for a typo as much as for a topic not created yet. One
        look-up of every topic (naming the topic would create it on some brokers), bounded."""
        names = [t for t in topics if not t.startswith("^")]
        if not names:
            return
        try:
            known = self._c.list_topics(timeout=5.0).topics
        except KafkaException as exc:
            log.debug("cannot list the topics at start", extra={"error": str(exc.args[0])})
            return
        for topic in names:
            if topic not in known:
                log.warning("input topic does not exist (yet): nothing is read from it until it does, and "
                            "the client looks for it again only every topic.metadata.refresh.interval.ms",
                            extra={"topic": topic})

    def assign(self, tps: Iterable[TP], topics: int = 1, timeout_s: float = 30.0) -> None:
        """Read ``tps`` from the group's committed offsets (the reset position where there is
        none) without joining the group: nothing is assigned to anyone else, nothing is
        revoked. For a look at a group's backlog that must not disturb its members (``ringmaster
        redrive --dry-run``): commit nothing from here. ``topics``: how many topics ``tps``
        span (one: runs are grouped by partition number alone, as subscribe() does). Raises
        KafkaError when the committed offsets cannot be read within ``timeout_s``.

        The offsets are read here and assigned explicitly, not left to librdkafka
        (OFFSET_STORED): when its own offset fetch is refused as a whole (NOT_COORDINATOR, seen
        on a fresh Apache Kafka broker while the coordinator loads), librdkafka never asks
        again and never fetches the partition (librdkafka#5586); ``committed()`` asks until the
        coordinator answers."""
        self._check()
        parts = self._at_committed(list(tps), timeout_s)
        self._run_key = Message.partition if topics == 1 else _topic_partition_of
        self._c.assign(parts)
        self._note_start(parts)
        self.state = ConsumerState.CONSUMING

    def _at_committed(self, tps: list[TP], timeout_s: float) -> list[TopicPartition]:
        """``tps`` at the group's committed offsets, the reset position where there is none,
        read now (asked again until answered, at most timeout_s): KafkaError if unanswered."""
        start = self.committed(tps, timeout_s, ask_again=True)
        reset = self._reset
        offsets = {tp: reset if offset is None else offset for tp, offset in start.items()}
        return [TopicPartition(t, p, offsets.get((t, p), reset)) for t, p in tps]

    def _share_group_metadata(self) -> None:
        """Hand on the group's metadata if it changed: after each consume() and as a rebalance
        callback starts (the generation moves during the rebalance: a batch the revocation
        waits for commits with the new one)."""
        if self._on_group_metadata is None:
            return
        meta = self._c.consumer_group_metadata()
        if meta != self._group_metadata:
            self._group_metadata = meta
            self._on_group_metadata(meta)

    @contextlib.contextmanager
    def _callback(self) -> Iterator[None]:
        self._share_group_metadata()
        self._in_callback = True
        try:
            yield
        finally:
            self._in_callback = False

    def consume(self, max_records: int, timeout_s: float) -> Fetched:
        """Runs in: supervisor (hot path: per-record work here is the supervisor's cost).

        librdkafka hands out runs of one partition, so the messages are grouped by
        partition in C (groupby) and kept as they are: no per-record Python work happens
        here; pack_run turns them into frames later.

        Waits up to timeout_s for the first record only. librdkafka's batch consume returns
        when it has max_records or when the timeout expires, so one call asking for
        thousands waited out the whole timeout whenever fewer were queued: up to 20 ms on
        every record at moderate load. Take what is queued; if nothing is, wait for one
        record and take what arrived with it (a fetch response lands all at once)."""
        self._check()
        out = Fetched()
        by_tp = out.runs
        count = 0
        try:
            messages = self._c.consume(max_records, 0)
            if not messages and timeout_s > 0:
                messages = self._c.consume(1, timeout_s)
                if messages and max_records > 1:
                    messages += self._c.consume(max_records - 1, 0)
        except KafkaException as exc:
            self._raise_or_log(exc, "consume")
            messages = []
        self._share_group_metadata()
        for _, run_iter in groupby(messages, self._run_key):
            run = list(run_iter)
            # Errors (mostly end-of-partition events) come at the edges of a run.
            if run[0].error() is not None or run[-1].error() is not None:
                good = []
                for m in run:
                    err = m.error()
                    if err is None:
                        good.append(m)
                    else:
                        self._handle_message_error(m, err, out)
                run = good
                if not run:
                    continue
            count += len(run)
            tp = tp_of(run[0])
            if tp in by_tp:
                by_tp[tp].extend(run)
            else:
                by_tp[tp] = run
        out.count = count
        if self.fatal:
            raise KafkaError(f"fatal Kafka client error: {self.fatal}")
        return out

    def _handle_message_error(self, m: Message, err: _CKError, out: Fetched) -> None:
        if err.code() == _CKError._PARTITION_EOF:
            out.eof[tp_of(m)] = offset_of(m)
        elif err.fatal():
            raise KafkaError(f"fatal Kafka client error: {err}")
        elif err.code() in _TRANSIENT:
            log.warning("transient consume error", extra={
                "error": str(err), "throttle": f"consume {err.code()} {same_line(err.str())}"})
        else:
            log.error("consume error", extra={"error": str(err)})

    def _raise_or_log(self, exc: KafkaException, what: str) -> None:
        """Every librdkafka error that reaches the loop is handled here: a fatal one becomes
        a KafkaError (exit 5, one line), anything else is logged and the loop goes on."""
        err = exc.args[0] if exc.args and isinstance(exc.args[0], _CKError) else None
        if err is not None and err.fatal():
            raise KafkaError(f"fatal Kafka client error during {what}: {err}") from None
        log.warning("kafka client call failed; carrying on", extra={
            "call": what, "error": str(exc), "throttle": f"call failed {what} {same_line(str(exc))}"})

    def pause(self, tps: Iterable[TP]) -> None:
        tps = list(tps)
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts and not self.wedged:
            try:
                self._c.pause(parts)
                self._paused.update(tps)
            except KafkaException as exc:  # e.g. a partition no longer assigned: nothing to pause
                self._raise_or_log(exc, "pause")

    def resume(self, tps: Iterable[TP]) -> None:
        tps = list(tps)
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts and not self.wedged:
            paused = [part for part, tp in zip(parts, tps, strict=True) if tp in self._paused]
            self._paused.difference_update(tps)
            try:
                self._c.resume(parts)
            except KafkaException as exc:
                self._raise_or_log(exc, "resume")
                return
            self._wake_fetcher(paused)

    def _wake_fetcher(self, parts: list[TopicPartition]) -> None:
        """Make the resumed partitions fetch now. librdkafka's resume only clears a flag: the
        broker thread notices it when it next wakes, and a thread whose partitions were all
        paused has no fetch in flight and sleeps up to a second. The flow control pauses every
        partition when the backlog fills the rings and counts on records coming back within a
        fetch's round trip of a resume: instead the rings ran dry and the workers waited
        (20-800 ms on both brokers, tests/integration/test_consumer_resume.py).

        A partition that was paused is sought to its position, where the pause left librdkafka
        to fetch from anyway (past the last record consume() returned): the seek changes its
        fetch state, which wakes its broker thread (3-17 ms), and the thread then looks at all
        of its partitions. One with no position (nothing consumed since it was sought: a
        partition just assigned, or rewound) is sought again where it was last sought, which
        it still fetches from (a real offset: ``_remember_start``). Any other is left to wait."""
        # A sought offset that is out of range is reset by librdkafka; sought again it is reset
        # again, to the same start (or to what retention kept: the partition was paused, so
        # nothing more is skipped) but to a newer end: under a reset to the end, no second seek.
        sought: dict[TP, int] = {} if self._reset_to_end else self._sought
        for tp in self._c.position(parts) if parts else []:
            key = (tp.topic, tp.partition)
            offset = tp.offset if tp.offset >= 0 else sought.get(key)
            # seek() passes no leader epoch (librdkafka would first validate it, a round
            # trip); one it refuses is logged, and the resume stands.
            if tp.error is None and offset is not None:
                self.seek(key, offset)

    def _note_start(self, parts: list[TopicPartition]) -> None:
        """An assignment starts each partition where it says, as a seek would."""
        for p in parts:
            self._remember_start((p.topic, p.partition), p.offset)

    def _remember_start(self, tp: TP, offset: int) -> None:
        """Where ``tp`` fetches from until a record of it is read, for _wake_fetcher: a real
        offset only. A logical one (the start or end, OFFSET_INVALID: where librdkafka finds
        it) is resolved once by librdkafka, and sought again it would be resolved anew: a
        newer end than the one the partition fetches from skips the records in between."""
        if offset >= 0:
            self._sought[tp] = offset
        else:
            self._sought.pop(tp, None)

    def _let_go(self, tps: list[TP]) -> None:
        self._paused.difference_update(tps)
        for tp in tps:
            self._sought.pop(tp, None)
        self._latest.forget(tps)

    def commit(self, offsets: Mapping[TP, int], asynchronous: bool,
               timeout_s: float = 30.0) -> CommitResult:
        """Commit next-offsets. Never raises for commit errors (logged): an uncommitted offset
        is only a duplicate later, never a loss; but a synchronous commit says, per
        partition, whether the broker acknowledged it (``--until-caught-up`` exits 0 only
        then).

        A synchronous commit at a stop waits at most ``timeout_s``: librdkafka's has no
        timeout, and a broker that takes OffsetCommit requests without answering them kept it
        waiting for ever (librdkafka times a request out after socket.timeout.ms and sends it
        again), holding SIGTERM with it. It runs on a helper thread; one that does not return
        in time is abandoned (its partitions count as refused), the client is ``wedged`` (every
        call on it would wait behind the commit) and the process must end with os._exit, as
        after an abandoned close(). Inside a rebalance callback it cannot: the client is
        busy in consume() there, and a commit from another thread waits for that to return
        (measured), so a revocation's commit is the plain synchronous call, bounded only by
        librdkafka's request timeout (socket.timeout.ms) and retries.

        Outside a callback, partitions that a moving or loading group coordinator refused are
        committed again (runtime/kafka/coordinator.py): librdkafka finds the new coordinator
        but hands the refusal to the caller, and a final commit is the one that says whether
        the work is done."""
        if not offsets:
            return CommitResult(False)
        if self.state is not ConsumerState.CONSUMING or self.wedged:
            why = f"not sent: {self.wedged or 'the consumer is ' + self.state.value}"
            return CommitResult(False, {tp: why for tp in offsets})
        parts = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        if asynchronous:
            try:
                self._c.commit(offsets=parts, asynchronous=True)
            except KafkaException as exc:
                error = str(exc.args[0])
                log.warning("commit failed", extra={"error": error, "partitions": len(parts),
                                                    "throttle": f"commit failed {same_line(error)}"})
                return CommitResult(False)
            return CommitResult(True)
        if self._in_callback:
            answer: list[Any] = []
            try:
                answer.append(self._c.commit(offsets=parts, asynchronous=False))
            except KafkaException as exc:
                answer.append(exc)
            return self._answered(answer[0], offsets)
        return self._commit_sync(offsets, timeout_s)

    def _commit_sync(self, offsets: Mapping[TP, int], timeout_s: float) -> CommitResult:
        """A synchronous commit outside a callback, sent again for the partitions a busy group
        coordinator refused. A new attempt starts only while half of ``timeout_s`` is left, so
        each has that long to be answered: a healthy broker is never abandoned (wedging the
        client) just because an earlier attempt found its coordinator loading."""
        deadline = time.monotonic() + timeout_s
        pending = dict(offsets)
        refused: dict[TP, str] = {}
        sent, refusals = False, 0
        while True:
            answer = self._commit_once(pending, max(deadline - time.monotonic(), 0.0))
            if answer is None:
                self.abandoned = True
                self.wedged = (f"a commit got no answer from the broker within {timeout_s:g} s and holds the "
                               "Kafka client; stopping (a new start makes a new client)")
                log.error("the broker did not answer a commit in time; going on without it",
                          extra={"timeout_s": timeout_s, "partitions": len(pending)})
                why = f"no answer from the broker within {timeout_s:g} s"
                return CommitResult(True, {**refused, **dict.fromkeys(pending, why)})
            result = self._answered(answer, pending)
            sent = sent or result.sent
            refused.update({tp: why for tp, why in result.refused.items() if tp not in result.busy})
            busy = {tp: result.refused[tp] for tp in result.busy}
            wait = backoff_s(coordinator.FIRST_WAIT_S, refusals, coordinator.MAX_WAIT_S)
            if not busy or deadline - (time.monotonic() + wait) < timeout_s / 2:
                return CommitResult(sent, {**refused, **busy}, frozenset(busy))
            refusals += 1
            log.info("the group coordinator is busy; committing again", extra={
                "error": next(iter(busy.values())), "partitions": len(busy), "refusals": refusals,
                "throttle": "coordinator busy commit"})
            time.sleep(wait)
            pending = {tp: offsets[tp] for tp in busy}

    def _commit_once(self, offsets: Mapping[TP, int], timeout_s: float) -> Any:
        """One synchronous commit on a helper thread: its answer (the partitions, or the
        KafkaException), or None when none came within ``timeout_s``."""
        parts = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        answer: list[Any] = []

        def commit_sync() -> None:
            try:
                answer.append(self._c.commit(offsets=parts, asynchronous=False))
            except KafkaException as exc:
                answer.append(exc)

        helper = threading.Thread(target=commit_sync, name="kafka-commit", daemon=True)
        helper.start()
        helper.join(timeout_s)
        return answer[0] if answer else None

    def _answered(self, answer: Any, offsets: Mapping[TP, int]) -> CommitResult:
        """A synchronous commit's answer: a KafkaException, or the partitions with their errors."""
        if isinstance(answer, KafkaException):
            error = str(answer.args[0])
            log.warning("commit failed", extra={"error": error, "partitions": len(offsets)})
            return CommitResult(False, dict.fromkeys(offsets, error),
                                frozenset(offsets) if coordinator.is_busy(answer) else frozenset())
        refused, busy = {}, set()
        for p in answer or []:
            tp = (p.topic, p.partition)
            if p.error:
                refused[tp] = str(p.error)
                if coordinator.is_busy(p.error):
                    busy.add(tp)
            else:
                self.acknowledged[tp] = p.offset
        if refused:
            log.warning("commit failed for some partitions",
                        extra={"error": next(iter(refused.values())), "partitions": len(refused)})
        return CommitResult(True, refused, frozenset(busy))

    def committed(self, tps: Iterable[TP], timeout_s: float = 5.0,
                  ask_again: bool = False) -> dict[TP, int | None]:
        """The group's committed offsets; raises KafkaError when the broker does not answer
        within timeout_s, or refuses a partition (bounded: this runs on the supervisor's loop,
        which asks again on its next turn). ``ask_again``: a busy coordinator's refusal is
        asked again until timeout_s has passed (runtime/kafka/coordinator.py), for callers
        with nothing else to do."""
        start, refused = self._read_committed(tps, timeout_s, ask_again)
        if refused:
            tp, why = next(iter(refused.items()))
            more = f" (+{len(refused) - 1} more)" if len(refused) > 1 else ""
            raise KafkaError(f"reading committed offsets failed: {tp_label(tp)}: {why}{more}")
        return start

    def _read_committed(self, tps: Iterable[TP], timeout_s: float,
                        ask_again: bool) -> tuple[dict[TP, int | None], dict[TP, str]]:
        """The committed offsets the coordinator gave, and the partitions it refused in its
        answer, with why (an error of its own, e.g. not authorised: no answer for that
        partition; read as "nothing committed" it would start at the reset position).
        KafkaError when the request as a whole got no answer."""
        if self.wedged:
            raise KafkaError(self.wedged)
        wanted = [TopicPartition(t, p) for t, p in tps]
        deadline = time.monotonic() + timeout_s

        def ask() -> list[TopicPartition]:
            return self._c.committed(wanted, timeout=max(deadline - time.monotonic(), 0.1))

        try:
            parts = coordinator.until_answered(ask, timeout_s, "committed offsets") if ask_again else ask()
        except KafkaException as exc:
            raise KafkaError(f"reading committed offsets failed: {exc.args[0]}") from None
        start: dict[TP, int | None] = {}
        refused: dict[TP, str] = {}
        for p in parts:
            if p.error is not None:
                refused[(p.topic, p.partition)] = str(p.error)
            else:
                start[(p.topic, p.partition)] = None if p.offset < 0 else p.offset  # OFFSET_INVALID: none
        return start, refused

    def release(self, tp: TP, run: Run) -> None:
        """Nothing to do: dropped records are read again from the seek that follows a fence."""

    def seek_to_start(self, tps: Iterable[TP]) -> list[TP]:
        """Restart fetching of just-assigned partitions at their committed offset (or the
        reset position). A seek also discards whatever librdkafka had queued for them.
        Returns the partitions that could not be sought now (the broker did not answer in
        time): the caller keeps them paused and tries again."""
        tps = list(tps)
        if not tps:
            return []
        try:
            start, refused = self._read_committed(tps, 5.0, ask_again=False)
        except KafkaError as exc:
            log.warning("cannot read committed offsets yet; will retry",
                        extra={"error": str(exc), "throttle": "committed offsets unread"})
            return tps
        for tp, why in refused.items():  # only these wait: the others start
            log.warning("the coordinator refused a partition's committed offset; will retry",
                        extra={"tp": tp_label(tp), "error": why,
                               "throttle": f"committed refused {tp_label(tp)}"})
        failed = list(refused)
        for tp, offset in start.items():
            if not self.seek(tp, self._reset if offset is None else offset):
                failed.append(tp)
        return failed

    def seek(self, tp: TP, offset: int) -> bool:
        """Fetch tp from offset next; what librdkafka had queued for it is discarded (its op
        version moves on). False (logged) if librdkafka refused."""
        if self.wedged:
            return False
        try:
            self._c.seek(TopicPartition(tp[0], tp[1], offset))
            self._remember_start(tp, offset)
            return True
        except KafkaException as exc:
            # A held partition's seek is tried again and again, with a back-off (librdkafka
            # refuses it while its own fetch of the committed offset is unanswered): said once
            # in a while.
            err = exc.args[0]
            code = err.code() if hasattr(err, "code") else ""
            log.warning("seek failed", extra={"tp": tp_label(tp), "offset": offset, "error": str(err),
                                              "throttle": f"seek failed {tp_label(tp)} {code}"})
            return False

    def high_watermark(self, tp: TP) -> int | None:
        """The high watermark cached from fetch responses; for a paused partition (not
        fetched, so its cached value stands still) the broker's latest offset if that is
        higher, asked for every few seconds off the loop (watermarks.py). Never blocks."""
        if self.wedged:
            return None
        try:
            _, cached = self._c.get_watermark_offsets(TopicPartition(*tp), cached=True)
        except KafkaException:
            cached = -1
        high = cached if cached >= 0 else None
        if tp in self._paused and self.state is ConsumerState.CONSUMING and not self._stopping:
            self._latest.refresh(self._paused)
            listed = self._latest.high(tp)
            if listed is not None and (high is None or listed > high):
                return listed
        return high

    def group_standing(self, ask_committed: bool, settle_s: float = 0.0,
                       held: Collection[TP] = ()) -> GroupStanding | None:
        """Where the whole group stands (group_offsets.py), as of the answers so far; asks
        again, off the loop, for what is due (the committed offsets only if ``ask_committed``).
        Never blocks, unless ``settle_s``: then the committed offsets are asked anew, stable,
        and waited for up to that long (also while stopping: the verdict of a stop). ``held``:
        this member's partitions, whose gaps to their end are not asked about (group_offsets.py)."""
        if self._group is not None and settle_s > 0:
            return self._group.settle(settle_s, held)
        if self._group is None or self._stopping or self.wedged:
            return None if self._group is None else self._group.standing()
        self._group.refresh(ask_committed, held)
        return self._group.standing()

    def stop(self) -> None:
        """The member is stopping: ask the broker for nothing more (the ends of paused
        partitions, where the group stands) than the final commit and leaving the group need.
        A request started now would keep the process from exiting until it timed out."""
        self._stopping = True
        self._latest.abandon()
        if self._group is not None:
            self._group.abandon()

    def close(self, timeout_s: float = 30.0) -> bool:
        """Leave the group within timeout_s; False if librdkafka did not finish by then.

        The runtime releases (fences, commits) its partitions before it closes, so the
        rebalance callbacks that close() runs are not passed on. librdkafka's close has no
        timeout and can hang when an assignment arrives while it closes (librdkafka#4527,
        seen again with 2.16 on a rebalancing group): it runs on a helper thread so that a
        daemon told to stop does stop. If abandoned, the broker drops the member after
        session.timeout.ms; nothing is lost, the offsets were committed before. The caller
        must then end the process with os._exit (the client is still in use)."""
        if self.state in (ConsumerState.CLOSING, ConsumerState.CLOSED):
            return not self.abandoned
        self.state = ConsumerState.CLOSING
        if self.wedged:
            return False  # close() would wait behind the commit too; the member times out
        finished, failure = close_within(self._c.close, timeout_s, "kafka-close")
        if not finished:
            self.abandoned = True
            log.error("leaving the consumer group did not finish in time; exiting without it "
                      "(the broker drops this member after session.timeout.ms)",
                      extra={"timeout_s": timeout_s})
            return False
        self.state = ConsumerState.CLOSED
        if failure is not None:
            raise KafkaError(f"closing the consumer failed: {failure}") from failure
        return True


def close_within(close: Callable[[], None], timeout_s: float,
                 thread: str) -> tuple[bool, BaseException | None]:
    """Run a client's close() on a helper thread and wait at most timeout_s: (whether it
    finished, what it raised). librdkafka's close has no timeout of its own (see
    GroupConsumer.close); a close left running keeps the client in use, so the caller must
    end the process with os._exit."""
    failure: list[BaseException] = []

    def leave() -> None:
        try:
            close()
        except BaseException as exc:  # reported by the caller's thread
            failure.append(exc)

    closer = threading.Thread(target=leave, name=thread, daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        return False, None
    return True, failure[0] if failure else None

