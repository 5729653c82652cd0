"""A topic-partition: the one definition of the pair and of how it is written in logs,
status and metrics (``orders[3]``). Runs in: every process."""

from __future__ import annotations

TP = tuple[str, int]

# A name Kafka accepts for a topic: the configured topics are checked at start
# (runtime/config/models.py), a plugin's routed outputs by the worker (runtime/kafka/producer.py,
# ``invalid_topic``). Here, not in runtime/config/, so that a worker checks names without
# importing the settings models.
TOPIC_NAME = r"^[a-zA-Z0-9._-]{1,249}$"


def tp_label(tp: TP) -> str:
    """``topic[partition]``: how every log line, status table and error names a partition."""
    return f"{tp[0]}[{tp[1]}]"
