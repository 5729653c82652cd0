"""What a dead-letter record carries: the original key and value unchanged, the original
headers, and ``ringmaster.*`` headers that say why it failed and where it came from."""

from __future__ import annotations

import time
from typing import Any

HEADER_PREFIX = "ringmaster."
MAX_TRACEBACK_BYTES = 16 * 1024


def dead_letter_headers(original: list[tuple[str, bytes | None]] | None, *, error_type: str,
                        message: str, traceback: str, topic: str, partition: int, offset: int,
                        attempts: int, worker: str) -> list[tuple[str, bytes]]:
    reason: list[tuple[str, Any]] = [
        ("error.type", error_type),
        ("error.message", message[:4096]),
        ("error.traceback", traceback[-MAX_TRACEBACK_BYTES:]),
        ("source.topic", topic),
        ("source.partition", str(partition)),
        ("source.offset", str(offset)),
        ("attempts", str(attempts)),
        ("worker", worker),
        ("failed_at_ms", str(int(time.time() * 1000))),
    ]
    headers = [(k, v) for k, v in (original or []) if not k.startswith(HEADER_PREFIX)]
    headers.extend((HEADER_PREFIX + k, str(v).encode("utf-8", "replace")) for k, v in reason)
    return headers  # type: ignore[return-value]
