"""Where the whole group stands: the end of every partition of its topics, and the group's
committed offsets, asked for off the loop (``--until-caught-up``).

A batch run is caught up when the group is, not only this member: a partition held by
another member – one still working, or a member killed a moment ago whose session has not
timed out yet (under KIP-848 it keeps its partitions until then, and the others get theirs
at once) – is work left, and a run that exited 0 beside it would report a topic done that
is not. So once its own partitions are done, a member asks where every partition of its
topics is committed, and stops only when each is at or past its end.

Each partition's end is taken once, the first time it is seen (so a topic written to all
the time still ends), with ListOffsets under the consumer's isolation level (under
``read_committed``, the last stable offset: records of an open transaction are not work
yet). Requests go through an admin client whose answers arrive on librdkafka's threads:
``refresh`` never blocks the loop, one request of a kind in flight, each abandoned after
``timeout_s``. Tansu answers ListOffsets "latest" stale (runtime/kafka/watermarks.py): an
end taken there can be short of the true end, so another member's partition may count as
caught up early on Tansu. Under a topic pattern (``^...``) the topics are those the pattern
matches among the ones this member was assigned and the ones the group committed to.

Runs in: supervisor (``refresh``/``standing``: never block); the admin client's threads answer.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from runtime.kafka.admin import admin_properties
from runtime.tp import TP

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupStanding:
    """``ends``: every partition of the topics seen so far, with its end when first seen;
    ``committed``: the group's committed offsets, as of the last answer (a partition absent:
    nothing committed); ``complete``: every partition the metadata named has its end, and
    the committed offsets have been answered at least once (until then nothing is judged)."""

    ends: Mapping[TP, int]
    committed: Mapping[TP, int]
    complete: bool

    def left(self, held: set[TP]) -> dict[TP, int | None]:
        """The partitions not in ``held`` whose committed offset is short of their end:
        partition -> committed offset (None: nothing committed)."""
        return {tp: self.committed.get(tp) for tp, end in self.ends.items()
                if tp not in held and self.committed.get(tp, 0) < end}


class GroupAdmin(Protocol):
    """What is asked of the admin client (confluent_kafka's AdminClient; a fake in tests)."""

    # Positional-only: AdminClient and the tests' fake name them differently.
    def describe_topics(self, topics: TopicCollection, /, *, request_timeout: float
                        ) -> Mapping[str, Future[Any]]: ...
    def list_offsets(self, requests: dict[TopicPartition, OffsetSpec], /, *, isolation_level: IsolationLevel,
                     request_timeout: float) -> Mapping[TopicPartition, Future[Any]]: ...
    def list_consumer_group_offsets(self, groups: list[ConsumerGroupTopicPartitions], /, *,
                                    request_timeout: float, require_stable: bool = False
                                    ) -> Mapping[str, Future[Any]]: ...


class GroupOffsets:
    def __init__(self, props: Mapping[str, Any], topics: Sequence[str], interval_s: float = 1.0,
                 timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 admin: Callable[[], GroupAdmin] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.group = str(props.get("group.id", ""))
        self._names = {t for t in topics if not t.startswith("^")}
        self._patterns = [re.compile(t) for t in topics if t.startswith("^")]
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._isolation = (IsolationLevel.READ_UNCOMMITTED
                           if str(props.get("isolation.level", "read_committed")) == "read_uncommitted"
                           else IsolationLevel.READ_COMMITTED)
        self._make = admin or (lambda: AdminClient(admin_properties(props)))
        self._admin: GroupAdmin | None = None  # made at the first ask: most runs never need it
        self._ends: dict[TP, int] = {}
        self._committed: dict[TP, int] = {}
        self._answers = 0
        self._pending: dict[str, tuple[float, Mapping[Any, Future[Any]]]] = {}  # kind -> (asked at, futures)
        self._asked_at: dict[str, float] = {}
        self._known: set[TP] = set()  # partitions the topics' metadata named

    def refresh(self, committed: bool) -> None:
        """Take in finished answers; ask again for what is due: the topics' partitions and the
        ends of new ones always, the committed offsets when ``committed``. Returns at once."""
        self._take()
        try:
            if self._names:
                self._ask("topics", lambda a: a.describe_topics(TopicCollection(sorted(self._names)),
                                                                 request_timeout=self.timeout_s))
            new = sorted(self._known - set(self._ends))
            if new and "ends" not in self._pending:
                self._ask("ends", lambda a: a.list_offsets(
                    {TopicPartition(t, p): OffsetSpec.latest() for t, p in new},
                    isolation_level=self._isolation, request_timeout=self.timeout_s), at_once=True)
            if committed and self.group:
                self._ask("committed", lambda a: a.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(self.group)], request_timeout=self.timeout_s))
        except (KafkaException, ValueError, TypeError) as exc:
            log.debug("cannot ask where the group stands", extra={"error": str(exc)})

    def settle(self, wait_s: float) -> GroupStanding:
        """Ask the group's committed offsets anew, *stable*, and wait up to ``wait_s`` for the
        answer (also once abandoned: the member's last word). Under exactly-once the workers'
        transactions write them: a transaction whose commit returned may not have its offsets
        written to the group yet (the markers follow the commit), and an ordinary read returns
        the offset from before it. A stable read is answered once none is pending; a partition
        answered with an error (UNSTABLE_OFFSET_COMMIT) is asked again until ``wait_s``."""
        deadline = self._clock() + wait_s
        while self.group:
            try:
                if self._admin is None:
                    self._admin = self._make()
                futures = self._admin.list_consumer_group_offsets(
                    [ConsumerGroupTopicPartitions(self.group)], require_stable=True,
                    request_timeout=max(0.1, deadline - self._clock()))
                parts = [p for f in futures.values() for p in (f.result(max(0.1, deadline - self._clock()))
                                                                 .topic_partitions or [])]
            except Exception as exc:  # no answer in time, a busy coordinator: asked again
                log.debug("stable committed offsets unknown", extra={"error": str(exc)})
                parts = None
            if parts is not None and not any(p.error is not None for p in parts if self._wanted(p.topic)):
                self._take_parts(parts)
                break
            if self._clock() >= deadline:
                break
            self._sleep(0.1)
        return self.standing()

    def standing(self) -> GroupStanding:
        complete = bool(self._known) and not self._known - set(self._ends) and self._answers > 0
        return GroupStanding(dict(self._ends), dict(self._committed), complete)

    def note(self, tps: Sequence[TP]) -> None:
        """Partitions assigned to this member: under a pattern, their topics are the group's too."""
        self._names |= {t for t, _ in tps if self._wanted(t)}

    def _wanted(self, topic: str) -> bool:
        return topic in self._names or any(p.search(topic) for p in self._patterns)

    def abandon(self) -> None:
        """Stop asking (the member is stopping); answers in flight are not needed any more."""
        self._pending.clear()
        self._asked_at = {k: float("inf") for k in ("topics", "ends", "committed")}

    # ------------------------------------------------------------------ requests
    def _ask(self, kind: str, send: Callable[[GroupAdmin], Mapping[Any, Future[Any]]],
             at_once: bool = False) -> None:
        now = self._clock()
        if kind in self._pending or (not at_once and now - self._asked_at.get(kind, float("-inf"))
                                     < self.interval_s):
            return
        self._asked_at[kind] = now
        if self._admin is None:
            self._admin = self._make()
        self._pending[kind] = (now, send(self._admin))

    def _take(self) -> None:
        now = self._clock()
        for kind, (asked_at, futures) in list(self._pending.items()):
            if all(f.done() for f in futures.values()):
                del self._pending[kind]
                getattr(self, f"_take_{kind}")(futures)
            elif now - asked_at > self.timeout_s:
                del self._pending[kind]  # asked again on a later turn
                log.debug("where the group stands: no answer in time", extra={"request": kind})

    def _take_topics(self, answers: Mapping[str, Future[Any]]) -> None:
        for topic, fut in answers.items():
            try:
                self._known |= {(topic, p.id) for p in fut.result(0).partitions}
            except Exception as exc:  # a topic not there (yet): the consumer says so already
                log.debug("topic partitions unknown", extra={"topic": topic, "error": str(exc)})

    def _take_ends(self, answers: Mapping[TopicPartition, Future[Any]]) -> None:
        for tp, fut in answers.items():
            try:
                offset = fut.result(0).offset
            except Exception as exc:  # a leader moving: asked again, the partition stays unknown
                log.debug("partition end unknown", extra={"topic": tp.topic, "partition": tp.partition,
                                                          "error": str(exc)})
                continue
            if offset is not None and offset >= 0:
                self._ends.setdefault((tp.topic, tp.partition), offset)

    def _take_committed(self, answers: Mapping[str, Future[Any]]) -> None:
        for fut in answers.values():
            try:
                parts = fut.result(0).topic_partitions or []
            except Exception as exc:  # a busy coordinator: asked again
                log.debug("committed offsets unknown", extra={"error": str(exc)})
                return
            self._take_parts(parts)

    def _take_parts(self, parts: Sequence[TopicPartition]) -> None:
        self._committed = {(p.topic, p.partition): p.offset for p in parts
                           if self._wanted(p.topic) and p.offset >= 0}
        self._names |= {tp[0] for tp in self._committed}
        self._answers += 1
