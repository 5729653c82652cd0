"""What a dead-letter record carries: the original key and value unchanged, the original
headers, and ``ringmaster.*`` headers that say why it failed and where it came from.

A dead letter must always be writable, or a failing record would stop its partition (or,
worse, crash whoever tries to write it, again and again). So it is made to fit:

1. **whole** – the original key, value and headers plus the reason;
2. **truncated** – when that exceeds the producer's ``message.max.bytes``, the value (then
   the key) is cut to fit and ``ringmaster.value.truncated`` / ``ringmaster.key.truncated``
   carry the original sizes; original headers that do not fit are dropped and
   ``ringmaster.headers.dropped`` says how many;
3. **reference** – when the broker refuses even that for what it is (a topic limit below the
   client's, a compacted topic and a null key), no value and no original headers, and the
   key ``<topic>/<partition>/<offset>``: the ``source.*`` headers say where to read it.

The ``ringmaster.`` header namespace is the runtime's: a failing record's own ``ringmaster.*``
headers are replaced by the new reason, except the **redrive count** (``ringmaster.redrive.count``,
set by ``ringmaster redrive`` on each record it sends back), which every form carries on so
that a record failing again is redriven at most ``--max-redrives`` times
(runtime/redrive/letters.py reads dead letters back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

HEADER_PREFIX = "ringmaster."
# How many times ``ringmaster redrive`` has sent this record back: set on the redriven copy,
# carried from the failing record into its dead letter, raised by one on each redrive.
REDRIVE_COUNT = HEADER_PREFIX + "redrive.count"
MAX_TRACEBACK_BYTES = 16 * 1024
MAX_MESSAGE_BYTES = 4096
# librdkafka counts key + value + header names and values against message.max.bytes, and
# the record batch adds its own framing: keep this much below the limit.
_MARGIN_BYTES = 1024
_PER_HEADER_BYTES = 16

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True, slots=True)
class DeadLetter:
    key: bytes | None
    value: bytes | None
    headers: Headers
    form: str  # "whole", "truncated" or "reference"


def dead_letter_headers(original: Headers | None, *, error_type: str, message: str, traceback: str,
                        topic: str, partition: int, offset: int, attempts: int,
                        worker: str, plugin_version: str | None = None,
                        delivery_count: int | None = None) -> Headers:
    reason: list[tuple[str, Any]] = [
        ("error.type", error_type),
        ("error.message", _bytes_head(message, MAX_MESSAGE_BYTES)),
        ("error.traceback", _bytes_tail(traceback, MAX_TRACEBACK_BYTES)),
        ("source.topic", topic),
        ("source.partition", str(partition)),
        ("source.offset", str(offset)),
        ("attempts", str(attempts)),
        ("worker", worker),
        ("failed_at_ms", str(int(time.time() * 1000))),
    ]
    if plugin_version is not None:
        reason.append(("plugin.version", plugin_version))  # the version that failed it
    if delivery_count is not None:
        reason.append(("delivery_count", str(delivery_count)))  # a share group's, when it failed
    headers = [(k, v) for k, v in (original or []) if not k.startswith(HEADER_PREFIX)]
    headers.extend((HEADER_PREFIX + k, v if isinstance(v, bytes) else str(v).encode("utf-8", "replace"))
                   for k, v in reason)
    headers.extend(carried_headers(original))
    return headers


def carried_headers(original: Headers | None) -> Headers:
    """The ``ringmaster.*`` headers of a failing record that its dead letter keeps: the redrive
    count (the last one, should a record carry several).

    INVARIANT: a redriven record that fails again keeps its count, or ``--max-redrives`` could
    never stop a record that always fails from going round for ever."""
    counts: Headers = [(k, v) for k, v in (original or []) if k == REDRIVE_COUNT and v is not None]
    return counts[-1:]


def _bytes_head(text: str, limit: int) -> bytes:
    """At most ``limit`` bytes of UTF-8, cut on a character boundary."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore").encode()


def _bytes_tail(text: str, limit: int) -> bytes:
    raw = text.encode("utf-8", "replace")
    return raw[-limit:].decode("utf-8", "ignore").encode() if len(raw) > limit else raw


def _size(headers: Headers) -> int:
    return sum(len(k.encode()) + len(v or b"") + _PER_HEADER_BYTES for k, v in headers)


def fit_dead_letter(key: bytes | None, value: bytes | None, headers: Headers,
                    max_message_bytes: int) -> DeadLetter:
    """The dead letter in the first form that fits ``max_message_bytes`` (steps 1 and 2)."""
    budget = max(max_message_bytes - _MARGIN_BYTES, 1024)
    ours = [(k, v) for k, v in headers if k.startswith(HEADER_PREFIX)]
    theirs = [(k, v) for k, v in headers if not k.startswith(HEADER_PREFIX)]
    if len(key or b"") + len(value or b"") + _size(headers) <= budget:
        return DeadLetter(key, value, headers, "whole")
    room = budget - _size(ours) - 3 * 64  # the three size headers below
    if room < 0:  # our own reason is too long: keep its head
        ours = [(k, (v or b"")[: max(64, budget // (4 * len(ours)))]) for k, v in ours]
        room = max(0, budget - _size(ours) - 3 * 64)
    kept: Headers = []
    for k, v in theirs:
        if _size(kept) + _size([(k, v)]) > room // 4:
            break
        kept.append((k, v))
    room -= _size(kept)
    extra: Headers = []
    if len(kept) < len(theirs):
        extra.append((HEADER_PREFIX + "headers.dropped", str(len(theirs) - len(kept)).encode()))
    if key is not None and len(key) > room // 2:
        extra.append((HEADER_PREFIX + "key.truncated", str(len(key)).encode()))
        key = key[: room // 2]
    room -= len(key or b"")
    if value is not None and len(value) > room:
        extra.append((HEADER_PREFIX + "value.truncated", str(len(value)).encode()))
        value = value[: max(room, 0)]
    return DeadLetter(key, value, kept + ours + extra, "truncated")


def reference_dead_letter(letter: DeadLetter, topic: str, partition: int, offset: int) -> DeadLetter:
    """Step 3: nothing of the record but where it is (and why it failed)."""
    ours = [(k, v) for k, v in letter.headers if k.startswith(HEADER_PREFIX)]
    ours = [(k, (v or b"")[:1024]) for k, v in ours]
    ours.append((HEADER_PREFIX + "value.omitted", b"true"))
    return DeadLetter(f"{topic}/{partition}/{offset}".encode(), None, ours, "reference")
