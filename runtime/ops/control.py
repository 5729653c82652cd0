"""Operator pauses: group-wide, durable, exact. Runs in: supervisor (reading), the
``ringmaster pause``/``resume`` commands (writing), the Spark driver (reading).

The state lives in Kafka itself, so it needs no new infrastructure and every member of the
group sees the same: a compacted **control topic** per group (``[control] topic``, by
default ``_ringmaster.control.<group>``), created when missing. A record's key is the scope
it pauses — ``*`` (every topic the group reads), ``topic:<name>`` or
``partition:<name>:<n>`` — and its value a JSON document: paused or not, why, by whom,
since when, until when (control_records.py says exactly what is valid). Compaction keeps
the last word per scope; a tombstone resumes its scope.

Each supervisor reads the whole topic with an assign-only consumer (no group: it joins
nothing and commits nothing) before it subscribes — so a member that starts, restarts or
joins never processes a batch of a paused partition — and then follows it every tick, so a
pause takes effect on every host within about a fetch wait (500 ms) plus the
batches in progress, which finish and commit. librdkafka forgets pauses across rebalances;
this state does not: every (incremental) assignment is held at once if a pause covers it.

Whatever the topic holds, reading it never raises and never stops the daemon: a record
that is not a valid pause or resume is ignored (it neither pauses nor resumes) and logged
once — at load, one line per kind of problem for the records that are still the last word
of their key; while following, each one, throttled. Loading is linear in the records read
(the next ``--for`` expiry is recomputed once per load or poll, not per record), and what
status and /metrics show of it is bounded (``LISTED`` pauses, reasons cut short).

Semantics (docs/operations.md, "Pausing a group"): a paused partition is fenced like a revocation – the
batch in progress finishes and is committed, frames still queued in rings are dropped and
read again after the resume, from the lowest unhandled offset (a pause means "stop now",
not "after the minutes of work in the rings"). Lag grows while paused. Flow control never
resumes an operator-paused partition. SIGTERM while paused stops as usual; the pause stays
in the topic for the next start. ``--for`` is wall-clock time: a member whose clock is off
by *s* ends the pause *s* early or late.
"""

from __future__ import annotations

import collections
import getpass
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.config import Settings
from runtime.errors import ConfigError, InvalidControlRecord, KafkaError
from runtime.kafka.admin import create_topic
from runtime.kafka.producer import write_acknowledged
from runtime.kafka.properties import consumer_properties, producer_properties
from runtime.kafka.topic_reader import Apply, TopicReader
from runtime.ops.control_records import (
    ALL,
    Command,
    Pause,
    cut,
    describe_problem,
    describe_scope,
    is_command_key,
    parse_command,
    parse_record,
    parse_scope,
    scope_key,
    scope_topic,
)
from runtime.tp import TP

log = logging.getLogger("ringmaster.control")

Record = tuple[bytes | None, bytes | None]
MAX_SCOPES = 10_000  # pauses in force at once; more is not an operator's doing
MAX_BAD_KEYS = 1_000  # invalid records remembered by key (to tell which are still the last word)
LISTED = 50  # pauses listed in status and /metrics; the rest are counted
LISTED_REASON_CHARS = 256
MAX_WAITING_COMMANDS = 16  # commands read and not yet taken; more is not an operator's doing

__all__ = ["ALL", "OperatorPauses", "Pause", "ResumePlan", "control_topic", "describe_scope",
           "ensure_control_topic", "plan_resume", "reader_properties", "scope_key", "who", "write"]


def control_topic(settings: Settings) -> str:
    return settings.control.topic_for(settings.kafka.group_id)


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class Reader(Protocol):
    """What OperatorPauses needs of runtime.kafka.topic_reader.TopicReader (tests fake it)."""

    def read_to_end(self, apply: Apply, timeout_s: float, what: str) -> int: ...
    def poll(self, apply: Apply, max_records: int = 100) -> int: ...
    def close(self) -> None: ...


@dataclass
class _Invalid:
    """The invalid records still standing as the last word of their key."""

    by_key: dict[bytes | None, tuple[InvalidControlRecord, int]] = field(default_factory=dict)
    untracked: collections.Counter[str] = field(default_factory=collections.Counter)  # past MAX_BAD_KEYS

    def note(self, key: bytes | None, exc: InvalidControlRecord, offset: int) -> None:
        if key in self.by_key or len(self.by_key) < MAX_BAD_KEYS:
            self.by_key[key] = (exc, offset)
        else:
            self.untracked[exc.kind] += 1

    def superseded(self, key: bytes | None) -> None:
        self.by_key.pop(key, None)


