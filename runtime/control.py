"""Operator pauses: group-wide, durable, exact. Runs in: supervisor (reading), the
``ringmaster pause``/``resume`` commands (writing), the Spark driver (reading).

The state lives in Kafka itself, so it needs no new infrastructure and every member of the
group sees the same: a compacted **control topic** per group (``[control] topic``, by
default ``_ringmaster.control.<group>``), created when missing. A record's key is the scope
it pauses — ``*`` (every topic the group reads), ``topic:<name>`` or
``partition:<name>:<n>`` — and its value a JSON document: paused or not, why, by whom,
since when, until when. Compaction keeps the last word per scope.

Each supervisor reads the whole topic with an assign-only consumer (no group: it joins
nothing and commits nothing) before it subscribes — so a member that starts, restarts or
joins never processes a batch of a paused partition — and then follows it every tick, so a
pause takes effect on every host within about a fetch wait (well under 2 s) plus the
batches in progress, which finish and commit. librdkafka forgets pauses across rebalances;
this state does not: every (incremental) assignment is held at once if a pause covers it.

Semantics (README, "Pausing a group"): a paused partition is fenced like a revocation – the
batch in progress finishes and is committed, frames still queued in rings are dropped and
read again after the resume, from the lowest unhandled offset (a pause means "stop now",
not "after the minutes of work in the rings"). Lag grows while paused. Flow control never
resumes an operator-paused partition. SIGTERM while paused stops as usual; the pause stays
in the topic for the next start. ``--for`` is wall-clock time: a member whose clock is off
by *s* ends the pause *s* early or late.
"""

from __future__ import annotations

import getpass
import json
import logging
import re
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import KafkaError as _CKError
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.config import Settings, consumer_properties, producer_properties
from runtime.errors import ConfigError, KafkaError

log = logging.getLogger("ringmaster.control")

TP = tuple[str, int]
ALL = "*"


def control_topic(settings: Settings) -> str:
    if settings.control.topic:
        return settings.control.topic
    return "_ringmaster.control." + re.sub(r"[^a-zA-Z0-9._-]", "_", settings.kafka.group_id)


def scope_key(topic: str | None = None, partition: int | None = None) -> str:
    if topic is None:
        if partition is not None:
            raise ConfigError("--partition needs --topic")
        return ALL
    return f"topic:{topic}" if partition is None else f"partition:{topic}:{partition}"


def describe_scope(key: str) -> str:
    if key == ALL:
        return "every topic of the group"
    kind, _, rest = key.partition(":")
    if kind == "topic":
        return f"topic {rest}"
    topic, _, part = rest.rpartition(":")
    return f"{topic}[{part}]"


@dataclass(frozen=True)
class Pause:
    scope: str
    paused: bool
    reason: str
    by: str
    at_ms: int  # when this record was written
    until_ms: int | None = None  # --for: when the pause ends by itself

    def active(self, now_ms: int) -> bool:
        return self.paused and (self.until_ms is None or now_ms < self.until_ms)

    def describe(self) -> str:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at_ms / 1000))
        until = "" if self.until_ms is None else \
            f" until {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.until_ms / 1000))}"
        return f"{self.reason or 'paused'} (by {self.by} since {since}{until})"

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @staticmethod
    def from_record(key: bytes | None, value: bytes | None) -> Pause | None:
        """A control record, or None for one that is not ours to read (logged by the caller).
        A malformed record never pauses or resumes anything."""
        if key is None:
            return None
        scope = key.decode(errors="replace")
        if value is None:  # a tombstone: compaction's way of saying "resumed"
            return Pause(scope, False, "", "", 0)
        try:
            d = json.loads(value)
            return Pause(scope, bool(d["paused"]), str(d.get("reason", "")), str(d.get("by", "")),
                         int(d.get("at_ms", 0)), None if d.get("until_ms") is None else int(d["until_ms"]))
        except (ValueError, KeyError, TypeError):
            return None


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


