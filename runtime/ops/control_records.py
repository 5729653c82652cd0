"""The control topic's records: what a valid one is, read strictly at the edge. Pure (no
Kafka). Runs in: the supervisor and the Spark driver (reading), the operator commands
(writing and reading).

A record's **key** is the scope it pauses, in one of three forms:

=============================  =============================================================
``*``                          every topic the group reads
``topic:<name>``               one topic (a legal Kafka topic name: ``[a-zA-Z0-9._-]``, 1-249)
``partition:<name>:<n>``       one partition; ``n`` in canonical decimal, 0 <= n < 2**31
=============================  =============================================================

Its **value** is a JSON object (at most ``MAX_VALUE_BYTES``), or null (a tombstone: the scope
is resumed, and compaction may forget the key):

===========  ===================================================================  =========
``paused``   a JSON boolean (``"false"`` is not one)                               required
``reason``   a string; control characters replaced, cut at ``MAX_REASON_BYTES``   optional
``by``       a string; the same, cut at ``MAX_BY_BYTES``                            optional
``at_ms``    when it was written: an integer, 0 <= at_ms <= ``MAX_MS``              optional
``until_ms`` when the pause ends by itself: an integer in the same range, or null  optional
===========  ===================================================================  =========

Other fields are ignored. Anything else raises InvalidControlRecord; the reader logs it and
ignores it, so it neither pauses nor resumes. Texts are cut rather than refused: a pause
written with a long reason by an older version must not end by itself on an upgrade.

A key ``command:<id>`` (``id``: 1-64 of ``[a-zA-Z0-9._-]``) is an operator **command** to the
members (``ringmaster console``'s reload and scale): its value a JSON object with ``command``
(``"reload"`` or ``"scale"``), for a scale ``processes`` (a whole number > 0) or ``change`` (a
whole number other than 0), and optionally ``by``, ``at_ms`` and ``members`` (a list of the
member ids it is for; absent or null: every member). A member acts on a command it reads
while following the topic, never on one it reads at start (those were for the members then),
and says how it went in its status record (runtime/ops/member_status.py). One key per command:
compaction keeps each, so the console writes a tombstone once every member answered.
"""

from __future__ import annotations

import enum
import json
import re
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime import durations
from runtime.errors import ConfigError, InvalidControlRecord

ALL = "*"
# 9999-12-31T23:59:59.999Z: gmtime, strftime, datetime and every formatter handle it.
MAX_MS = 253_402_300_799_999
MAX_PARTITION = 2**31 - 1  # Kafka's partition ids are int32
MAX_KEY_BYTES = 512  # "partition:" + a 249-character topic + ":" + 10 digits fits with room
MAX_VALUE_BYTES = 1024 * 1024
MAX_REASON_BYTES = 1024
MAX_BY_BYTES = 256
SHORT_REASON_CHARS = 120  # in per-partition hold details, which the status repeats per partition
SHORT_BY_CHARS = 64
MIN_FOR_S = 1.0
MAX_FOR_S = 366 * 86400.0

_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_PARTITION = re.compile(r"(0|[1-9][0-9]{0,9})")  # canonical: "01" would be a second key for 1
# Bidirectional overrides and isolates can make a terminal show text other than what is stored.
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


COMMAND_PREFIX = "command:"
_COMMAND_ID = re.compile(r"[a-zA-Z0-9._-]{1,64}")
MAX_MEMBERS_LISTED = 1000


class CommandKind(enum.StrEnum):
    """What a command record asks every member for (the control socket's requests)."""

    RELOAD = "reload"
    SCALE = "scale"


class PauseScope(enum.StrEnum):
    """The kinds of scope an operator pause covers (the ``scope`` label of
    ringmaster_operator_pauses); a key names its kind before the first colon, but ``*``."""

    GROUP = "group"  # ``*``: every topic the group reads
    TOPIC = "topic"  # ``topic:<name>``
    PARTITION = "partition"  # ``partition:<name>:<n>``