class OperatorPauses:
    """The group's pause state, read from the control topic. ``load()`` reads it to its end
    (blocking, bounded); ``poll()`` follows it without blocking. Neither raises for what a
    record holds."""

    def __init__(self, topic: str, consumer_props: dict[str, Any], load_timeout_s: float = 30.0,
                 ensure_topic: Callable[[], None] = lambda: None,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 reader: Callable[[str, dict[str, Any]], Reader] = TopicReader) -> None:
        self.topic = topic
        self._make_reader = reader
        self.consumer_props = consumer_props
        self.load_timeout_s = load_timeout_s
        self._ensure_topic = ensure_topic
        self._wall_ms = wall_ms
        self._state: dict[str, Pause] = {}  # scope -> its pause (resumed scopes are dropped)
        self._invalid = _Invalid()
        self._reader: Reader | None = None
        self._loading = False
        self._next_expiry: int | None = None
        self._expiry_stale = False  # a record with (or replacing one with) an end arrived
        self.expiry_scans = 0  # pauses visited recomputing the next expiry (the work loading does)
        self.changed = True
        # The offset after the last record taken: a member's status says it (runtime/ops/
        # member_status.py), so the console can tell who has seen an action it wrote.
        self.read_to = 0
        self._commands: collections.deque[Command] = collections.deque()

    @classmethod
    def for_settings(cls, settings: Settings) -> OperatorPauses:
        return cls(control_topic(settings), reader_properties(settings), settings.control.load_timeout_s,
                   lambda: ensure_control_topic(settings))

    # ------------------------------------------------------------------ reading
    def load(self, timeout_s: float | None = None, report: bool = True) -> None:
        """Create the topic if missing, then read it to its end. Raises KafkaError (or
        KafkaUnreachable) when the cluster does not let it; never for what the topic holds.
        ``report``: log the invalid records and the pauses in force (``resume`` reports
        them its own way)."""
        timeout_s = timeout_s or self.load_timeout_s
        self._ensure_topic()
        self._reader = self._make_reader(self.topic, self.consumer_props)
        self._loading = True
        try:
            self._reader.read_to_end(self.apply, timeout_s, "control topic")
        except KafkaError as exc:
            raise type(exc)(f"{exc} (control.load_timeout_s {timeout_s:g} s): operator pauses would be "
                            "unknown, so the supervisor does not start") from None
        finally:
            self._loading = False
        self._recompute_expiry(self._wall_ms())
        if not report:
            return
        self._report_invalid()
        active = self.active()
        if active:
            log.info("operator pauses in force", extra={
                "pauses": len(active), "scopes": ", ".join(describe_scope(p.scope) for p in active[:10])
                + (f" (+{len(active) - 10} more)" if len(active) > 10 else "")})

    def poll(self) -> bool:
        """Take what arrived; True when the state changed (or a --for pause just ended)."""
        if self._reader is not None:
            try:
                self._reader.poll(self.apply)
            except KafkaError as exc:
                log.warning("reading the control topic failed; carrying on",
                            extra={"error": str(exc), "throttle": f"control read {self.topic}"})
        now = self._wall_ms()
        if self._expiry_stale or (self._next_expiry is not None and now >= self._next_expiry):
            ended = self._next_expiry is not None and now >= self._next_expiry
            self._recompute_expiry(now)
            self.changed = self.changed or ended
        changed, self.changed = self.changed, False
        return changed

    def apply(self, key: bytes | None, value: bytes | None, offset: int = -1) -> None:
        """Take one record of the control topic. Never raises: an invalid record is noted
        (logged once) and changes nothing."""
        if offset >= 0:
            self.read_to = max(self.read_to, offset + 1)
        if is_command_key(key):
            self._take_command(key, value, offset)
            return
        try:
            pause = parse_record(key, value)
        except InvalidControlRecord as exc:
            if value is None:  # a tombstone for a key that is not a scope: junk being cleared
                self._invalid.superseded(key)
            else:
                self._reject(key, exc, offset)
            return
        except Exception as exc:  # defence in depth: no record may stop a daemon
            self._reject(key, InvalidControlRecord(f"unreadable: {type(exc).__name__}: {exc}", "unreadable"),
                         offset)
            return
        self._invalid.superseded(key)
        self._take(pause, key, offset)

    def _take_command(self, key: bytes | None, value: bytes | None, offset: int) -> None:
        """A command (reload, scale) is for the members that read it while following: one read
        at start was for the members running when it was written."""
        assert key is not None
        try:
            command = parse_command(key, value)
        except InvalidControlRecord as exc:
            self._reject(key, exc, offset)
            return
        except Exception as exc:  # defence in depth, as in apply()
            self._reject(key, InvalidControlRecord(f"unreadable: {type(exc).__name__}: {exc}", "unreadable"),
                         offset)
            return
        self._invalid.superseded(key)
        if command is None or self._loading:
            return
        if len(self._commands) >= MAX_WAITING_COMMANDS:
            log.warning("ignoring a command: too many wait already", extra={
                "command": command.describe(), "id": command.id, "waiting": len(self._commands)})
            return
        log.info("operator command",
                 extra={"command": command.describe(), "id": command.id, "by": command.by})
        self._commands.append(command)

    def take_commands(self) -> list[Command]:
        """The commands read since the last call (runtime/ops/topic_commands.py hands them on)."""
        taken = list(self._commands)
        self._commands.clear()
        return taken

    def _take(self, pause: Pause, key: bytes | None, offset: int) -> None:
        old = self._state.get(pause.scope)
        if pause.paused:
            if old is None and len(self._state) >= MAX_SCOPES:
                self._reject(key, InvalidControlRecord(
                    f"{MAX_SCOPES} scopes are paused already; resume some first", "too many scopes"), offset)
                return
            self._state[pause.scope] = pause
        else:
            self._state.pop(pause.scope, None)
        if (old is not None and old.until_ms is not None) or (pause.paused and pause.until_ms is not None):
            self._expiry_stale = True
        # The reason counts too: held partitions show it (operator.py re-applies it on a change).
        was = (old.paused, old.until_ms, old.reason) if old else (False, None, None)
        now = (pause.paused, pause.until_ms, pause.reason) if pause.paused else (False, None, None)
        if was != now:
            self.changed = True
            if not self._loading:
                log.info("operator pause" if pause.paused else "operator resume",
                         extra={"scope": describe_scope(pause.scope), "detail": pause.describe()})

    def _reject(self, key: bytes | None, exc: InvalidControlRecord, offset: int) -> None:
        self._invalid.note(key, exc, offset)
        if not self._loading:  # while loading, _report_invalid sums them up at the end
            log.warning("ignoring a control record that is not a valid pause or resume", extra={
                **describe_problem(key, exc), "offset": offset, "topic": self.topic,
                "throttle": f"control invalid {self.topic} {exc.kind}"})

    def _report_invalid(self) -> None:
        """One line per kind of problem, for the invalid records still standing as the last
        word of their key after a load (those a later record replaced do no harm)."""
        kinds: dict[str, list[tuple[bytes | None, InvalidControlRecord, int]]] = {}
        for key, (exc, offset) in self._invalid.by_key.items():
            kinds.setdefault(exc.kind, []).append((key, exc, offset))
        for kind in sorted(set(kinds) | set(self._invalid.untracked)):
            seen = kinds.get(kind, [])
            count = len(seen) + self._invalid.untracked[kind]
            example = {**describe_problem(seen[0][0], seen[0][1]), "offset": seen[0][2]} if seen else {}
            log.warning(f"ignoring {count} control record(s) that are not valid pauses or resumes "
                        "(`ringmaster resume` overwrites them)",
                        extra={"topic": self.topic, "kind": kind, **example})

    def _recompute_expiry(self, now: int) -> None:
        self._expiry_stale = False
        ends = []
        for p in self._state.values():
            if p.until_ms is not None and p.until_ms > now:
                ends.append(p.until_ms)
        self.expiry_scans += len(self._state)
        self._next_expiry = min(ends) if ends else None

    # ------------------------------------------------------------------ questions
    def pause_for(self, tp: TP) -> Pause | None:
        """The active pause that covers this partition, narrowest scope first."""
        now = self._wall_ms()
        for key in (scope_key(*tp), scope_key(tp[0]), ALL):
            p = self._state.get(key)
            if p is not None and p.active(now):
                return p
        return None

    def active(self) -> list[Pause]:
        now = self._wall_ms()
        return sorted((p for p in self._state.values() if p.active(now)), key=lambda p: p.scope)

    def invalid_keys(self) -> list[bytes | None]:
        """Keys whose last word is an invalid record (what ``resume`` overwrites)."""
        return list(self._invalid.by_key)

    def describe_all(self, limit: int = LISTED) -> list[dict[str, Any]]:
        """The pauses in force for status and /metrics: at most ``limit``, then one entry
        counting the rest (``count``), so neither grows with what the topic holds."""
        active = self.active()
        out = [{"scope": describe_scope(p.scope), "key": p.scope,
                "reason": cut(p.reason, LISTED_REASON_CHARS),
                "by": p.by, "since_ms": p.at_ms, "until_ms": p.until_ms, "count": 1} for p in active[:limit]]
        if len(active) > limit:
            more = len(active) - limit
            out.append({"scope": f"{more} more", "key": "", "reason": "", "by": "", "since_ms": None,
                        "until_ms": None, "count": more})
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


