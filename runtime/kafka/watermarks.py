"""The end of paused partitions, asked for with ListOffsets every few seconds.

librdkafka caches a partition's high watermark from fetch responses. A paused partition is
not fetched, so its cached watermark stands still while records keep arriving: during a
long pause (an operator pause, a back-off, a blocked partition) lag would stop growing
exactly when it matters. For those partitions only, the group consumer also asks the broker
for their latest offsets (an admin client's ListOffsets, answered on librdkafka's threads),
at most once every ``interval_s``, one request at a time, abandoned after ``timeout_s``. The
answer is only ever used to raise the watermark, never to lower it.

The test broker (Tansu) answers ListOffsets "latest" with the base offset of the last
record batch + 1, which is right only when every batch holds one record; the tests that
check lag growing produce one record per batch for that reason.

Runs in: supervisor (``refresh``/``high``: never blocks); the admin client's threads answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, Protocol

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from runtime.kafka.admin import admin_properties, serve_client_log
from runtime.kafka.client_log import with_logger
from runtime.tp import TP, tp_label

log = logging.getLogger(__name__)


class OffsetLister(Protocol):
    """What is asked of the admin client (confluent_kafka's AdminClient; a fake in tests)."""

    # The requests are positional-only: AdminClient and the tests' fake name them differently.
    def list_offsets(self, requests: dict[TopicPartition, OffsetSpec], /, *, request_timeout: float
                     ) -> Mapping[TopicPartition, Future[Any]]: ...


class LatestOffsets:
    def __init__(self, props: Mapping[str, Any], interval_s: float = 5.0, timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic,
                 lister: Callable[[], OffsetLister] | None = None) -> None:
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._make = lister or (lambda: AdminClient(with_logger(admin_properties(props))))
        # Made at the first pause (most runs never need it); replaced before the next ask once
        # an answer came back short (runtime/kafka/admin.py, STALE_LEADERS).
        self._lister: OffsetLister | None = None
        self._latest: dict[TP, int] = {}
        self._pending: Mapping[TopicPartition, Future[Any]] | None = None
        self._asked_at = float("-inf")

    def refresh(self, tps: Iterable[TP]) -> None:
        """Take in a finished answer; ask again for ``tps`` if it is time and nothing is in
        flight. Returns at once."""
        now = self._clock()
        if self._pending is not None:
            if all(f.done() for f in self._pending.values()):
                self._take(self._pending)
                self._pending = None
            elif now - self._asked_at > self.timeout_s:
                log.debug("latest offsets of paused partitions: no answer in time; asking again later")
                self._pending, self._lister = None, None  # the old client is destroyed here
            else:
                return
        tps = sorted(set(tps))
        if not tps or now - self._asked_at < self.interval_s:
            return
        self._asked_at = now
        try:
            if self._lister is None:
                self._lister = self._make()
            self._pending = self._lister.list_offsets(
                {TopicPartition(t, p): OffsetSpec.latest() for t, p in tps},
                request_timeout=self.timeout_s)
            serve_client_log(self._lister)
        except (KafkaException, ValueError, TypeError) as exc:
            log.debug("cannot ask for the latest offsets of paused partitions", extra={"error": str(exc)})

    def _take(self, answers: Mapping[TopicPartition, Future[Any]]) -> None:
        for tp, fut in answers.items():
            try:
                offset = fut.result(0).offset
            except Exception as exc:  # a partition gone, a broker away: the cached value stays
                log.debug("latest offset unknown", extra={"tp": tp_label((tp.topic, tp.partition)),
                                                          "error": str(exc)})
                self._lister = None
                continue
            if offset is None or offset < 0:
                self._lister = None  # answered short: no leader it could reach
                continue
            key = (tp.topic, tp.partition)
            self._latest[key] = max(offset, self._latest.get(key, -1))

    def abandon(self) -> None:
        """Stop asking; forget a request in flight (its answer is not needed any more)."""
        self._pending = None
        self._asked_at = float("inf")

    def high(self, tp: TP) -> int | None:
        """The latest offset the broker gave for tp, if any."""
        return self._latest.get(tp)

    def forget(self, tps: Iterable[TP]) -> None:
        """Partitions no longer held: a later owner's answer must not be mixed with ours."""
        for tp in tps:
            self._latest.pop(tp, None)
