"""A test plugin with a bug that a setting fixes, for the redrive tests.

A value is ``<kind>:<id>``:

=====  ==========================================================================
ok     processed
bug    raises ValueError while the ``fixed`` setting is false (the bug), processed once it is
bad    always rejected (``Reject``): data no fix will make good
=====  ==========================================================================

Settings: ``fixed`` (bool); ``backoff_dir``: the first time a ``bug`` record is seen (a file
per id there) the plugin raises ``Backoff(backoff_s)`` instead, once. Each processed record
yields one output: JSON with the id, the record's ``ringmaster.redrive.count`` header (None
without), and its other headers (hex values), keyed like the input.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from runtime.plugin import Backoff, Context, Output, Record, Reject

_fixed = False
_backoff_dir: str | None = None
_backoff_s = 0.0


def setup(context: Context) -> None:
    global _fixed, _backoff_dir, _backoff_s
    _fixed = bool(context.settings.get("fixed", False))
    _backoff_dir = context.settings.get("backoff_dir")
    _backoff_s = float(context.settings.get("backoff_s", 0.2))


def _first_time(ident: str) -> bool:
    assert _backoff_dir is not None
    path = os.path.join(_backoff_dir, ident)
    if os.path.exists(path):
        return False
    with open(path, "w"):
        pass
    return True


def process(batch: Sequence[Record]) -> list[Any]:
    outs: list[Any] = []
    for r in batch:
        kind, _, ident = (r.value or b"").decode().partition(":")
        if kind == "bug" and _backoff_dir is not None and _first_time(ident):
            raise Backoff(_backoff_s, f"downstream away for {ident}")
        if kind == "bug" and not _fixed:
            raise ValueError(f"the bug, on {ident}")
        if kind == "bad":
            outs.append(Reject(r, f"{ident} is bad data"))
            continue
        headers = dict(r.headers or [])
        count = headers.pop("ringmaster.redrive.count", None)
        body = {"id": ident, "count": None if count is None else int(count),
                "headers": [[k, None if v is None else v.hex()] for k, v in (r.headers or [])
                            if not k.startswith("ringmaster.")],
                "topic": r.topic, "partition": r.partition}
        outs.append(Output(json.dumps(body).encode(), key=r.key))
    return outs