# ---------------------------------------------------------------------- resume (CLI)
@dataclass
class ResumePlan:
    """What ``ringmaster resume`` writes, and what it tells the operator."""

    records: list[Record]
    resumed: list[str]  # scopes whose pause it ends
    cleared: int  # invalid records it overwrites
    still: list[Pause]  # wider pauses that stay in force
    invalid_elsewhere: int  # invalid records outside the scope resumed (left as they are)


def plan_resume(state: OperatorPauses, topic: str | None, partition: int | None, by: str,
                now_ms: int) -> ResumePlan:
    """Without topic: every pause of the group; with a topic, its pause and its partitions';
    with a partition, that one. Invalid records in that scope are overwritten too (a resume
    record on a scope's key, a tombstone on a key that is not a scope), so they stop being
    logged at every start and compaction can drop them."""

    def within(scope: str) -> bool:
        if topic is None:
            return True
        if partition is not None:
            return scope == scope_key(topic, partition)
        return scope_topic(scope) == topic

    active = state.active()
    resumed = [p.scope for p in active if within(p.scope)]
    records: list[Record] = [Pause(s, False, "resumed", by, now_ms).record() for s in resumed]
    cleared = elsewhere = 0
    for key in state.invalid_keys():
        try:
            scope: str | None = parse_scope(key)
        except InvalidControlRecord:
            scope = None
        if scope is not None and within(scope) and scope not in resumed:
            records.append(Pause(scope, False, "resumed", by, now_ms).record())
            cleared += 1
        elif scope is None and topic is None and key is not None:
            records.append((key, None))
            cleared += 1
        elif scope is None or not within(scope):
            elsewhere += 1
    wider_scopes = {ALL} if partition is None else {ALL, scope_key(topic)}
    still = [] if topic is None else [p for p in active if p.scope in wider_scopes]
    return ResumePlan(records, resumed, cleared, still, elsewhere)


