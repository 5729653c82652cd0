"""A topic-partition: the one definition of the pair and of how it is written in logs,
status and metrics (``orders[3]``). Runs in: every process."""

from __future__ import annotations

TP = tuple[str, int]


def tp_label(tp: TP) -> str:
    """``topic[partition]``: how every log line, status table and error names a partition."""
    return f"{tp[0]}[{tp[1]}]"
