"""Reading a dead letter back, and the headers of the record a redrive sends.

A dead letter (runtime/execution/deadletter_format.py) is the failing record's key, value and
headers followed by ``ringmaster.*`` headers: why it failed (``error.type``, ...), where it
came from (``source.topic``, ``source.partition``, ``source.offset``), when
(``failed_at_ms``), and how often it was redriven already (``redrive.count``). Its form says
whether it still holds the whole record:

* **whole**: key, value and headers as they were: redriven as they are;
* **truncated** (``value.truncated``, ``key.truncated`` or ``headers.dropped``) and
  **reference** (``value.omitted``): part or all of the record is missing. Sending the cut
  copy back would feed the plugin a record that never existed, so the original is read again
  from its source coordinates, if the source topic still retains it (runtime/redrive/actions.py).

Every field is read **bounded**, as the control topic's records are
(runtime/ops/control_records.py): a letter is data anyone who can write to the topic (or to
an input topic: a record's own ``ringmaster.redrive.count`` is carried into its letter) may
have shaped. A number is canonical decimal within its Kafka type (a partition is an int32, an
offset an int64), a topic a legal topic name, a text cut to a length a line can show. A letter
with a field out of bounds gets a ``problem`` naming the field and is passed over
(runtime/redrive/selection.py ``Skip.MALFORMED``): it stays in the dead-letter topic for a
person to look at (``ringmaster tail --dead-letters``), the run counts it and commits past it,
and nothing it holds reaches an int(), a produce() or a seek().

Pure functions. Runs in: the CLI (``ringmaster redrive``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from runtime.execution.deadletter_format import HEADER_PREFIX, REDRIVE_COUNT

Headers = list[tuple[str, bytes | None]]

ERROR_TYPE = HEADER_PREFIX + "error.type"
SOURCE_TOPIC = HEADER_PREFIX + "source.topic"
SOURCE_PARTITION = HEADER_PREFIX + "source.partition"
SOURCE_OFFSET = HEADER_PREFIX + "source.offset"
FAILED_AT_MS = HEADER_PREFIX + "failed_at_ms"
KEY_TRUNCATED = HEADER_PREFIX + "key.truncated"
VALUE_TRUNCATED = HEADER_PREFIX + "value.truncated"
HEADERS_DROPPED = HEADER_PREFIX + "headers.dropped"
VALUE_OMITTED = HEADER_PREFIX + "value.omitted"

# Kafka's own types: a partition id is an int32, an offset and a timestamp int64s.
MAX_PARTITION = 2**31 - 1
MAX_OFFSET = 2**63 - 1
# 9999-12-31T23:59:59.999Z, as for the control records: every formatter handles it.
MAX_MS = 253_402_300_799_999
# A redrive count is raised by one per redrive: no real record comes near this.
MAX_REDRIVE_COUNT = 2**31 - 1
MAX_SIZE_BYTES = 2**63 - 1  # a size in a *.truncated header
MAX_ERROR_TYPE_CHARS = 256  # an exception's class name; shown in summaries and logs
_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
# Canonical decimal, and never longer than the largest bound: int() never sees more digits.
_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")


class Form(enum.Enum):
    WHOLE = "whole"
    TRUNCATED = "truncated"
    REFERENCE = "reference"


@dataclass(frozen=True, slots=True)
class Source:
    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"


@dataclass(frozen=True, slots=True)
class Letter:
    """One record of the dead-letter topic, read. ``problem`` says why it cannot be redriven
    at all (not written by ringmaster, or a header out of bounds: ``malformed``); the other
    fields are then best effort, and within their bounds."""

    partition: int  # of the dead-letter topic
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    timestamp_ms: int | None  # the dead-letter record's own timestamp
    error_type: str
    source: Source | None
    count: int  # times redriven already
    failed_at_ms: int | None
    form: Form
    problem: str | None = None
    malformed: bool = False  # the problem is a ringmaster.* header out of bounds, not their absence

    @property
    def when_ms(self) -> int | None:
        """When the record failed: the ``failed_at_ms`` header ringmaster wrote, else the
        dead-letter record's timestamp (for letters written by other tools)."""
        return self.failed_at_ms if self.failed_at_ms is not None else self.timestamp_ms


def _last(headers: Headers, name: str) -> bytes | None:
    value = None
    for k, v in headers:
        if k == name and v is not None:
            value = v
    return value


def _natural(raw: bytes | None, maximum: int) -> int | None:
    """A decimal integer 0 <= n <= maximum (surrounding blanks allowed), or None for anything
    else: another form, a sign, more digits than an int64 has."""
    if raw is None or len(raw) > 64:
        return None
    text = raw.strip()
    if _DECIMAL.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value <= maximum else None


def _shown(raw: bytes | None) -> str:
    """A header's value for a problem text: repr'd, cut at 40 characters."""
    return f"{raw!r:.40}"