def scope_key(topic: str | None = None, partition: int | None = None) -> str:
    if topic is None:
        if partition is not None:
            raise ConfigError("--partition needs --topic")
        return ALL
    if partition is None:
        return f"{PauseScope.TOPIC}:{topic}"
    return f"{PauseScope.PARTITION}:{topic}:{partition}"


def scope_kind(key: str) -> PauseScope:
    """The kind of scope a key names: ``*``, and a key that is no scope, count as the group's."""
    kind = key.partition(":")[0]
    return PauseScope(kind) if kind in (PauseScope.TOPIC, PauseScope.PARTITION) else PauseScope.GROUP


def parse_scope(key: bytes | None) -> str:
    """The scope a record's key names; InvalidControlRecord for anything else."""
    if key is None:
        raise InvalidControlRecord("the record has no key (a key names the scope: *, topic:T, "
                                   "partition:T:N)", "key")
    if len(key) > MAX_KEY_BYTES:
        raise InvalidControlRecord(f"the key is {len(key)} bytes (at most {MAX_KEY_BYTES})", "key")
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidControlRecord("the key is not UTF-8", "key") from None
    if text == ALL:
        return ALL
    kind, _, rest = text.partition(":")
    if kind == PauseScope.TOPIC and _TOPIC.fullmatch(rest):
        return text
    if kind == PauseScope.PARTITION:
        topic, _, part = rest.rpartition(":")
        if _TOPIC.fullmatch(topic) and _PARTITION.fullmatch(part) and int(part) <= MAX_PARTITION:
            return text
    raise InvalidControlRecord(f"the key {shown(text)} is not a scope (*, topic:T or partition:T:N "
                               f"with 0 <= N < 2**31 in plain decimal)", "key")


def scope_topic(scope: str) -> str | None:
    """The topic a scope names (None for ``*``)."""
    if scope == ALL:
        return None
    kind, _, rest = scope.partition(":")
    return rest if kind == PauseScope.TOPIC else rest.rpartition(":")[0]


def describe_scope(key: str) -> str:
    if key == ALL:
        return "every topic of the group"
    kind, _, rest = key.partition(":")
    if kind == PauseScope.TOPIC:
        return f"topic {rest}"
    topic, _, part = rest.rpartition(":")
    return f"{topic}[{part}]"


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


def shown(text: str, limit: int = 80) -> str:
    """A stored text as it may appear in a log line or an error: repr'd, cut at ``limit``."""
    return repr(cut(text, limit))


def clean_text(text: str, max_bytes: int) -> str:
    """Control characters (newlines, escapes, bidi overrides) replaced, cut at max_bytes of
    UTF-8 on a character boundary (with "…" when cut)."""
    text = "".join(" " if c in "\t\n\r" else "\ufffd" if unicodedata.category(c) == "Cc" or c in _BIDI
                   else c for c in text)
    data = text.encode("utf-8", "replace")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes - 3].decode("utf-8", "ignore") + "…"


def iso(ms: int) -> str:
    """A UTC time for people; never raises (a value out of every formatter's range is shown
    as the number it is)."""
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms after the epoch"