class OperatorPauses:
    """The group's pause state, read from the control topic. ``load()`` reads it to its end
    (blocking, bounded); ``poll()`` follows it without blocking."""

    def __init__(self, topic: str, consumer_props: dict[str, Any], load_timeout_s: float = 30.0,
                 ensure_topic: Callable[[], None] = lambda: None,
                 wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self.topic = topic
        self.consumer_props = consumer_props
        self.load_timeout_s = load_timeout_s
        self._ensure_topic = ensure_topic
        self._wall_ms = wall_ms
        self._state: dict[str, Pause] = {}
        self._consumer: Consumer | None = None
        self._next_expiry: int | None = None
        self.changed = True

    @classmethod
    def for_settings(cls, settings: Settings) -> OperatorPauses:
        return cls(control_topic(settings), reader_properties(settings), settings.control.load_timeout_s,
                   lambda: ensure_control_topic(settings))

    # ------------------------------------------------------------------ reading
    def load(self, timeout_s: float | None = None) -> None:
        """Create the topic if missing, then read it to its end (end-of-partition events come
        from fetch responses: the high watermark, never a ListOffsets answer)."""
        timeout_s = timeout_s or self.load_timeout_s
        self._ensure_topic()
        self._consumer = c = Consumer(self.consumer_props)
        try:
            meta = c.list_topics(self.topic, timeout=timeout_s).topics[self.topic]
            parts = sorted(meta.partitions)
            if meta.error is not None or not parts:
                raise KafkaError(f"control topic {self.topic!r}: {meta.error or 'no partitions'}")
            c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in parts])
            at_end: set[int] = set()
            deadline = time.monotonic() + timeout_s
            while len(at_end) < len(parts):
                if time.monotonic() > deadline:
                    raise KafkaError(f"could not read the control topic {self.topic!r} to its end within "
                                     f"{timeout_s:g} s (control.load_timeout_s): operator pauses would be "
                                     "unknown, so the supervisor does not start")
                for m in c.consume(500, 0.2):
                    err = m.error()
                    if err is None:
                        self._apply(m.key(), m.value())
                        at_end.discard(m.partition())
                    elif err.code() == _CKError._PARTITION_EOF:
                        at_end.add(m.partition())
                    elif err.fatal():
                        raise KafkaError(f"control topic {self.topic!r}: {err}")
        except KafkaException as exc:
            raise KafkaError(f"control topic {self.topic!r}: {exc.args[0]}") from None
        active = self.describe_all()
        if active:
            log.warning("operator pauses in force", extra={"scopes": ", ".join(p["scope"] for p in active)})

    def poll(self) -> bool:
        """Take what arrived; True when the state changed (or a --for pause just ended)."""
        if self._consumer is not None:
            try:
                for m in self._consumer.consume(100, 0):
                    if m.error() is None:
                        self._apply(m.key(), m.value())
            except KafkaException as exc:
                log.warning("reading the control topic failed; carrying on", extra={"error": str(exc)})
        now = self._wall_ms()
        if self._next_expiry is not None and now >= self._next_expiry:
            self._recompute_expiry(now)
            self.changed = True
        changed, self.changed = self.changed, False
        return changed

    def _apply(self, key: bytes | None, value: bytes | None) -> None:
        pause = Pause.from_record(key, value)
        if pause is None:
            log.warning("ignoring a control record that is not ours", extra={"topic": self.topic})
            return
        old = self._state.get(pause.scope)
        self._state[pause.scope] = pause
        if old is None or old.paused != pause.paused or old.until_ms != pause.until_ms:
            self.changed = True
            log.info("operator pause" if pause.paused else "operator resume",
                     extra={"scope": describe_scope(pause.scope), "detail": pause.describe(), "by": pause.by})
        self._recompute_expiry(self._wall_ms())

    def _recompute_expiry(self, now: int) -> None:
        ends = [p.until_ms for p in self._state.values() if p.paused and p.until_ms is not None
                and p.until_ms > now]
        self._next_expiry = min(ends) if ends else None

    # ------------------------------------------------------------------ questions
    def pause_for(self, tp: TP) -> Pause | None:
        """The active pause that covers this partition, narrowest scope first."""
        now = self._wall_ms()
        for key in (f"partition:{tp[0]}:{tp[1]}", f"topic:{tp[0]}", ALL):
            p = self._state.get(key)
            if p is not None and p.active(now):
                return p
        return None

    def active(self) -> list[Pause]:
        now = self._wall_ms()
        return sorted((p for p in self._state.values() if p.active(now)), key=lambda p: p.scope)

    def describe_all(self) -> list[dict[str, Any]]:
        return [{"scope": describe_scope(p.scope), "key": p.scope, "reason": p.reason, "by": p.by,
                 "since_ms": p.at_ms, "until_ms": p.until_ms} for p in self.active()]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def reader_properties(settings: Settings) -> dict[str, Any]:
    """An assign-only consumer of the control topic: the group's connection and security
    properties, a group id of its own (it never joins or commits), end-of-partition events."""
    props = {k: v for k, v in consumer_properties(settings).items()
             if k not in ("partition.assignment.strategy", "group.instance.id", "statistics.interval.ms")}
    props.update({"group.id": f"{settings.kafka.group_id}.ringmaster-control", "enable.partition.eof": True,
                  "fetch.wait.max.ms": 100, "auto.offset.reset": "earliest"})
    return props


# ---------------------------------------------------------------------- writing (CLI)
def ensure_control_topic(settings: Settings) -> None:
    topic = control_topic(settings)
    props = {k: v for k, v in consumer_properties(settings).items() if _admin_property(k)}
    admin = AdminClient(props)
    futures = admin.create_topics([NewTopic(topic, num_partitions=1,
                                            replication_factor=settings.control.replication_factor,
                                            config={"cleanup.policy": "compact"})], operation_timeout=15)
    for fut in futures.values():
        try:
            fut.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != _CKError.TOPIC_ALREADY_EXISTS:
                raise KafkaError(f"cannot create the control topic {topic!r}: {exc.args[0]}") from None


def _admin_property(key: str) -> bool:
    """Connection and security properties apply to an admin client; consumer-only ones don't."""
    return key == "bootstrap.servers" or key.startswith(("security.", "sasl.", "ssl.", "client.", "socket.",
                                                          "broker.", "api.version", "metadata."))


def write(settings: Settings, records: Iterable[Pause]) -> None:
    """Write control records and wait until the broker has them (acks=all)."""
    ensure_control_topic(settings)
    props = {k: v for k, v in producer_properties(settings).items() if k != "message.timeout.ms"}
    props.update({"acks": "all", "message.timeout.ms": 30000})
    p = Producer(props)
    failures: list[str] = []
    for r in records:
        p.produce(control_topic(settings), r.to_json(), r.scope.encode(),
                  on_delivery=lambda err, _m: failures.append(str(err)) if err else None)
    if p.flush(35) or failures:
        raise KafkaError(f"writing to the control topic {control_topic(settings)!r} failed: "
                         f"{failures[0] if failures else 'not acknowledged in time'}")


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '2h', '1d' -> seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*", text)
    if not m:
        raise ConfigError(f"--for {text!r}: expected a duration like 90s, 10m, 2h or 1d")
    unit = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}[m.group(2)]
    return float(m.group(1)) * unit
