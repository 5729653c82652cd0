"""Where a reader of each partition reaches its end now: the end a batch run judges the group's
partitions by (``--until-caught-up``, runtime/kafka/group_offsets.py).

ListOffsets names the end, but not every broker answers it right: Tansu answers "latest"
with the last batch's base offset + 1, short of the end by the rest of that batch
(runtime/kafka/watermarks.py). A run that judged a partition it never fetched by that answer
exited 0 with most of it uncommitted (docs/brokers.md). So the answer is only where a reader
starts: it reads from there, under the consumer's isolation level, until librdkafka says the
partition is at its end, and the end is where the reader then stands (past any commit marker
and, under ``read_committed``, up to the last stable offset: an open transaction's records
are not work yet). Where ListOffsets is exact the reader starts at the end and reads only
what was written since. A partition written to all the time may never be at its end: it
ends at the high watermark of its first fetch once the reader passed it (``find``), so that
a topic written to all the time still ends.

One short-lived consumer per question, assigned (never subscribed: it joins no group and
commits nothing), run on a daemon thread and bounded by ``timeout_s``: a question left
unanswered at the stop keeps no process from exiting.

Runs in: supervisor (``ask`` returns a Future at once); the answer is found on its own thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _CKError

from runtime.kafka.messages import offset_of, tp_of
from runtime.kafka.side_readers import answer_on_thread, reader_properties
from runtime.tp import TP

log = logging.getLogger(__name__)


class ReadEnds:
    def __init__(self, props: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        # A short fetch wait: an idle partition's answer comes from a fetch the broker may hold
        # that long.
        self._props = reader_properties(props, "ringmaster-ends", {
            "enable.partition.eof": True, "fetch.wait.max.ms": 50})

    def ask(self, starts: Mapping[TP, int]) -> Future[dict[TP, int]]:
        """Future answer: partition -> its end, for a reader starting at ``starts`` (the
        broker's ListOffsets answer). A partition not at its end within the bound is left out
        (unknown)."""
        return answer_on_thread("kafka-read-ends", lambda: self.find(starts))

    def find(self, starts: Mapping[TP, int]) -> dict[TP, int]:
        """The answer, on the calling thread (at most ``timeout_s``, and the consumer's close).

        A partition's end is where the reader stands when librdkafka says it is at the end
        (the end-of-partition event). A partition written to faster than a fetch's wait never
        says so: it ends at the high watermark its first fetch answered, once the reader has
        passed it. One that did neither within the bound is left out, never judged by what
        was read of it: the bound may cut the reader in the middle of the last batch."""
        ends: dict[TP, int] = {}
        if not starts:
            return ends
        first_high: dict[TP, int] = {}  # the high watermark of each partition's first fetch
        c = Consumer(self._props)
        try:
            c.assign([TopicPartition(t, p, start) for (t, p), start in starts.items()])
            deadline = time.monotonic() + self.timeout_s
            while len(ends) < len(starts) and time.monotonic() < deadline:
                for m in c.consume(500, 0.1):
                    err = m.error()
                    if err is not None and err.code() != _CKError._PARTITION_EOF:
                        continue  # a client's or a partition's error: the bound decides
                    tp, offset = tp_of(m), offset_of(m)
                    if tp not in starts or tp in ends or offset < 0:
                        continue
                    if first_high.get(tp, -1) < 0:  # none yet, or a fetch that failed (-1)
                        first_high[tp] = c.get_watermark_offsets(TopicPartition(*tp), cached=True)[1]
                    if err is not None:
                        # The end-of-partition event carries where the reader stands: past the
                        # last record and anything skipped after it (markers, aborted records).
                        ends[tp] = max(offset, starts[tp])
                    elif 0 <= first_high[tp] <= offset + 1:
                        ends[tp] = max(offset + 1, starts[tp])
        except KafkaException as exc:
            log.debug("cannot read where the partitions end", extra={"error": str(exc)})
        finally:
            c.close()
        return ends
