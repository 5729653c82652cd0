"""Where each partition is read from: its start after an assignment, and again after a rewind.
Runs in: supervisor, at the loop's steps (runtime/supervisor/daemon/loop.py).

* **start** (``settle``): the group's callbacks run inside ``consume()``, and the partitions
  they touched start at their committed offset once it returns; a partition whose committed
  offset cannot be read now waits, held (``Partition.wait_for_start``), and its start is
  tried again with a back-off (``retry``).
* **rewind** (``read_again``): a partition rewound (a batch deferred by an outage or a
  plugin's Backoff, a partition blocked at a failing record, an operator pause;
  ``Partition.rewind``) is read again from its lowest unhandled offset once every batch of
  it that was out in the rings has come back. Not blocking: the loop goes on while the batch
  in progress finishes.

A release (revocation, loss, shutdown) lets go of a partition's work too, fenced: release.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping

from runtime.backoff import backoff_s
from runtime.kafka.consumer import Fetched
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.scheduling.scheduler import Scheduler
from runtime.supervisor.seams.consumer import Consumer
from runtime.tp import TP

# The first wait before a held partition's start is tried again, and the longest.
_SEEK_RETRY_S = 0.1
_SEEK_RETRY_MAX_S = 2.0

log = logging.getLogger("ringmaster.assignment")


class Starts:
    def __init__(self, consumer: Consumer, partitions: Mapping[TP, Partition], scheduler: Scheduler,
                 clock: Callable[[], float]) -> None:
        self.consumer = consumer
        self.partitions = partitions
        self.scheduler = scheduler
        self.clock = clock
        # Held partitions' starts are tried again with a back-off, not on every turn of the
        # loop: each try reads committed offsets from a coordinator that may be overloaded,
        # and librdkafka refuses the seek itself for as long as its own read of them is
        # unanswered (socket.timeout.ms, 60 s by default).
        self._seek_failures = 0
        self._seek_again_at = 0.0

    def settle(self, fetched: Fetched, touched: Collection[TP]) -> None:
        """RACE: rebalance callbacks run inside consume(), and the records it returns may
        straddle them (confluent-kafka-python#1013): a partition revoked and assigned again
        during one call gets records fetched under the old assignment (past the commit) and
        then records restarting at the committed offset. Drop what this call returned for
        every partition a callback touched (``touched``), and start the ones we now own at
        their committed offset; the seek also purges what librdkafka had queued for them. A
        partition whose committed offset cannot be read now waits (SEEKING) and is tried
        again."""
        if not touched:
            return
        _drop(fetched, touched)
        self._seek_to_start([tp for tp in touched if tp in self.partitions])

    def retry(self, fetched: Fetched) -> None:
        """Partitions waiting for their start, tried again once the back-off is over. RACE:
        the same straddle as ``settle``'s: what this tick's consume() returned for them was
        fetched from wherever librdkafka stood before the seek (a position the runtime never
        chose; issue 40's cluster, a coordinator moving). Taken once the start is found, it
        was cut before the records the seek brings, which then went backwards past it (a
        crash), or it skipped those below it (records never run). Dropped, as while they
        waited."""
        waiting = [tp for tp, p in self.partitions.items() if p.seeking]
        if waiting and self.clock() >= self._seek_again_at:
            _drop(fetched, waiting)
            self._seek_to_start(waiting)

    def _seek_to_start(self, tps: list[TP]) -> None:
        failed = set(self.consumer.seek_to_start(tps))
        if failed:
            wait_s = backoff_s(_SEEK_RETRY_S, self._seek_failures, _SEEK_RETRY_MAX_S)
            self._seek_again_at = self.clock() + wait_s
            self._seek_failures += 1
        else:
            self._seek_failures = 0
        for tp in tps:
            p = self.partitions[tp]
            if tp in failed:
                p.wait_for_start()
            elif p.started():
                log.info("partition start offset found", extra={"tp": p.label})

    def read_again(self) -> None:
        """Rewinding partitions whose batches are all back are read again (a seek refused by
        the client is tried again next tick)."""
        for p in list(self.partitions.values()):
            if p.rewinding and not self.scheduler.has_out(p.tp):
                p.read_again()


def _drop(fetched: Fetched, tps: Collection[TP]) -> None:
    """What consume() returned for ``tps``, records and ends, left out of ``fetched``."""
    for tp in tps:
        fetched.runs.pop(tp, None)
        fetched.eof.pop(tp, None)
    fetched.count = sum(len(r) for r in fetched.runs.values())
