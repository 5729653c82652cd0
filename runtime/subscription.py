"""What a subscription (``kafka.topics``) takes in. Runs in: the CLI (config checks) and
workers (an ``Output(topic=...)`` back into the input). Its own module, free of the settings'
models: a worker that imported runtime.config for this paid pydantic's import, ~0.1 s of CPU
at each start."""

from __future__ import annotations

import re
from collections.abc import Iterable


def subscribed_by(topics: Iterable[str], name: str) -> str | None:
    """The entry of a subscription (``kafka.topics``: names, and patterns starting with ``^``
    as librdkafka reads them: a regular expression searched in the topic's name) that takes
    in topic ``name``, or None."""
    for t in topics:
        if (re.search(t, name) is not None) if t.startswith("^") else t == name:
            return t
    return None
