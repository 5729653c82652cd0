"""The group consumer: the supervisor's one member of the consumer group. Its jobs, by module:

    consumer.py        membership (subscribe, the rebalance callbacks, assign, leave) and
                       fetching (consume: runs per partition, end-of-partition events)
    offset_commits.py  commits, asynchronous and synchronous, and the broker's answers
    positions.py       where each partition is read from: pauses, resumes, seeks, the
                       committed offsets a start reads

GroupConsumer is the one object the rooms hold (runtime/supervisor/seams/consumer.py); it hands
each call to the job that does it. Runs in: supervisor. Rebalance callbacks run inside
``consume()`` on the supervisor's one thread. ``runtime/kafka/`` is the only package that
imports ``confluent_kafka`` (the Spark backend aside: it reads offsets and partitions for
Spark's planner, runtime/spark/offsets.py).
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka import KafkaError as _CKError

from runtime.errors import KafkaError
from runtime.kafka.client_log import log_client_error, raise_or_log, same_line, with_logger
from runtime.kafka.group_offsets import GroupOffsets, GroupStanding
from runtime.kafka.messages import bind_packer, offset_of, tp_of
from runtime.kafka.offset_commits import CommitResult, OffsetCommits
from runtime.kafka.positions import Positions
from runtime.kafka.watermarks import LatestOffsets
from runtime.tp import TP
from runtime.transport.packing import Run

log = logging.getLogger(__name__)


_error_of = Message.error  # unbound: called from C by map(), no Python frame a record


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
    # A share group's records at their last delivery that will not be done within their
    # acquisition lock (runtime/kafka/share_consumer.py): the loop dead-letters each, then
    # acknowledges it, rather than let the broker archive it without a trace.
    last_deliveries: dict[TP, Run] = field(default_factory=dict)
    # A share group's partitions whose records out are near the end of their lock: the loop
    # releases what it has not started of them (runtime/supervisor/partition/partition.py,
    # hand_back_unstarted).
    lock_ending: list[TP] = field(default_factory=list)


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
                 on_group_metadata: Callable[[bytes], None] | None = None,
                 client: Consumer | None = None) -> None:
        """``on_group_metadata``: called with the group's serialised metadata (member,
        generation) whenever it changes (exactly-once: runtime/transport/groupmeta.py).
        ``client``: the confluent-kafka consumer to drive (tests pass a fake; by default one
        made from ``props``)."""
        bind_packer()  # the supervisor packs what this consumer hands back
        props = with_logger(props)
        self._on_group_metadata = on_group_metadata
        self._group_metadata = b""
        self._bootstrap = str(props.get("bootstrap.servers", ""))
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
        self._c = client if client is not None else Consumer(props)
        # Its jobs besides fetching: commits and their answers, and where each partition is
        # read from (pauses, seeks, committed offsets).
        self._commits = OffsetCommits(self._c)
        reset_to_end = str(props.get("auto.offset.reset", "earliest")) in ("latest", "end", "largest")
        self._positions = Positions(self._c, self._commits, reset_to_end)
        self.state = ConsumerState.CREATED
        self._closing_abandoned = False  # close() gave up waiting for librdkafka (see close())
        self._in_callback = False  # inside a rebalance callback, i.e. inside consume()
        self._run_key: Callable[[Message], Any] = _topic_partition_of
        # Incremental assignment: cooperative-sticky under the classic protocol, and always
        # under KIP-848 (group.protocol = "consumer"), whose callbacks carry only the change.
        self.cooperative = ("cooperative" in str(props.get("partition.assignment.strategy", ""))
                            or str(props.get("group.protocol", "classic")).strip().lower() == "consumer")

    @property
    def wedged(self) -> str | None:
        """Why the client is held by a synchronous commit that never returned (offset_commits.py)."""
        return self._commits.wedged

    @property
    def abandoned(self) -> bool:
        """close() or a commit gave up waiting for librdkafka: the process must end with os._exit."""
        return self._closing_abandoned or self._commits.abandoned

    @property
    def acknowledged(self) -> dict[TP, int]:
        """The last offset the broker acknowledged, per partition."""
        return self._commits.acknowledged

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
        """Runs in: consume()/commit() (librdkafka's on_commit)."""
        self._commits.on_commit(err, parts)

    def take_refused_commits(self) -> dict[TP, int]:
        return self._commits.take_refused()

    def subscribe(self, topics: list[str], on_assign: Callable[[list[TP]], None],
                  on_revoke: Callable[[list[TP]], None], on_lost: Callable[[list[TP]], None],
                  read_start_s: float | None = None) -> None:
        """``read_start_s``: the committed offsets of each assignment are read in the callback
        (asked again for at most this long) and assigned explicitly, as ``assign()`` does,
        rather than left to librdkafka (librdkafka#5586); if they cannot be read, librdkafka
        reads them. For members that do not seek their partitions after each assignment (the
        supervisor does, off the callback: runtime/supervisor/datapath/starts.py)."""
        self._check()

        def assign_cb(consumer: Consumer, parts: list[TopicPartition]) -> None:
            with self._callback():
                assign(consumer, parts)

        def assign(consumer: Consumer, parts: list[TopicPartition]) -> None:
            tps = [(p.topic, p.partition) for p in parts]
            self._positions.assigned(tps)  # librdkafka starts a new assignment fetching
            # Not while closing: the coordinator refuses offset fetches of a group that is
            # leaving, and the read would be asked again until read_start_s, holding close().
            if read_start_s is not None and tps and self.state is ConsumerState.CONSUMING \
                    and not self._stopping:
                try:
                    parts = self._positions.at_committed(tps, read_start_s)
                except KafkaError as exc:
                    log.warning("committed offsets not read; the client reads them itself",
                                extra={"error": str(exc), "partitions": len(tps)})
            # INVARIANT: assign before the runtime re-applies its pause state; a pause on a
            # partition that is not yet assigned is silently ignored by librdkafka.
            if self.cooperative:
                consumer.incremental_assign(parts)
            else:
                consumer.assign(parts)
            self._positions.note_start(parts)
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
        parts = self._positions.at_committed(list(tps), timeout_s)
        self._run_key = Message.partition if topics == 1 else _topic_partition_of
        self._c.assign(parts)
        self._positions.note_start(parts)
        self.state = ConsumerState.CONSUMING

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
            raise_or_log(exc, "consume")
            messages = []
        self._share_group_metadata()
        for _, run_iter in groupby(messages, self._run_key):
            run = list(run_iter)
            # INVARIANT: a run holds records only. librdkafka queues a partition's events (its
            # end, mostly) between its records, and one call takes whatever is queued: records,
            # the end, the records fetched after it. Looked for at the run's edges only, an end
            # in the middle was cut as a record, at the offset of the record after it: the
            # plugin ran librdkafka's error text, and the cut went backwards ("span [24..24]
            # overlaps or goes backwards", the cluster matrix, with a loop slowed by a fault).
            # A C-level scan: ~20 ns a record.
            if any(map(_error_of, run)):
                run = self._records_of(run, out)
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

    def _records_of(self, run: list[Message], out: Fetched) -> list[Message]:
        """The records of ``run``; its events are handled (an end goes to ``out.eof``: the
        last one of a partition counts, and Partition.reached_end judges it against the
        records that came after it)."""
        records = []
        for m in run:
            err = m.error()
            if err is None:
                records.append(m)
            else:
                self._handle_message_error(m, err, out)
        return records

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

    def pause(self, tps: Iterable[TP]) -> None:
        self._positions.pause(tps)

    def resume(self, tps: Iterable[TP]) -> None:
        self._positions.resume(tps)

    def _let_go(self, tps: list[TP]) -> None:
        self._positions.let_go(tps)
        self._latest.forget(tps)

    def commit(self, offsets: Mapping[TP, int], asynchronous: bool,
               timeout_s: float = 30.0) -> CommitResult:
        """Commit next-offsets (offset_commits.py); never raises for commit errors."""
        return self._commits.commit(offsets, asynchronous, timeout_s,
                                    self.state is ConsumerState.CONSUMING, self._in_callback)

    def committed(self, tps: Iterable[TP], timeout_s: float = 5.0,
                  ask_again: bool = False) -> dict[TP, int | None]:
        """The group's committed offsets (positions.py); KafkaError if unanswered or refused."""
        return self._positions.committed(tps, timeout_s, ask_again)

    def release(self, tp: TP, run: Run, keep: bool = False) -> None:
        """Nothing to do: dropped records are read again from the seek that follows a fence."""

    def seek_to_start(self, tps: Iterable[TP]) -> list[TP]:
        """Just-assigned partitions to their committed offsets (positions.py); those that could
        not be sought now are returned."""
        return self._positions.seek_to_start(tps)

    def seek(self, tp: TP, offset: int) -> bool:
        return self._positions.seek(tp, offset)

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
        paused = self._positions.paused
        if tp in paused and self.state is ConsumerState.CONSUMING and not self._stopping:
            self._latest.refresh(paused)
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
            self._closing_abandoned = True
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

