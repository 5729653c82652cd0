"""The share consumer: the supervisor's one member of a share group (KIP-932), behind the same
seam as the group consumer (runtime/supervisor/seams/consumer.py ``Consumer``) plus ``acknowledge``.

A share group hands each record to one member at a time under an acquisition lock (the group's
``share.record.lock.duration.ms``, 30 s by default); the member accepts, releases or rejects
each record, and a record whose lock runs out goes to another member with its delivery count
raised. Every delivery counts: at the group's ``share.delivery.count.limit`` (5 by default) a
record released, or whose lock runs out, is archived by the broker, with no trace. Both are
read from the group at start (``prepare_share_group``). This adapter maps that onto the loop:

* records come out of ``consume()`` grouped by partition, in offset order, like the group
  consumer's; a partition is announced (``on_assign``) the first time one of its records
  arrives, and its records of that call are returned by the next call (the loop drops what
  a call that announced partitions returned, runtime/supervisor/datapath/starts.py ``settle``);
* INVARIANT: confluent-kafka refuses ``poll()`` while a record of the previous poll is not
  acknowledged (explicit mode), so ``consume()`` polls only when no record is held;
* a poll's records are handed to the loop no more than ``max_records`` at a time (the loop asks
  for what its workers can start well within the lock: intake.py); the others wait here;
* acknowledgements go to the broker every tick (``commit_async``), batch by batch as the loop
  makes them, not once a whole poll is done: a member killed leaves to the others only what it
  had not finished, and a slow batch does not hold the lock of a whole poll;
* a record the loop hands back to run again after a wait (a deferral: an outage, a plugin's
  ``Backoff``) is kept here, not released, and handed out again when its partition resumes:
  a release would spend one of its deliveries each time;
* as a record's lock nears its end (``LOCK_MARGIN``) a record not handed out or kept is
  released, so that it goes on with a fresh lock, unless it is at its last delivery: then a
  kept one is handed to the loop to dead-letter (``Fetched.last_deliveries``), and one not
  handed out yet is handed out. INVARIANT: a record at its last delivery is never released
  (the broker would archive it): its outputs or its dead letter are written here;
* nothing is paused in a share group: while the loop has any partition paused no poll is made.

Counts (``ShareCounts``) are what the broker did, from its answers to the acknowledgements and
the lock's clock: an acknowledgement sent after the record's lock ended (the broker may have
handed the record to another member, or archived it, and answers without an error: seen on
Apache Kafka 4.4) or refused by the broker counts as a lock expiry, never as accepted or
released. Once nothing is held or unanswered, acquired = accepted + released + rejected +
lock_expiries.

Runs in: supervisor. Not thread-safe (the supervisor is single-threaded).
"""

from __future__ import annotations

import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import AcknowledgeType, KafkaException, Message, ShareConsumer, TopicPartition
from confluent_kafka import KafkaError as _CKError
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from runtime.errors import KafkaError
from runtime.kafka.admin import answer, ask_anew, unanswered
from runtime.kafka.client_log import log_client_error, same_line, with_logger
from runtime.kafka.consumer import Fetched, close_within
from runtime.kafka.messages import bind_packer, offset_of, tp_of
from runtime.kafka.offset_commits import CommitResult
from runtime.tp import TP, tp_label

log = logging.getLogger(__name__)

OnPartitions = Callable[[list[TP]], None]

NO_SHARE_GROUPS = ("the cluster does not serve share groups (KIP-932), which kafka.group_type = \"share\" "
                   "needs: use Apache Kafka 4.2 or later with the share.version=1 feature enabled "
                   "(`ringmaster broker --apache-kafka` starts one), or set kafka.group_type = \"consumer\"")

# Errors that say the broker has no share groups at all (an older Kafka, Tansu...).
_UNSUPPORTED = {_CKError.UNSUPPORTED_VERSION, _CKError._UNSUPPORTED_FEATURE}

