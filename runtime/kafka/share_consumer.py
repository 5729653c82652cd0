"""The share consumer: the supervisor's one member of a share group (KIP-932), behind the same
seam as the group consumer (runtime/supervisor/seams/consumer.py ``Consumer``) plus ``acknowledge``.

A share group hands each record to one member at a time under an acquisition lock
(``group.share.record.lock.duration.ms``, 30 s by default); the member accepts, releases or
rejects each record, and a record whose lock runs out goes to another member with its
delivery count raised. This adapter maps that onto the loop's shape:

* records come out of ``consume()`` grouped by partition, in offset order, like the group
  consumer's; a partition is announced (``on_assign``) the first time one of its records
  arrives, and its records of that call are returned by the next call (the loop drops what
  a call that announced partitions returned, runtime/supervisor/datapath/starts.py ``settle``);
* INVARIANT: confluent-kafka refuses ``poll()`` while a record of the previous poll is not
  acknowledged (explicit mode), so ``consume()`` polls only when every record it handed out
  is acknowledged, and otherwise waits (on the workers' results, through ``wait``). A poll
  is a generation: sized by the client, run by the workers, acknowledged, then the next;
* nothing is paused in a share group: while the loop has any partition paused (flow
  control, an operator pause) no poll is made, and records of a paused partition that a
  poll returned are released at once;
* ``release()`` and ``close()`` release what the loop will not run, so that it goes to
  another member now, not when its lock runs out.

Late acknowledgements: a record whose lock ran out while a worker still ran it was handed
to another member; our ACCEPT is then refused by the broker (the commit callback says so),
counted as a lock expiry, and nothing else is done: the other member's acknowledgement is
the one that counts (the record's outputs exist twice, as after any redelivery).

Runs in: supervisor. Not thread-safe (the supervisor is single-threaded).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer, TopicPartition
from confluent_kafka import KafkaError as _CKError
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from runtime.errors import KafkaError
from runtime.kafka.admin import admin_properties
from runtime.kafka.client_log import log_client_error, same_line, with_logger
from runtime.kafka.consumer import Fetched, close_within
from runtime.kafka.messages import bind_packer, offset_of, tp_of
from runtime.kafka.offset_commits import CommitResult
from runtime.tp import TP

log = logging.getLogger(__name__)

OnPartitions = Callable[[list[TP]], None]

NO_SHARE_GROUPS = ("the cluster does not serve share groups (KIP-932), which kafka.group_type = \"share\" "
                   "needs: use Apache Kafka 4.2 or later with the share.version=1 feature enabled "
                   "(`ringmaster broker --apache-kafka` starts one), or set kafka.group_type = \"consumer\"")

# Errors that say the broker has no share groups at all (an older Kafka, Tansu...).
_UNSUPPORTED = {_CKError.UNSUPPORTED_VERSION, _CKError._UNSUPPORTED_FEATURE}


class Outcome(enum.Enum):
    ACCEPT = AcknowledgeType.ACCEPT  # processed: its outputs are delivered
    RELEASE = AcknowledgeType.RELEASE  # not run here: hand it out again (its delivery count rises)
    REJECT = AcknowledgeType.REJECT  # never to be delivered again


@dataclass(slots=True)
class ShareCounts:
    """What this member did with the records it acquired, since it started."""

    acquired: int = 0
    accepted: int = 0
    released: int = 0
    rejected: int = 0
    lock_expiries: int = 0  # acknowledgements refused: the record's lock had run out

    def as_dict(self) -> dict[str, int]:
        return {"acquired": self.acquired, "accepted": self.accepted, "released": self.released,
                "rejected": self.rejected, "lock_expiries": self.lock_expiries}


class ShareGroupConsumer:
    """A share group member, explicit acknowledgement. ``wait(timeout_s)`` is how consume()
    waits while records are out (the daemon passes a wait on the workers' result pipes)."""

    def __init__(self, props: Mapping[str, Any], wait: Callable[[float], None] | None = None,
                 client: Any = None, lock_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        bind_packer()  # the supervisor packs what this consumer hands back
        props = with_logger(props)
        self._bootstrap = str(props.get("bootstrap.servers", ""))
        self._c = client if client is not None else ShareConsumer({**props, "error_cb": self._on_error})
        self._c.set_acknowledgement_commit_callback(self._on_acknowledged)
        self._wait = wait or time.sleep
        self._held: dict[TP, dict[int, Message]] = {}  # acquired, not acknowledged yet
        self._stash: Fetched | None = None  # records of partitions announced by the last call
        self._known: set[TP] = set()
        self._paused: set[TP] = set()
        self._on_assign: OnPartitions = lambda tps: None
        self.counts = ShareCounts()
        self.acknowledged: dict[TP, int] = {}  # (the seam's: share groups commit no offsets)
        self.stats_summary: dict[str, float] = {}
        self.fatal: str | None = None
        self.abandoned = False
        self._closed = False
        self._lock_s = lock_s  # the group's share.record.lock.duration.ms
        self._clock = clock
        self._polled_at = 0.0

    # ------------------------------------------------------------------ client callbacks
    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log_client_error("kafka share consumer", err, self._bootstrap)

    def _on_acknowledged(self, offsets: dict[TopicPartition, set[int]], exc: KafkaException | None) -> None:
        """Runs in: poll()/commit_async()/close(). The broker's answer to acknowledgements."""
        refused = {(tp.topic, tp.partition): offs for tp, offs in offsets.items()
                   if exc is not None or tp.error is not None}
        if not refused:
            return
        n = sum(len(offs) for offs in refused.values())
        self.counts.lock_expiries += n
        why = exc if exc is not None else next(tp.error for tp in offsets if tp.error is not None)
        # Not only a lock run out: after a broker outage the broker refuses acknowledgements
        # of the records it handed out before (NOT_LEADER_FOR_PARTITION, INVALID_RECORD_STATE).
        log.warning("acknowledgements refused: the records' locks ran out or the broker was away; "
                    "it hands them out again",
                    extra={"records": n, "error": str(why), "throttle": "share ack refused"})

    # ------------------------------------------------------------------ the seam
    def subscribe(self, topics: list[str], on_assign: OnPartitions, on_revoke: OnPartitions,
                  on_lost: OnPartitions, /) -> None:
        self._on_assign = on_assign  # partitions are never taken away: a share group shares them
        self._c.subscribe(topics)

    @property
    def held(self) -> int:
        """Records acquired and not acknowledged."""
        return sum(len(offs) for offs in self._held.values())

    def consume(self, max_records: int, timeout_s: float, /) -> Fetched:
        if self.fatal:
            raise KafkaError(f"fatal Kafka client error: {self.fatal}")
        if self._stash is not None:
            out, self._stash = self._stash, None
            return self._without_paused(out)
        if self._closed or self._held or max_records <= 0 or self._paused:
            self._wait(timeout_s)  # the barrier (module docstring), or nothing wanted now
            return Fetched()
        try:
            messages = self._c.poll(timeout_s)
        except KafkaException as exc:
            self._raise_or_log(exc)
            return Fetched()
        out = self._group(messages)
        self._polled_at = self._clock()
        new = [tp for tp in out.runs if tp not in self._known]
        if new:
            self._known.update(new)
            self._on_assign(new)
            self._stash = out
            return Fetched()
        return self._without_paused(out)

    def _group(self, messages: Iterable[Message]) -> Fetched:
        out = Fetched()
        for m in messages:
            err = m.error()
            if err is not None:
                self._handle_error(err)
                continue
            tp, offset = tp_of(m), offset_of(m)
            out.runs.setdefault(tp, []).append(m)
            self._held.setdefault(tp, {})[offset] = m
            out.count += 1
        for run in out.runs.values():
            run.sort(key=offset_of)
        self.counts.acquired += out.count
        return out

    def _without_paused(self, out: Fetched) -> Fetched:
        for tp in [tp for tp in out.runs if tp in self._paused]:
            self.release(tp, out.runs.pop(tp))
        out.count = sum(len(run) for run in out.runs.values())
        return out

    def _handle_error(self, err: _CKError) -> None:
        if err.code() in _UNSUPPORTED:
            raise KafkaError(f"{NO_SHARE_GROUPS} ({err})")
        if err.fatal():
            raise KafkaError(f"fatal Kafka client error: {err}")
        log.warning("share consume error", extra={"error": str(err),
                                                  "throttle": f"share consume {same_line(str(err))}"})

    def _raise_or_log(self, exc: KafkaException) -> None:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], _CKError) else None
        if err is not None:
            self._handle_error(err)
            return
        log.warning("kafka share consumer call failed; carrying on", extra={
            "error": str(exc), "throttle": f"share poll {same_line(str(exc))}"})

    def acknowledge(self, tp: TP, first: int, last: int, outcome: Outcome) -> int:
        """Acknowledge every record of ``tp`` in [first, last] this member holds (a batch's
        records: a share group may have handed the offsets between to other members).
        Returns how many. Once nothing is held, the acknowledgements are sent at once."""
        held = self._held.get(tp)
        if not held:
            return 0
        done = [off for off in held if first <= off <= last]
        for off in done:
            try:
                self._c.acknowledge(held.pop(off), outcome.value)
            except KafkaException as exc:  # closed, or no longer in flight: the broker redelivers it
                log.warning("acknowledgement not recorded", extra={"error": str(exc), "tp": f"{tp}",
                                                                    "throttle": "share ack failed"})
        if not held:
            del self._held[tp]
        n = len(done)
        if outcome is Outcome.ACCEPT:
            self.counts.accepted += n
        elif outcome is Outcome.RELEASE:
            self.counts.released += n
        else:
            self.counts.rejected += n
        if n and not self._held and not self._closed:
            self._send()
            self._watch_the_lock()
        return n

    def _watch_the_lock(self) -> None:
        """A poll is run whole before the next (the barrier): all of it must be done well
        within the records' lock, or the last of them are handed to other members meanwhile."""
        took = self._clock() - self._polled_at
        if took > self._lock_s / 2:
            log.warning("a poll's records took over half their acquisition lock to run: lower "
                        "kafka.consumer.max.poll.records (or add workers), or the broker hands the "
                        "slowest to other members before they are done here",
                        extra={"took_s": round(took, 1), "lock_s": self._lock_s,
                               "throttle": "share poll near lock"})

    def _send(self) -> None:
        try:
            self._c.commit_async()
        except KafkaException as exc:
            self._raise_or_log(exc)

    def release(self, tp: TP, run: Iterable[Message], /) -> None:
        """Records fetched that the loop dropped before running them (a fence, a rewind, an
        operator pause): another member may have them now."""
        for m in run:
            offset = offset_of(m)
            self.acknowledge(tp, offset, offset, Outcome.RELEASE)

    def release_all(self) -> int:
        n = 0
        for tp in list(self._held):
            n += self.acknowledge(tp, 0, 1 << 62, Outcome.RELEASE)
        return n

    def pause(self, tps: list[TP], /) -> None:
        self._paused.update(tps)

    def resume(self, tps: list[TP], /) -> None:
        self._paused.difference_update(tps)

    def commit(self, offsets: dict[TP, int], asynchronous: bool, timeout_s: float, /) -> CommitResult:
        return CommitResult(True)  # no offsets in a share group: acknowledge() is the commit

    def take_refused_commits(self) -> dict[TP, int]:
        return {}

    def seek_to_start(self, tps: list[TP], /) -> list[TP]:
        return []  # the broker decides what each member gets

    def seek(self, tp: TP, offset: int, /) -> bool:
        return True  # a rewind's records were released (the tracker's intents): they come back

    def high_watermark(self, tp: TP, /) -> int | None:
        return None

    def group_standing(self, ask_committed: bool, /, settle_s: float = 0.0,
                       held: Collection[TP] = ()) -> None:
        return None  # a share group has no committed offsets: a member is judged alone

    def stop(self) -> None:
        """No more polls; acknowledgements still go out."""

    def close(self, timeout_s: float = 30.0, /) -> bool:
        """Release what is held (another member runs it now, not when its lock runs out), send
        every acknowledgement and leave the group, within timeout_s (on a helper thread, as
        the group consumer's close: a daemon told to stop does stop)."""
        if self._closed:
            return not self.abandoned
        released = self.release_all()
        if released:
            log.info("released records not done", extra={"records": released})
        self._closed = True
        finished, failure = close_within(self._c.close, timeout_s, "kafka-share-close")
        if not finished:
            self.abandoned = True
            log.error("leaving the share group did not finish in time; exiting without it "
                      "(the broker redelivers this member's records when their locks run out)")
            return False
        if failure is not None:
            raise KafkaError(f"closing the share consumer failed: {failure}") from failure
        return True


