"""Reading a dead letter back, and the headers of the record a redrive sends.

A dead letter (runtime/worker/deadletter_format.py) is the failing record's key, value and
headers followed by ``ringmaster.*`` headers: why it failed (``error.type``, ...), where it
came from (``source.topic``, ``source.partition``, ``source.offset``), when
(``failed_at_ms``), and how often it was redriven already (``redrive.count``). Its form says
whether it still holds the whole record:

* **whole**: key, value and headers as they were: redriven as they are;
* **truncated** (``value.truncated``, ``key.truncated`` or ``headers.dropped``) and
  **reference** (``value.omitted``): part or all of the record is missing. Sending the cut
  copy back would feed the plugin a record that never existed, so the original is read again
  from its source coordinates, if the source topic still retains it (runtime/redrive/actions.py).

Pure functions. Runs in: the CLI (``ringmaster redrive``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from runtime.worker.deadletter_format import HEADER_PREFIX, REDRIVE_COUNT

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
    at all (not written by ringmaster, or its headers are unreadable); the other fields are
    then best effort."""

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


def _natural(raw: bytes | None) -> int | None:
    """A non-negative decimal integer, or None for anything else."""
    if raw is None:
        return None
    text = raw.decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


def redrive_count(headers: Headers | None) -> int | None:
    """Times a record was redriven already (0 without the header); None if unreadable."""
    raw = _last(headers or [], REDRIVE_COUNT)
    return 0 if raw is None else _natural(raw)


def read_letter(partition: int, offset: int, key: bytes | None, value: bytes | None,
                headers: Headers | None, timestamp: tuple[int, int] | None) -> Letter:
    """The dead letter at ``partition``/``offset`` of the dead-letter topic, as consumed.
    ``timestamp`` is ``(type, ms)`` as confluent-kafka gives it (type 0: none)."""
    headers = list(headers or [])
    ts_ms = timestamp[1] if timestamp is not None and timestamp[0] != 0 else None
    error_type = (_last(headers, ERROR_TYPE) or b"").decode("utf-8", "replace")
    topic = _last(headers, SOURCE_TOPIC)
    part, off = _natural(_last(headers, SOURCE_PARTITION)), _natural(_last(headers, SOURCE_OFFSET))
    source = None if topic is None or part is None or off is None else \
        Source(topic.decode("utf-8", "replace"), part, off)
    count = redrive_count(headers)
    failed_at = _natural(_last(headers, FAILED_AT_MS))
    if _last(headers, VALUE_OMITTED) is not None:
        form = Form.REFERENCE
    elif any(_last(headers, h) is not None for h in (VALUE_TRUNCATED, KEY_TRUNCATED, HEADERS_DROPPED)):
        form = Form.TRUNCATED
    else:
        form = Form.WHOLE
    problem = None
    if source is None or not error_type:
        problem = "no ringmaster.error.type and ringmaster.source.topic/partition/offset headers"
    elif count is None:
        problem = f"unreadable {REDRIVE_COUNT} header {_last(headers, REDRIVE_COUNT)!r:.40}"
    return Letter(partition, offset, key, value, headers, ts_ms, error_type or "?", source,
                  count or 0, failed_at, form, problem)


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
        size = _natural(_last(letter.headers, size_header))
        if size is None:  # this part was kept whole
            if kept != found:
                return False
        elif found is None or len(found) != size or not found.startswith(kept or b""):
            return False
    return True
