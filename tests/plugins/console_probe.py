"""The browser test's plugin (tests/integration/test_console_browser.py): every record's output is
JSON naming its id and where it came from; a value ``poison:<id>`` is rejected (dead-lettered)
unless the record is a redriven copy (it carries ``ringmaster.redrive.count``): the bug is fixed
by the time an operator redrives it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

from runtime.plugin import Record, Reject


def process(batch: Sequence[Record]) -> Iterator[Any]:
    for r in batch:
        value = (r.value or b"").decode()
        redriven = any(k == "ringmaster.redrive.count" for k, _ in r.headers or [])
        if value.startswith("poison:") and not redriven:
            yield Reject(r, "poison record: fixed in the next release")
            continue
        yield json.dumps({"id": value.removeprefix("poison:"), "partition": r.partition, "offset": r.offset,
                          "redriven": redriven}).encode()
