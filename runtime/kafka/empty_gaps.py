"""Whether the offsets between a partition's committed offset and its end hold anything a reader
would be handed (``--until-caught-up``, runtime/kafka/group_offsets.py).

An input written by a transactional producer has offsets no record's commit covers: each
transaction's commit or abort marker, and, under ``read_committed``, the records of aborted
transactions. A member's last transaction commits the offset after its last record, short of
the end by the marker (and anything aborted after it). So a gap between the group's
committed offset and the end is done when a reader starting there, under the consumer's
isolation level, reaches the end without being handed a record: librdkafka moves a
partition's position past the control records and aborted records it drops.

One short-lived consumer per question, assigned (never subscribed: it joins no group and
commits nothing) at each gap's start, run on a daemon thread and bounded by ``timeout_s``: a
question left unanswered at the stop keeps no process from exiting.

Runs in: supervisor (``ask`` returns a Future at once); the answer is found on its own thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from runtime.kafka.messages import offset_of, tp_of
from runtime.kafka.side_readers import answer_on_thread, reader_properties
from runtime.tp import TP

log = logging.getLogger(__name__)

Gaps = Mapping[TP, tuple[int, int]]  # partition -> (committed offset, end)


class EmptyGaps:
    def __init__(self, props: Mapping[str, Any], timeout_s: float = 5.0) -> None:
        self.timeout_s = timeout_s
        self._props = reader_properties(props, "ringmaster-gaps", {"enable.partition.eof": False})

    def ask(self, gaps: Gaps) -> Future[dict[TP, bool]]:
        """Future answer: partition -> True (nothing a reader gets before the end), False (a
        record). A partition not answered within the bound is left out (unknown)."""
        return answer_on_thread("kafka-empty-gaps", lambda: self.find(gaps))

    def find(self, gaps: Gaps) -> dict[TP, bool]:
        """The answer, on the calling thread (at most ``timeout_s``, and the consumer's close)."""
        found: dict[TP, bool] = {}
        if not gaps:
            return found
        c = Consumer(self._props)
        try:
            c.assign([TopicPartition(t, p, start) for (t, p), (start, _) in gaps.items()])
            deadline = time.monotonic() + self.timeout_s
            while len(found) < len(gaps) and time.monotonic() < deadline:
                for m in c.consume(100, 0.1):
                    if m.error() is None and (tp := tp_of(m)) in gaps and offset_of(m) < gaps[tp][1]:
                        found[tp] = False  # a record a reader gets: work left
                open_ = [TopicPartition(t, p) for t, p in gaps if (t, p) not in found]
                for part in c.position(open_) if open_ else []:
                    tp = (part.topic, part.partition)
                    if part.offset >= gaps[tp][1]:
                        found[tp] = True
        except KafkaException as exc:
            log.debug("cannot tell whether the gaps hold records", extra={"error": str(exc)})
        finally:
            c.close()
        return found