class _Value(BaseModel):
    """The value's fields, strictly typed (pydantic's strict mode: no "false" for false, no
    1e20 for an integer)."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    paused: bool
    reason: str = ""
    by: str = ""
    at_ms: int | None = Field(default=None, ge=0, le=MAX_MS)
    until_ms: int | None = Field(default=None, ge=0, le=MAX_MS)


@dataclass(frozen=True)
class Pause:
    """One scope's last word: paused (maybe until a time) or resumed."""

    scope: str
    paused: bool
    reason: str = ""
    by: str = ""
    at_ms: int | None = None  # when the record was written
    until_ms: int | None = None  # --for: when the pause ends by itself

    def active(self, now_ms: int) -> bool:
        return self.paused and (self.until_ms is None or now_ms < self.until_ms)

    def provenance(self) -> str:
        """'by root@vm since 2026-11-23T10:00:00Z until …' (the parts that are known)."""
        parts = [f"by {cut(self.by, SHORT_BY_CHARS)}"] if self.by else []
        if self.at_ms is not None:
            parts.append(f"since {iso(self.at_ms)}")
        if self.until_ms is not None:
            parts.append(f"until {iso(self.until_ms)}")
        return " ".join(parts)

    def describe(self) -> str:
        """One line, bounded whatever the record held: the reason (cut short) and provenance
        ("deploying v2 (paused by root@vm since …)", "paused by root@vm since …", "resumed by
        root@vm at …"). Never raises."""
        if not self.paused:
            parts = ["resumed", *([f"by {cut(self.by, SHORT_BY_CHARS)}"] if self.by else []),
                     *([f"at {iso(self.at_ms)}"] if self.at_ms is not None else [])]
            return " ".join(parts)
        prov = self.provenance()
        said = f"paused {prov}" if prov else "paused"
        return f"{cut(self.reason, SHORT_REASON_CHARS)} ({said})" if self.reason else said

    def record(self) -> tuple[bytes, bytes]:
        """The (key, value) written to the control topic."""
        value = {"scope": self.scope, "paused": self.paused, "reason": self.reason, "by": self.by,
                 "at_ms": self.at_ms, "until_ms": self.until_ms}
        return self.scope.encode(), json.dumps(value).encode()


