"""The group's committed offsets, read as a member of the group reads them: ``committed()`` on a
short-lived consumer that never joins the group, off the loop (``--until-caught-up``,
runtime/kafka/group_offsets.py).

Not an admin client's ListConsumerGroupOffsets: when the coordinator answers NOT_COORDINATOR (a
broker just started, a coordinator moving to another node), librdkafka's admin client
dereferences the consumer group it does not have and the process dies with SIGSEGV
(librdkafka#5040). A consumer's ``committed()`` fails with an error instead, and a coordinator
moving or loading is asked again (runtime/kafka/coordinator.py) within the bound.

A consumer reads the partitions it names, so each question names the topics: those the
configuration names and, under a topic pattern (``^...``), every topic of the cluster's metadata
the pattern matches. ``stable``: the answer waits until no transaction holding offsets of these
partitions is pending (``require_stable``, which librdkafka asks for under ``isolation.level =
read_committed``): what an exactly-once batch run is judged by.

Runs in: supervisor (``ask`` returns a Future at once); the answer is found on its own thread.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from runtime.kafka import coordinator
from runtime.kafka.side_readers import answer_on_thread, reader_properties
from runtime.tp import TP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Committed:
    """``offsets``: partition -> committed offset (partitions with none are left out);
    ``refused``: partitions the coordinator answered with an error (an unstable offset while a
    transaction is pending, not authorised), with it; ``topics``: the topics asked about."""

    offsets: Mapping[TP, int]
    refused: Mapping[TP, str] = field(default_factory=dict)
    topics: frozenset[str] = frozenset()


class GroupCommitted:
    def __init__(self, props: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        group = str(props.get("group.id", ""))
        self._props = {stable: reader_properties(props, group, {
            "isolation.level": "read_committed" if stable else "read_uncommitted"})
            for stable in (False, True)}

    def ask(self, names: Collection[str], patterns: Sequence[re.Pattern[str]], stable: bool,
            timeout_s: float | None = None) -> Future[Committed]:
        """Future answer for the topics ``names`` and those matching ``patterns`` (within
        ``timeout_s``, default the reader's; its exception when there is none in time)."""
        bound = self.timeout_s if timeout_s is None else timeout_s
        return answer_on_thread("kafka-group-committed", lambda: self.find(names, patterns, stable, bound))

    def find(self, names: Collection[str], patterns: Sequence[re.Pattern[str]], stable: bool,
             timeout_s: float) -> Committed:
        """The answer, on the calling thread: the topics' partitions from the cluster's metadata,
        then their committed offsets, asked again while the coordinator moves or loads."""
        deadline = time.monotonic() + timeout_s
        c = Consumer(self._props[stable])
        try:
            parts = _partitions(c, names, patterns, max(0.1, deadline - time.monotonic()))
            if not parts:
                return Committed({}, topics=frozenset())
            wanted = [TopicPartition(t, p) for t, p in parts]
            answer = coordinator.until_answered(
                lambda: c.committed(wanted, timeout=max(0.1, deadline - time.monotonic())),
                max(0.0, deadline - time.monotonic()), "the group's committed offsets")
        finally:
            c.close()
        offsets = {(p.topic, p.partition): p.offset for p in answer if p.error is None and p.offset >= 0}
        refused = {(p.topic, p.partition): str(p.error) for p in answer if p.error is not None}
        return Committed(offsets, refused, frozenset(t for t, _ in parts))


def _partitions(c: Consumer, names: Collection[str], patterns: Sequence[re.Pattern[str]],
                timeout_s: float) -> list[TP]:
    """Every partition of the topics named and of those the patterns match, from the metadata
    (a topic not there yet has none)."""
    found: list[TP] = []
    if patterns:
        meta = c.list_topics(timeout=timeout_s).topics
        topics = {t: m for t, m in meta.items() if t in names or any(p.search(t) for p in patterns)}
    else:
        topics = {}
        for t in names:
            topics.update(c.list_topics(t, timeout=timeout_s).topics)
    for t, m in topics.items():
        if m.error is None:
            found += [(t, p) for p in m.partitions]
    return sorted(found)
