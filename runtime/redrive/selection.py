"""What a redrive sends back, what it passes over, and why.

The redrive's consumer group is a **cursor** through the dead-letter topic: every letter
before its committed offset was dealt with by an earlier run, and a letter is never redriven
twice by runs of the same group. So a letter the selection does not take is *passed over*: the
cursor moves past it, it stays in the dead-letter topic, and the summary counts it by reason.
``--to`` is different: the run *ends* there (per partition) and the cursor stays, so a later
run goes on from that letter.

Times (``--from 2h``, ``--to 2026-11-21T14:00:00Z``) select by when the record failed: the
``ringmaster.failed_at_ms`` header the runtime wrote, else the dead-letter record's timestamp
(letters written by other tools). The header is the failure itself, whatever the topic's
timestamp type (``LogAppendTime`` restamps records) or a copy of the topic (a mirror) did to
the record's timestamp. Times are compared record by record while reading, never looked up
with ``offsets_for_times``: within a partition the failure times are in order up to the clock
differences of the processes that wrote them, so a letter written by a host whose clock runs
ahead can end a ``--to`` window early. Offsets give exact windows.

Pure. Runs in: the CLI.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from runtime import durations
from runtime.errors import ConfigError
from runtime.ops.control_records import shown
from runtime.redrive.letters import MAX_MS, MAX_OFFSET, MAX_PARTITION, Letter

# The error type the supervisor gives a record that crashed or hung its worker
# (runtime/supervisor/daemon/loop.py). In this process it would take the redrive down with it.
WORKER_CRASHED = "WorkerCrashed"


class Skip(enum.Enum):
    """Why a letter is passed over (the cursor moves past it; it stays in the topic)."""

    BEFORE_FROM = "before-from"
    NOT_A_DEAD_LETTER = "not-a-dead-letter"
    MALFORMED = "malformed"
    OTHER_SOURCE = "other-source"
    NOT_SELECTED = "not-selected"
    MAX_REDRIVES = "max-redrives"
    CRASHED_A_WORKER = "crashed-a-worker"
    SOURCE_GONE = "source-gone"
    REFUSED = "refused"
    NOT_PICKED = "not-picked"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    Skip.BEFORE_FROM: "failed before --from",
    Skip.NOT_A_DEAD_LETTER: "not a ringmaster dead letter (no ringmaster.* headers)",
    Skip.MALFORMED: "a ringmaster.* header out of bounds (a partition past int32, a count of "
                    "thousands of digits): see it with `ringmaster tail --dead-letters`",
    Skip.OTHER_SOURCE: "from a topic this config does not read (kafka.topics)",
    Skip.NOT_SELECTED: "error type not given with --error-type",
    Skip.MAX_REDRIVES: "redriven --max-redrives times already",
    Skip.CRASHED_A_WORKER: "crashed or hung a worker: redrive it to its source, where the daemon isolates it",
    Skip.SOURCE_GONE: "truncated or reference letter whose source record is no longer retained",
    Skip.REFUSED: "the broker refused the redriven copy for what it is (size, partition)",
    Skip.NOT_PICKED: "not among the letters picked (ringmaster console)",
}


class Stop(enum.Enum):
    """The run ends at this letter in its partition; the cursor stays before it."""

    AFTER_TO = "after-to"


@dataclass(frozen=True)
class OffsetBound:
    """An offset of the dead-letter topic: for every partition, or per partition."""

    every: int | None = None
    partitions: Mapping[int, int] = field(default_factory=dict)

    def at(self, partition: int) -> int | None:
        return self.partitions.get(partition, self.every)


@dataclass(frozen=True)
class TimeBound:
    ms: int


Bound = OffsetBound | TimeBound | None

_OFFSET = r"(?:0|[1-9][0-9]{0,18})"  # canonical decimal, at most an int64's digits
_PARTITION = r"(?:0|[1-9][0-9]{0,9})"


def parse_bound(text: str, option: str, now_ms: int) -> OffsetBound | TimeBound:
    """``--from``/``--to``: an offset (``1200``), offsets per partition (``0:1200,3:80``), a
    time ago in the one duration grammar (runtime/durations.py: ``90s``, ``15m``, ``1h30m``,
    ``1d``, ``1w``) or an ISO-8601 time
    (``2026-11-21T14:00:00Z``; without a zone, local time, as kafka-consumer-groups reads it).
    Bounded as the letters are (runtime/redrive/letters.py): an offset is an int64, a
    partition an int32, a time between the epoch and year 9999; anything else is a
    ConfigError (exit 2) naming the option."""
    raw = text.strip()
    if len(raw) > 65536:
        raise ConfigError(f"{option}: {len(raw)} characters is not a bound (an offset, offsets per "
                          "partition, a time ago or an ISO-8601 time)")
    if re.fullmatch(r"[0-9]+", raw):
        return OffsetBound(every=_offset(raw, option, text))
    if re.fullmatch(r"[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*", raw):
        pairs = [p.split(":") for p in raw.split(",")]
        for p, _ in pairs:
            if not re.fullmatch(_PARTITION, p) or int(p) > MAX_PARTITION:
                raise ConfigError(f"{option} {shown(text)}: partition {shown(p, 24)} is not a partition "
                                  "(0 to 2**31-1, plain decimal)")
        parts = {int(p): _offset(o, option, text) for p, o in pairs}
        if len(parts) != len(pairs):
            raise ConfigError(f"{option} {shown(text)}: a partition is given twice")
        return OffsetBound(partitions=parts)
    if durations.is_duration(raw):
        ago = durations.parse_duration(raw) * 1000
        if not ago <= now_ms:
            raise ConfigError(f"{option} {shown(text)}: that is before 1970 (the epoch); give a "
                              "shorter time ago or an ISO-8601 time")
        return TimeBound(int(now_ms - ago))
    try:
        when = datetime.fromisoformat(raw.replace("z", "Z"))
        if when.tzinfo is None:
            when = when.astimezone()  # local time
        ms = int(when.timestamp() * 1000)
    except ValueError:
        raise ConfigError(f"{option} {shown(text)}: expected an offset (1200), offsets per partition "
                          f"(0:1200,3:80), a time ago ({durations.EXAMPLES}) or an ISO-8601 time "
                          "(2026-11-21T14:00:00Z)") from None
    except (OverflowError, OSError):
        ms = -1
    if not 0 <= ms <= MAX_MS:
        raise ConfigError(f"{option} {shown(text)}: a time between 1970 and 9999")
    return TimeBound(ms)


def _offset(raw: str, option: str, text: str) -> int:
    if not re.fullmatch(_OFFSET, raw) or int(raw) > MAX_OFFSET:
        raise ConfigError(f"{option} {shown(text)}: offset {shown(raw, 24)} is not an offset "
                          "(0 to 2**63-1, plain decimal)")
    return int(raw)


def _topic_matches(topic: str, patterns: Sequence[str]) -> bool:
    # kafka.topics as librdkafka subscribes: a name, or a regex when it starts with "^".
    return any(topic == p or (p.startswith("^") and re.search(p, topic) is not None) for p in patterns)


@dataclass(frozen=True)
class Selection:
    """The letters a run takes: ``judge`` says, for each, redrive (None), pass over (Skip) or
    stop here (Stop)."""

    topics: Sequence[str]  # kafka.topics: letters of other topics belong to other groups
    start: Bound = None
    end: Bound = None
    error_types: frozenset[str] = frozenset()
    max_redrives: int = 3
    through_plugin: bool = False
    # Only these letters, by (partition, offset) of the dead-letter topic (the console's pick);
    # None: every letter the rest selects.
    picked: frozenset[tuple[int, int]] | None = None

    def end_offset(self, partition: int) -> int | None:
        return self.end.at(partition) if isinstance(self.end, OffsetBound) else None

    def judge(self, letter: Letter) -> Skip | Stop | None:
        end = self.end_offset(letter.partition)
        when = letter.when_ms
        if end is not None and letter.offset >= end:
            return Stop.AFTER_TO
        if isinstance(self.end, TimeBound) and when is not None and when >= self.end.ms:
            return Stop.AFTER_TO
        if isinstance(self.start, OffsetBound):
            start = self.start.at(letter.partition)
            if start is not None and letter.offset < start:
                return Skip.BEFORE_FROM
        if isinstance(self.start, TimeBound) and (when is None or when < self.start.ms):
            return Skip.BEFORE_FROM
        if self.picked is not None and (letter.partition, letter.offset) not in self.picked:
            return Skip.NOT_PICKED
        if letter.malformed:
            return Skip.MALFORMED
        if letter.problem is not None or letter.source is None:
            return Skip.NOT_A_DEAD_LETTER
        if not _topic_matches(letter.source.topic, self.topics):
            return Skip.OTHER_SOURCE
        if self.error_types and letter.error_type not in self.error_types:
            return Skip.NOT_SELECTED
        if letter.count >= self.max_redrives:
            return Skip.MAX_REDRIVES
        if self.through_plugin and letter.error_type == WORKER_CRASHED:
            return Skip.CRASHED_A_WORKER
        return None