def parse_record(key: bytes | None, value: bytes | None) -> Pause:
    """A control record read strictly: a Pause (``paused`` False for a resume or a
    tombstone), or InvalidControlRecord saying what is wrong."""
    scope = parse_scope(key)
    if value is None:  # a tombstone: compaction's way of saying "resumed"
        return Pause(scope, False)
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidControlRecord(f"the value is {len(value)} bytes (at most {MAX_VALUE_BYTES})", "value")
    try:
        v = _Value.model_validate_json(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "value"
        got = err.get("input")
        plain = field != "value" and not isinstance(got, dict | list)
        got_text = f" (got {cut(repr(got), 40)})" if plain else ""
        raise InvalidControlRecord(f"{field}: {err['msg']}{got_text}", field) from None
    return Pause(scope, v.paused, clean_text(v.reason, MAX_REASON_BYTES), clean_text(v.by, MAX_BY_BYTES),
                 v.at_ms, v.until_ms)


# ---------------------------------------------------------------------- what the CLI writes
def parse_duration(text: str) -> float:
    """``--for``: a duration in the one grammar (runtime/durations.py: 90s, 10m, 1h30m, 2d,
    1w; a bare number is seconds) -> seconds, between MIN_FOR_S and MAX_FOR_S."""
    try:
        seconds = durations.parse_duration(text)
    except ValueError as exc:
        raise ConfigError(f"--for {text!r}: {exc}") from None
    if not MIN_FOR_S <= seconds <= MAX_FOR_S:
        raise ConfigError(f"--for {text!r}: a pause lasts from {MIN_FOR_S:g} s to {MAX_FOR_S / 86400:g} days "
                          "(without --for it lasts until `ringmaster resume`)")
    return seconds


def check_reason(reason: str) -> str:
    """--reason as written: at most MAX_REASON_BYTES of UTF-8, one line, no control characters."""
    size = len(reason.encode("utf-8", "replace"))
    if size > MAX_REASON_BYTES:
        raise ConfigError(f"--reason is {size} bytes; at most {MAX_REASON_BYTES} (it is shown in status "
                          "and logs of every member)")
    if clean_text(reason, MAX_REASON_BYTES) != reason:
        raise ConfigError("--reason must be one line without control characters")
    return reason


def pause_record(scope: str, reason: str, by: str, now_ms: int, for_s: float | None) -> Pause:
    until = None if for_s is None else now_ms + int(for_s * 1000)
    return Pause(scope, True, reason, clean_text(by, MAX_BY_BYTES), now_ms, until)


def describe_problem(key: bytes | None, exc: InvalidControlRecord) -> dict[str, Any]:
    """Structured log fields for an invalid record."""
    key_text = "(none)" if key is None else shown(key.decode("utf-8", "replace"))
    return {"key": key_text, "problem": exc.problem}


# ---------------------------------------------------------------------- commands
def is_command_key(key: bytes | None) -> bool:
    return key is not None and key.startswith(COMMAND_PREFIX.encode())


class _CommandValue(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    command: CommandKind = Field(strict=False)
    processes: int | None = Field(default=None, gt=0, le=10_000)
    change: int | None = Field(default=None, ge=-10_000, le=10_000)
    by: str = ""
    at_ms: int | None = Field(default=None, ge=0, le=MAX_MS)
    members: list[str] | None = Field(default=None, max_length=MAX_MEMBERS_LISTED)


@dataclass(frozen=True)
class Command:
    """One command record: what it asks, of whom (``members`` None: every member)."""

    id: str
    kind: CommandKind
    processes: int | None = None
    change: int = 0
    by: str = ""
    at_ms: int | None = None
    members: tuple[str, ...] | None = None

    def for_member(self, member: str) -> bool:
        return self.members is None or member in self.members

    def request(self) -> dict[str, Any]:
        """The control socket's request for the same thing (runtime/supervisor/control/commands.py)."""
        if self.kind is CommandKind.RELOAD:
            return {"command": "reload"}
        if self.processes is not None:
            return {"command": "scale", "processes": self.processes}
        return {"command": "scale", "change": self.change}

    def describe(self) -> str:
        if self.kind is CommandKind.RELOAD:
            return "reload"
        return f"scale to {self.processes}" if self.processes is not None else f"scale {self.change:+d}"

    def record(self) -> tuple[bytes, bytes]:
        value: dict[str, Any] = {"command": self.kind.value, "by": self.by, "at_ms": self.at_ms,
                                 "members": None if self.members is None else list(self.members)}
        if self.kind is CommandKind.SCALE:
            value.update({"processes": self.processes} if self.processes is not None
                         else {"change": self.change})
        return f"{COMMAND_PREFIX}{self.id}".encode(), json.dumps(value).encode()


def command_id(text: str) -> str:
    """A command's id as written: InvalidControlRecord unless 1-64 of [a-zA-Z0-9._-]."""
    if not _COMMAND_ID.fullmatch(text):
        raise InvalidControlRecord(f"the command id {shown(text)} is not 1-64 of [a-zA-Z0-9._-]", "key")
    return text


def parse_command(key: bytes, value: bytes | None) -> Command | None:
    """A command record read strictly (None for a tombstone: a command done with), or
    InvalidControlRecord saying what is wrong."""
    if len(key) > MAX_KEY_BYTES:
        raise InvalidControlRecord(f"the key is {len(key)} bytes (at most {MAX_KEY_BYTES})", "key")
    cid = command_id(key[len(COMMAND_PREFIX):].decode("utf-8", "replace"))
    if value is None:
        return None
    if len(value) > MAX_VALUE_BYTES:
        raise InvalidControlRecord(f"the value is {len(value)} bytes (at most {MAX_VALUE_BYTES})", "value")
    try:
        v = _CommandValue.model_validate_json(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "value"
        raise InvalidControlRecord(f"command {field}: {err['msg']}", f"command {field}") from None
    if v.command is CommandKind.SCALE and (v.processes is None) == (not v.change):
        raise InvalidControlRecord("command: a scale needs processes (> 0) or change (not 0), one of them",
                                   "command scale")
    members = None if v.members is None else tuple(clean_text(m, MAX_BY_BYTES) for m in v.members)
    return Command(cid, v.command, v.processes, v.change or 0, clean_text(v.by, MAX_BY_BYTES), v.at_ms,
                   members)