# The last part of a record's lock in which it is no longer handed out or kept here: released
# (it goes on elsewhere, or here, with a fresh lock) or, at its last delivery, dead-lettered;
# and in which no dead letter of a crashing record is written (another member may get it once
# the lock ends: the letter is its to write). A quarter: 7.5 s of the default 30 s lock for a
# letter and its acknowledgement to reach the broker.
LOCK_MARGIN = 0.25


class Outcome(enum.Enum):
    ACCEPT = AcknowledgeType.ACCEPT  # processed: its outputs are delivered
    RELEASE = AcknowledgeType.RELEASE  # not run here: hand it out again (its delivery count rises)
    REJECT = AcknowledgeType.REJECT  # never to be delivered again


@dataclass(frozen=True, slots=True)
class ShareGroupConfig:
    """The group's settings the member lives by, read from the broker at start."""

    lock_s: float = 30.0  # share.record.lock.duration.ms
    delivery_limit: int = 5  # share.delivery.count.limit


@dataclass(slots=True)
class ShareCounts:
    """What the broker did with the records this member acquired, since it started."""

    acquired: int = 0
    accepted: int = 0
    released: int = 0
    rejected: int = 0
    lock_expiries: int = 0  # acknowledged after the record's lock ended, or refused by the broker

    def as_dict(self) -> dict[str, int]:
        return {"acquired": self.acquired, "accepted": self.accepted, "released": self.released,
                "rejected": self.rejected, "lock_expiries": self.lock_expiries}

    @property
    def settled(self) -> int:
        return self.accepted + self.released + self.rejected + self.lock_expiries


class _State(enum.Enum):
    WAITING = "waiting"  # acquired, not handed to the loop yet
    OUT = "out"  # handed to the loop: cut into a batch, in a ring, running
    KEPT = "kept"  # handed back by the loop to run again after a wait: handed out again on resume
    LAST = "last"  # at its last delivery and not done in time: the loop dead-letters it


@dataclass(slots=True)
class _Held:
    message: Message
    count: int  # its delivery count, this delivery included
    deadline: float  # when its acquisition lock ends (clock time: the poll's start + the lock)
    state: _State = _State.WAITING


