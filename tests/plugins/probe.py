"""A test plugin driven by record values, with a journal of what it processed.

Values: ``<id>`` is processed; ``raise:<id>`` raises; ``crash:<id>`` kills the worker
(``os._exit``); ``hang:<id>`` never returns; ``reject:<id>`` is rejected through the API.
Setting ``fail_setup`` makes setup() raise. Output: JSON with the id and
where it came from. Settings: ``sleep_ms`` per record, ``journal_dir`` (one file per
worker process: ``partition offset pid monotonic_ns`` per record, written per batch).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from runtime.plugin import Context, Output, Record, Reject

_sleep_s = 0.0
_journal: int | None = None


def setup(context: Context) -> None:
    global _sleep_s, _journal
    if context.settings.get("fail_setup"):
        raise RuntimeError("setup refused: fail_setup is set")
    _sleep_s = float(context.settings.get("sleep_ms", 0)) / 1000
    jdir = context.settings.get("journal_dir")
    if jdir:
        _journal = os.open(os.path.join(jdir, f"{os.getpid()}.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


def process(batch: Sequence[Record]) -> Iterator[Any]:
    lines = []
    outs: list[Any] = []
    for r in batch:
        value = (r.value or b"").decode()
        if value.startswith("raise:"):
            raise ValueError(f"poison record {value}")
        if value.startswith("crash:"):
            os._exit(13)
        if value.startswith("hang:"):
            time.sleep(3600)
        if _sleep_s:
            time.sleep(_sleep_s)
        if value.startswith("reject:"):
            outs.append(Reject(r, f"rejected {value}"))
            continue
        lines.append(f"{r.topic} {r.partition} {r.offset} {os.getpid()} {time.monotonic_ns()}\n")
        outs.append(Output(json.dumps({"id": value, "p": r.partition, "o": r.offset,
                                       "pid": os.getpid()}).encode(), key=r.key))
    if _journal is not None and lines:
        os.write(_journal, "".join(lines).encode())
    return iter(outs)