def redrive_count(headers: Headers | None) -> int | None:
    """Times a record was redriven already (0 without the header); None if unreadable."""
    raw = _last(headers or [], REDRIVE_COUNT)
    return 0 if raw is None else _natural(raw, MAX_REDRIVE_COUNT)


def read_letter(partition: int, offset: int, key: bytes | None, value: bytes | None,
                headers: Headers | None, timestamp: tuple[int, int] | None) -> Letter:
    """The dead letter at ``partition``/``offset`` of the dead-letter topic, as consumed.
    ``timestamp`` is ``(type, ms)`` as confluent-kafka gives it (type 0: none)."""
    headers = list(headers or [])
    ts_ms = timestamp[1] if timestamp is not None and timestamp[0] != 0 else None
    error_type = (_last(headers, ERROR_TYPE) or b"")[:4 * MAX_ERROR_TYPE_CHARS] \
        .decode("utf-8", "replace")[:MAX_ERROR_TYPE_CHARS]
    raw_topic, raw_part, raw_off = (_last(headers, h)
                                    for h in (SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET))
    topic = raw_topic.decode("ascii", "replace") if raw_topic is not None and len(raw_topic) <= 249 else None
    part, off = _natural(raw_part, MAX_PARTITION), _natural(raw_off, MAX_OFFSET)
    source = None if topic is None or part is None or off is None or not _TOPIC.fullmatch(topic) \
        else Source(topic, part, off)
    count = redrive_count(headers)
    raw_failed_at = _last(headers, FAILED_AT_MS)
    failed_at = _natural(raw_failed_at, MAX_MS)
    if _last(headers, VALUE_OMITTED) is not None:
        form = Form.REFERENCE
    elif any(_last(headers, h) is not None for h in (VALUE_TRUNCATED, KEY_TRUNCATED, HEADERS_DROPPED)):
        form = Form.TRUNCATED
    else:
        form = Form.WHOLE
    problem = malformed = None
    if not error_type or raw_topic is None or raw_part is None or raw_off is None:
        problem = "no ringmaster.error.type and ringmaster.source.topic/partition/offset headers"
    elif source is None:
        malformed = _source_problem(raw_topic, raw_part, raw_off)
    elif count is None:
        malformed = f"{REDRIVE_COUNT} {_shown(_last(headers, REDRIVE_COUNT))} is not an integer " \
                    f"0..{MAX_REDRIVE_COUNT}"
    elif raw_failed_at is not None and failed_at is None:
        malformed = f"{FAILED_AT_MS} {_shown(raw_failed_at)} is not a time in ms 0..{MAX_MS}"
    else:
        for name in (KEY_TRUNCATED, VALUE_TRUNCATED):
            raw = _last(headers, name)
            if raw is not None and _natural(raw, MAX_SIZE_BYTES) is None:
                malformed = f"{name} {_shown(raw)} is not a size in bytes"
                break
    return Letter(partition, offset, key, value, headers, ts_ms, error_type or "?", source,
                  count or 0, failed_at, form, problem or malformed, malformed is not None)


def _source_problem(topic: bytes, partition: bytes, offset: bytes) -> str:
    if not _TOPIC.fullmatch(topic.decode("ascii", "replace")):
        return f"{SOURCE_TOPIC} {_shown(topic)} is not a topic name ([a-zA-Z0-9._-], 1-249)"
    if _natural(partition, MAX_PARTITION) is None:
        return f"{SOURCE_PARTITION} {_shown(partition)} is not a partition 0..2**31-1"
    return f"{SOURCE_OFFSET} {_shown(offset)} is not an offset 0..2**63-1"


def original_headers(headers: Headers | None) -> Headers:
    """The record's own headers, in their order: all but the runtime's ``ringmaster.*``."""
    return [(k, v) for k, v in (headers or []) if not k.startswith(HEADER_PREFIX)]


def redriven_headers(original: Headers | None, count: int) -> Headers:
    """The headers of a redriven copy: the original ones exactly (``ringmaster.*`` diagnostics
    removed), then the redrive count."""
    return [*original_headers(original), (REDRIVE_COUNT, str(count).encode())]


def stands_for(letter: Letter, key: bytes | None, value: bytes | None) -> bool:
    """Whether a record read again from the letter's source is the one a truncated letter was
    cut from: same sizes (where the letter recorded them) and the letter's parts as prefixes.
    A topic deleted and created again holds other records at the same offsets. A reference
    letter keeps nothing to compare with: it is taken on trust."""
    if letter.form is not Form.TRUNCATED:
        return True
    pairs = ((letter.key, key, KEY_TRUNCATED), (letter.value, value, VALUE_TRUNCATED))
    for kept, found, size_header in pairs:
        size = _natural(_last(letter.headers, size_header), MAX_SIZE_BYTES)
        if size is None:  # this part was kept whole
            if kept != found:
                return False
        elif found is None or len(found) != size or not found.startswith(kept or b""):
            return False
    return True