def reader_properties(settings: Settings) -> dict[str, Any]:
    """An assign-only consumer of the control topic: the group's connection and security
    properties, a group id of its own (it never joins or commits), end-of-partition events."""
    props = {k: v for k, v in consumer_properties(settings).items()
             if k not in ("partition.assignment.strategy", "group.instance.id", "statistics.interval.ms")}
    # The topic is nearly always idle, and an idle fetch is held this long: the wait bounds
    # how soon a pause is seen where the broker answers only when it runs out (the embedded
    # one), and how often the broker is asked. Measured on the embedded broker: an idle
    # fetch costs it ~1 ms CPU, so 100 ms took ~10 ms CPU a second per member (a fifth of
    # its CPU in `bench --naive`); 500 ms (librdkafka's default) takes 2.
    props.update({"group.id": f"{settings.kafka.group_id}.ringmaster-control", "enable.partition.eof": True,
                  "fetch.wait.max.ms": 500, "auto.offset.reset": "earliest"})
    return props


# ---------------------------------------------------------------------- writing (CLI, console)
def group_reads(settings: Settings, topic: str) -> bool:
    """Whether the group reads ``topic``: one of kafka.topics, or matched by one of its
    regular expressions (a name starting with ^, as librdkafka reads them)."""
    for t in settings.kafka.topics:
        if t == topic:
            return True
        if t.startswith("^"):
            try:
                if re.search(t, topic):
                    return True
            except re.error:
                continue
    return False


def checked_scope(topic: str | None, partition: int | None) -> str:
    """The control record key for a topic and partition, checked as the readers will check it
    (ConfigError, naming the CLI's options, for anything else)."""
    if partition is not None and (topic is None or partition < 0):
        raise ConfigError("--partition needs --topic and a partition number >= 0")
    key = scope_key(topic, partition)
    try:
        return parse_scope(key.encode())
    except InvalidControlRecord:
        if partition is not None and partition > 2**31 - 1:
            raise ConfigError(f"--partition {partition}: Kafka numbers partitions below 2**31") from None
        raise ConfigError(f"--topic {topic!r} is not a valid Kafka topic name") from None


def ensure_control_topic(settings: Settings) -> None:
    """Create the control topic unless it exists. KafkaUnreachable or KafkaError, one line."""
    create_topic(consumer_properties(settings), control_topic(settings), 1,
                 settings.control.replication_factor, {"cleanup.policy": "compact"}, what="control topic",
                 timeout_s=settings.kafka.connect_timeout_s)


def write(settings: Settings, records: Iterable[Record]) -> list[int]:
    """Write control records and wait until the broker has them (acks=all); their offsets."""
    ensure_control_topic(settings)
    props = {k: v for k, v in producer_properties(settings).items() if k != "message.timeout.ms"}
    offsets: list[int] = []
    write_acknowledged(props, control_topic(settings), list(records), settings.kafka.connect_timeout_s,
                       offsets)
    return offsets