class ShareGroupConsumer:
    """A share group member, explicit acknowledgement. ``wait(timeout_s)`` is how consume()
    waits while records are out (the daemon passes a wait on the workers' result pipes)."""

    def __init__(self, props: Mapping[str, Any], wait: Callable[[float], None] | None = None,
                 client: Any = None, group: ShareGroupConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        bind_packer()  # the supervisor packs what this consumer hands back
        props = with_logger(props)
        self._bootstrap = str(props.get("bootstrap.servers", ""))
        self._c = client if client is not None else ShareConsumer({**props, "error_cb": self._on_error})
        self._c.set_acknowledgement_commit_callback(self._on_acknowledged)
        self._wait = wait or time.sleep
        self.group = group or ShareGroupConfig()
        self._clock = clock
        self._held: dict[TP, dict[int, _Held]] = {}  # acquired, not acknowledged yet
        # What _hand_out takes from, so that a tick costs what it hands out, not what is held:
        # the offsets of records waiting (in the order they go: last deliveries first; an entry
        # whose record is no longer waiting is skipped), and of records kept.
        self._queue: dict[TP, deque[int]] = {}
        self._kept: dict[TP, set[int]] = {}
        # Acknowledgements sent and not answered: (tp, offset) -> [(outcome, sent after the lock)].
        self._unanswered: dict[tuple[TP, int], list[tuple[Outcome, bool]]] = {}
        self._unsent = False  # acknowledgements recorded in the client, not sent yet
        self._known: set[TP] = set()
        self._paused: set[TP] = set()
        self._on_assign: OnPartitions = lambda tps: None
        self._deadline = 0.0  # when the lock of the records held ends (one poll's: the barrier)
        self.counts = ShareCounts()
        self.acknowledged: dict[TP, int] = {}  # (the seam's: share groups commit no offsets)
        self.stats_summary: dict[str, float] = {}
        self.fatal: str | None = None
        self.abandoned = False
        self._closed = False

    @property
    def lock_s(self) -> float:
        return self.group.lock_s

    # ------------------------------------------------------------------ client callbacks
    def _on_error(self, err: _CKError) -> None:
        if err.fatal():
            self.fatal = str(err)
        log_client_error("kafka share consumer", err, self._bootstrap)

    def _on_acknowledged(self, offsets: dict[TopicPartition, set[int]], exc: KafkaException | None) -> None:
        """Runs in: poll()/commit_async()/close(). The broker's answer to acknowledgements: the
        one place the counts of what it did move (module docstring)."""
        c = self.counts
        refused = late = 0
        for tp, offs in offsets.items():
            error = exc if exc is not None else tp.error
            key = (str(tp.topic), tp.partition)
            for off in offs:
                sent = self._unanswered.get((key, off))
                if not sent:
                    continue  # not ours to count (answered already)
                outcome, after_lock = sent.pop(0)
                if not sent:
                    del self._unanswered[(key, off)]
                if error is not None or after_lock:
                    c.lock_expiries += 1
                    refused += error is not None
                    late += error is None
                elif outcome is Outcome.ACCEPT:
                    c.accepted += 1
                elif outcome is Outcome.RELEASE:
                    c.released += 1
                else:
                    c.rejected += 1
        if refused:
            why = exc if exc is not None else next(tp.error for tp in offsets if tp.error is not None)
            # Not only a lock run out: after a broker outage the broker refuses acknowledgements
            # of the records it handed out before (NOT_LEADER_FOR_PARTITION, INVALID_RECORD_STATE).
            log.warning("acknowledgements refused: the records' locks ran out or the broker was away; "
                        "it hands them out again", extra={"records": refused, "error": str(why),
                                                          "throttle": "share ack refused"})
        if late:
            log.warning("records acknowledged after their acquisition lock ended: the broker may have "
                        "handed them to another member (their outputs then exist twice) or, at their "
                        "last delivery, archived them; counted as lock expiries",
                        extra={"records": late, "lock_s": self.group.lock_s, "throttle": "share ack late"})

    # ------------------------------------------------------------------ the seam
    def subscribe(self, topics: list[str], on_assign: OnPartitions, on_revoke: OnPartitions,
                  on_lost: OnPartitions, /) -> None:
        self._on_assign = on_assign  # partitions are never taken away: a share group shares them
        self._c.subscribe(topics)

    @property
    def held(self) -> int:
        """Records acquired and not acknowledged."""
        return sum(len(offs) for offs in self._held.values())

    def holding(self) -> dict[str, int]:
        """What is held now, for the status: records acquired and not acknowledged (``held``:
        of which ``kept``, to run again after a wait, and ``waiting``, not handed to the loop
        yet) and acknowledgements the broker has not answered (``unanswered``)."""
        states = [h.state for held in self._held.values() for h in held.values()]
        return {"held": len(states), "kept": states.count(_State.KEPT),
                "waiting": states.count(_State.WAITING), "unanswered": len(self._unanswered)}

    def consume(self, max_records: int, timeout_s: float, /) -> Fetched:
        """Up to ``max_records`` of the records held here (kept ones first, then those of the
        last poll not handed out yet), and the records the loop must dead-letter now; a new
        poll only once nothing of the last one is held."""
        if self.fatal:
            raise KafkaError(f"fatal Kafka client error: {self.fatal}")
        out = self._watch_locks(self._clock())
        self._hand_out(out, max(0, max_records))
        self._send()
        if out.count or out.last_deliveries:
            return out
        if self._closed or self._held or max_records <= 0 or self._paused:
            self._wait(timeout_s)  # the barrier (module docstring), or nothing wanted now
            self._send()  # serves the answers to what was sent meanwhile
            return out
        polled_at = self._clock()
        try:
            messages = self._c.poll(timeout_s)
        except KafkaException as exc:
            self._raise_or_log(exc)
            return out
        self._deadline = polled_at + self.group.lock_s
        new = self._take(messages, self._deadline)
        if new:
            self._known.update(new)
            self._on_assign(new)
            return out  # their records come with the next call (starts.py settles first)
        self._hand_out(out, max_records)
        return out

    def _take(self, messages: Iterable[Message], deadline: float) -> list[TP]:
        """A poll's records, held here (WAITING); returns the partitions seen the first time."""
        new: list[TP] = []
        for m in messages:
            err = m.error()
            if err is not None:
                self._handle_error(err)
                continue
            tp, offset = tp_of(m), offset_of(m)
            if tp not in self._known and tp not in new:
                new.append(tp)
            self._held.setdefault(tp, {})[offset] = _Held(m, m.delivery_count() or 1, deadline)
            self.counts.acquired += 1
        limit = self.group.delivery_limit
        for tp, held in self._held.items():
            order = sorted((off for off, h in held.items() if h.state is _State.WAITING),
                           key=lambda off: (held[off].count < limit, off))
            self._queue[tp] = deque(order)
        return new

    def _hand_out(self, out: Fetched, max_records: int) -> None:
        """Kept records of partitions not paused, then waiting ones, up to max_records in all
        (records at their last delivery whatever the limit: they cannot wait), each
        partition's in offset order."""
        room = max_records - out.count
        limit = self.group.delivery_limit
        for tp, held in self._held.items():
            if tp in self._paused or tp not in self._known:
                continue
            take: list[_Held] = []
            kept = self._kept.get(tp, set())
            for off in sorted(kept, key=lambda off: (held[off].count < limit, off)):
                if len(take) >= room and held[off].count < limit:
                    break
                take.append(held[off])
                kept.discard(off)
            queue = self._queue.get(tp)
            while queue:
                waiting = held.get(queue[0])
                if waiting is None or waiting.state is not _State.WAITING:
                    queue.popleft()  # acknowledged, or kept, meanwhile
                    continue
                if len(take) >= room and waiting.count < limit:
                    break
                take.append(waiting)
                queue.popleft()
            if not take:
                continue
            for h in take:
                h.state = _State.OUT
            run = sorted((h.message for h in take), key=offset_of)
            out.runs.setdefault(tp, []).extend(run)
            out.count += len(run)
            room -= len(run)

    def _watch_locks(self, now: float) -> Fetched:
        """What the end of the lock asks for (module docstring), within LOCK_MARGIN of it:
        records not out (waiting, kept) are released, or, at their last delivery, handed to
        the loop (to run, or, kept or paused, to dead-letter); the partitions of records out
        (their batch cut, waiting for a worker) are named in ``lock_ending``, so that the loop
        hands back what it has not started. A lock cannot be renewed (confluent-kafka 2.16 has
        no RENEW, KIP-1222). The records held are one poll's (the barrier), under one lock."""
        out = Fetched()
        margin = LOCK_MARGIN * self.group.lock_s
        if not self._held or now < self._deadline - margin:
            return out
        limit = self.group.delivery_limit
        for tp, held in list(self._held.items()):
            for off, h in list(held.items()):
                if h.state is _State.OUT:
                    if h.count < limit and (not out.lock_ending or out.lock_ending[-1] != tp):
                        out.lock_ending.append(tp)
                elif h.state is _State.LAST:
                    continue
                elif h.count < limit:
                    self._ack(tp, off, h, Outcome.RELEASE, now)
                elif h.state is _State.KEPT or tp in self._paused:
                    h.state = _State.LAST
                    self._kept.get(tp, set()).discard(off)
                    out.last_deliveries.setdefault(tp, []).append(h.message)
                # else: waiting at its last delivery: handed out first (_hand_out)
            if not held:
                del self._held[tp]
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
        records: a share group may have handed the offsets between to other members); it goes
        to the broker with the next tick's. Returns how many. A RELEASE of a record at its last
        delivery keeps it instead (it would be archived): handed out again, or dead-lettered
        near the end of its lock."""
        held = self._held.get(tp)
        if not held:
            return 0
        now = self._clock()
        n = 0
        for off in [off for off in held if first <= off <= last]:
            h = held[off]
            if outcome is Outcome.RELEASE and h.count >= self.group.delivery_limit:
                h.state = _State.KEPT  # INVARIANT: never released at its last delivery
                self._kept.setdefault(tp, set()).add(off)
                continue
            self._ack(tp, off, h, outcome, now)
            n += 1
        if not held:
            del self._held[tp]
        return n

    def _ack(self, tp: TP, off: int, h: _Held, outcome: Outcome, now: float) -> None:
        del self._held[tp][off]
        self._kept.get(tp, set()).discard(off)
        try:
            self._c.acknowledge(h.message, outcome.value)
        except KafkaException as exc:  # closed, or no longer in flight: the broker redelivers it
            self.counts.lock_expiries += 1
            log.warning("acknowledgement not recorded", extra={"error": str(exc), "tp": tp_label(tp),
                                                                "throttle": "share ack failed"})
            return
        self._unanswered.setdefault((tp, off), []).append((outcome, now >= h.deadline))
        self._unsent = True

    def keep(self, tp: TP, first: int, last: int) -> int:
        """Records of ``tp`` in [first, last] the loop will run again after a wait (a deferral):
        kept here, not released, and handed out again once the partition resumes (or released,
        or dead-lettered, as their lock nears its end). Returns how many."""
        held = self._held.get(tp, {})
        kept = [off for off, h in held.items() if first <= off <= last and h.state is _State.OUT]
        for off in kept:
            held[off].state = _State.KEPT
        self._kept.setdefault(tp, set()).update(kept)
        return len(kept)

    def may_dead_letter(self, tp: TP, offset: int) -> bool:
        """Whether this member may write the dead letter of a record it holds: while its lock
        has time left for the letter and its acknowledgement (LOCK_MARGIN), or at its last
        delivery (no other member will get it). Otherwise another member may be handed it
        once the lock ends and write a letter of its own: the record is released instead, and
        the next delivery, its count raised, isolates it sooner."""
        h = self._held.get(tp, {}).get(offset)
        if h is None:
            return False
        return (h.count >= self.group.delivery_limit
                or self._clock() < h.deadline - LOCK_MARGIN * self.group.lock_s)

    def _send(self) -> None:
        """Send what was acknowledged since the last call, and serve the broker's answers (a
        commit_async with nothing new serves them too: the callback runs inside it)."""
        if not self._unsent and not self._unanswered:
            return
        self._unsent = False
        try:
            self._c.commit_async()
        except KafkaException as exc:
            self._raise_or_log(exc)

    def release(self, tp: TP, run: Iterable[Message], keep: bool = False, /) -> None:
        """Records fetched that the loop dropped before running them (a fence, a rewind, an
        operator pause). ``keep``: it will run them after a wait (a deferral): kept here.
        Otherwise another member may have them now, and so may the records of ``tp`` not
        handed out yet and those kept for a wait (an operator's pause during a deferral hands
        them to the others too), but one at its last delivery."""
        if keep:
            for m in run:
                offset = offset_of(m)
                self.keep(tp, offset, offset)
            return
        for m in run:
            offset = offset_of(m)
            self.acknowledge(tp, offset, offset, Outcome.RELEASE)
        held = self._held.get(tp, {})
        for off in self._queue.pop(tp, ()):
            h = held.get(off)
            if h is not None and h.state is _State.WAITING:
                self.acknowledge(tp, off, off, Outcome.RELEASE)
        for off in sorted(self._kept.pop(tp, ())):
            h = held.get(off)
            if h is not None and h.state is _State.KEPT:
                self.acknowledge(tp, off, off, Outcome.RELEASE)  # kept again if at its last delivery

    def settle(self, timeout_s: float) -> None:
        """A stop: release what is held (the loop gave up what it did not finish; a record at
        its last delivery is not released), send every acknowledgement and wait up to
        ``timeout_s`` for the broker's answers, so that the counts are final before the
        daemon's last status."""
        self.release_all()
        if not self._unsent and not self._unanswered:
            return
        self._unsent = False
        try:
            self._c.commit_sync(timeout_s)
        except KafkaException as exc:
            self._raise_or_log(exc)

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
        return True  # a rewind's records were kept or released: they come back

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
        the group consumer's close: a daemon told to stop does stop). A record at its last
        delivery not done is not released; the broker archives it when this member leaves
        (said in the log: docs/share-groups.md, Not covered)."""
        if self._closed:
            return not self.abandoned
        released = self.release_all()
        if released:
            log.info("released records not done", extra={"records": released})
        if self.held:
            log.error("records at their last delivery were not done when the daemon stopped: the broker "
                      "archives them as this member leaves, with no dead letter",
                      extra={"records": self.held, "delivery_limit": self.group.delivery_limit,
                             "offsets": ",".join(f"{tp_label(tp)}@{off}" for tp, offs in self._held.items()
                                                 for off in offs)[:500]})
        self._send()
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


def prepare_share_group(props: Mapping[str, Any], group: str, timeout_s: float = 15.0) -> ShareGroupConfig:
    """Before the daemon owns anything: the cluster must serve share groups (else a KafkaError
    saying so; KafkaUnreachable when it does not answer within timeout_s), and a share group
    that was never told where to start reads from the earliest record, as a new consumer group
    of ringmaster does (Kafka's default for share groups is the latest: records produced
    before the first member joined would be skipped). A start
    an operator set (``kafka-configs --entity-type groups``) is left alone. Returns the
    group's acquisition lock (share.record.lock.duration.ms) and delivery-count limit
    (share.delivery.count.limit), as the broker describes them (the group's, or the broker's
    defaults)."""
    resource = ConfigResource(ResourceType.GROUP, group)
    # Asked anew by a new client while a node has just died (CONTROLLER_WAIT, runtime/kafka/admin.py).
    try:
        configs = ask_anew(props, timeout_s, lambda admin, attempt_s: answer(
            admin.describe_configs([resource], request_timeout=attempt_s)[resource], attempt_s))
    except KafkaException as exc:
        raise unanswered(props, exc, f"describing share group {group!r}", timeout_s) or KafkaError(
            f"{NO_SHARE_GROUPS} (describing group {group!r}: {exc.args[0]})") from None
    reset = configs.get("share.auto.offset.reset")
    if reset is None:
        raise KafkaError(f"{NO_SHARE_GROUPS} (group {group!r} has no share.auto.offset.reset)")
    config = ShareGroupConfig(_number(configs, "share.record.lock.duration.ms", 30_000) / 1000,
                              int(_number(configs, "share.delivery.count.limit", 5)))
    log.info("share group", extra={"group": group, "lock_s": config.lock_s,
                                   "delivery_limit": config.delivery_limit})
    if not reset.is_default:
        return config
    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    alter = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    try:
        ask_anew(props, timeout_s, lambda admin, attempt_s: answer(
            admin.incremental_alter_configs([alter], request_timeout=attempt_s)[alter], attempt_s))
    except KafkaException as exc:
        doing = f"setting share.auto.offset.reset = earliest for share group {group!r}"
        raise unanswered(props, exc, doing, timeout_s) or KafkaError(
            f"{doing} failed: {exc.args[0]}") from None
    log.info("share group starts from the earliest records", extra={"group": group})
    return config


def _number(configs: Mapping[str, Any], name: str, default: int) -> int:
    """A group config's value; the default when the broker does not describe it (an older
    Kafka: share.delivery.count.limit became a group config in 4.2)."""
    entry = configs.get(name)
    return int(entry.value) if entry is not None and entry.value else default