def prepare_share_group(props: Mapping[str, Any], group: str, timeout_s: float = 15.0) -> float:
    """Before the daemon owns anything: the cluster must serve share groups (else a KafkaError
    saying so), and a share group that was never told where to start reads from the earliest
    record, as a new consumer group of ringmaster does (Kafka's default for share groups is
    the latest: records produced before the first member joined would be skipped). A start
    an operator set (``kafka-configs --entity-type groups``) is left alone. Returns the
    group's acquisition lock in seconds (share.record.lock.duration.ms)."""
    admin = AdminClient(with_logger(admin_properties(props)))
    resource = ConfigResource(ResourceType.GROUP, group)
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except KafkaException as exc:
        raise KafkaError(f"{NO_SHARE_GROUPS} (describing group {group!r}: {exc.args[0]})") from None
    reset, lock = configs.get("share.auto.offset.reset"), configs.get("share.record.lock.duration.ms")
    if reset is None:
        raise KafkaError(f"{NO_SHARE_GROUPS} (group {group!r} has no share.auto.offset.reset)")
    lock_s = int(lock.value) / 1000 if lock is not None and lock.value else 30.0
    if not reset.is_default:
        return lock_s
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    alter = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    try:
        admin.incremental_alter_configs([alter], request_timeout=timeout_s)[alter].result(timeout_s)
    except KafkaException as exc:
        raise KafkaError(f"setting share.auto.offset.reset = earliest for share group {group!r} failed: "
                         f"{exc.args[0]}") from None
    log.info("share group starts from the earliest records", extra={"group": group})
    return lock_s
