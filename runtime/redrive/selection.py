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
from runtime.redrive.letters import Letter

# The error type the supervisor gives a record that crashed or hung its worker
# (runtime/supervisor/loop.py). In this process it would take the redrive down with it.
WORKER_CRASHED = "WorkerCrashed"


class Skip(enum.Enum):
    """Why a letter is passed over (the cursor moves past it; it stays in the topic)."""

    BEFORE_FROM = "before-from"
    NOT_A_DEAD_LETTER = "not-a-dead-letter"
    OTHER_SOURCE = "other-source"
    NOT_SELECTED = "not-selected"
    MAX_REDRIVES = "max-redrives"
    CRASHED_A_WORKER = "crashed-a-worker"
    SOURCE_GONE = "source-gone"
    REFUSED = "refused"

    @property
    def meaning(self) -> str:
        return _MEANINGS[self]


_MEANINGS = {
    Skip.BEFORE_FROM: "failed before --from",
    Skip.NOT_A_DEAD_LETTER: "not a ringmaster dead letter (no or unreadable ringmaster.* headers)",
    Skip.OTHER_SOURCE: "from a topic this config does not read (kafka.topics)",
    Skip.NOT_SELECTED: "error type not given with --error-type",
    Skip.MAX_REDRIVES: "redriven --max-redrives times already",
    Skip.CRASHED_A_WORKER: "crashed or hung a worker: redrive it to its source, where the daemon isolates it",
    Skip.SOURCE_GONE: "truncated or reference letter whose source record is no longer retained",
    Skip.REFUSED: "the broker refused the redriven copy for what it is (size, partition)",
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

def parse_bound(text: str, option: str, now_ms: int) -> OffsetBound | TimeBound:
    """``--from``/``--to``: an offset (``1200``), offsets per partition (``0:1200,3:80``), a
    time ago in the one duration grammar (runtime/durations.py: ``90s``, ``15m``, ``1h30m``,
    ``1d``, ``1w``) or an ISO-8601 time
    (``2026-11-21T14:00:00Z``; without a zone, local time, as kafka-consumer-groups reads it)."""
    raw = text.strip()
    if re.fullmatch(r"\d+", raw):
        return OffsetBound(every=int(raw))
    if re.fullmatch(r"\d+:\d+(,\d+:\d+)*", raw):
        pairs = [p.split(":") for p in raw.split(",")]
        parts = {int(p): int(o) for p, o in pairs}
        if len(parts) != len(pairs):
            raise ConfigError(f"{option} {text!r}: a partition is given twice")
        return OffsetBound(partitions=parts)
    if durations.is_duration(raw):
        return TimeBound(int(now_ms - durations.parse_duration(raw) * 1000))
    try:
        when = datetime.fromisoformat(raw.replace("z", "Z"))
    except ValueError:
        raise ConfigError(f"{option} {text!r}: expected an offset (1200), offsets per partition "
                          f"(0:1200,3:80), a time ago ({durations.EXAMPLES}) or an ISO-8601 time "
                          "(2026-11-21T14:00:00Z)") from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    return TimeBound(int(when.timestamp() * 1000))


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
