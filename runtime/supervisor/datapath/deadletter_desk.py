"""Dead letters the supervisor writes itself: a record that fits in no ring, and a record
that keeps crashing workers. Runs in: supervisor.

Nothing here blocks the loop: a dead letter is produced asynchronously and its batch counts
as handled only when the broker acknowledged it (invariant 1) – ``poll()``, called every
tick, serves the delivery reports. A letter the broker refuses for what it is becomes a
reference record (runtime/execution/deadletter_format.py); one that cannot be delivered at all
(an outage) is sent again after a back-off, for as long as it takes, and its partition simply does not commit
past it meanwhile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.backoff import backoff_s
from runtime.errors import DeliveryFailed, OutputRejected
from runtime.execution.deadletter_format import (
    DeadLetter,
    dead_letter_headers,
    fit_dead_letter,
    reference_dead_letter,
)
from runtime.kafka.producer import OutputProducer, is_record_error
from runtime.tp import TP, tp_label

log = logging.getLogger("ringmaster.deadletters")


@dataclass(eq=False)
class _Letter:
    tp: TP
    batch_id: int
    offset: int
    letter: DeadLetter
    attempt: int = 0
    retry_at: float = 0.0
    in_flight: bool = False
    forgotten: bool = False  # its partition was released while it was in flight


class DeadLetterDesk:
    def __init__(self, topic: str, producer_factory: Callable[[], OutputProducer], max_message_bytes: int,
                 clock: Callable[[], float], backoff_s: float = 1.0, backoff_max_s: float = 30.0) -> None:
        self.topic = topic
        self._factory = producer_factory
        self._producer: OutputProducer | None = None
        self._max_bytes = max_message_bytes
        self._clock = clock
        self._backoff_s, self._backoff_max_s = backoff_s, backoff_max_s
        self._waiting: list[_Letter] = []
        self._done: list[tuple[TP, int]] = []
        self.last_error: str | None = None

    def submit(self, tp: TP, batch_id: int, row: tuple[int, bytes | None, bytes | None, Any],
               error_type: str, message: str, attempts: int = 1, plugin_version: str | None = None,
               delivery_count: int | None = None) -> None:
        """Queue the dead letter of one record; row is (offset, key, value, headers);
        ``plugin_version``: of the worker the record crashed (None: no plugin ran it);
        ``delivery_count``: a share group's record's (its ``ringmaster.delivery_count``)."""
        offset = row[0]
        letter = self.letter(tp, row, error_type, message, attempts, plugin_version,
                             delivery_count=delivery_count)
        self.submit_letter(tp, batch_id, offset, letter)
        log.error("record dead-lettered", extra={"tp": tp_label(tp), "offset": offset,
                                                 "error": f"{error_type}: {message}",
                                                 "form": letter.form})

    def submit_letter(self, tp: TP, batch_id: int, offset: int, letter: DeadLetter) -> None:
        """Queue a letter made already (``letter``), of the record at ``offset``."""
        self._waiting.append(_Letter(tp, batch_id, offset, letter))

    @property
    def max_bytes(self) -> int:
        """The largest letter the dead-letter topic takes (the producer's message.max.bytes)."""
        return self._max_bytes

    def letter(self, tp: TP, row: tuple[int, bytes | None, bytes | None, Any], error_type: str,
               message: str, attempts: int = 1, plugin_version: str | None = None,
               max_bytes: int | None = None, delivery_count: int | None = None) -> DeadLetter:
        """The dead letter of one record as the supervisor words it, in the first form that
        fits the topic's limit (or ``max_bytes``, when a frame must hold it: isolation.py);
        written here (submit) or, under exactly-once, by a worker's transaction (results.py)."""
        limit = self._max_bytes if max_bytes is None else max_bytes
        return supervisor_letter(tp, row, error_type, message, limit, attempts, plugin_version,
                                 delivery_count)

    def pending(self, tp: TP | None = None) -> int:
        return sum(1 for x in self._waiting if tp is None or x.tp == tp)

    def poll(self) -> list[tuple[TP, int]]:
        """Send what is due, serve delivery reports; return the (tp, batch_id) now handled."""
        now = self._clock()
        for x in list(self._waiting):  # a delivery report may remove one meanwhile
            if not x.in_flight and now >= x.retry_at:
                self._send(x)
        if self._producer is not None:
            self._producer.poll(0)
            if self._producer.broken:
                log.warning("dead-letter producer hit a fatal error; creating a new one",
                            extra={"error": self._producer.fatal})
                self._producer = None
                for x in self._waiting:
                    x.in_flight = False
        done, self._done = self._done, []
        return done

    def forget(self, tp: TP) -> None:
        """The partition was released: its letters are the next owner's to write."""
        for x in self._waiting:
            if x.tp == tp:
                x.forgotten = True
        self._waiting = [x for x in self._waiting if x.tp != tp]

    def _send(self, x: _Letter) -> None:
        if self._producer is None:
            self._producer = self._factory()
        x.in_flight = True
        x.attempt += 1
        try:
            self._producer.produce(self.topic, x.letter.value, x.letter.key, x.letter.headers,
                                   on_delivery=lambda err, _msg: self._delivered(x, err),
                                   queue_wait_s=0.0)
        except OutputRejected:
            self._refused(x, "the client refused it")
        except DeliveryFailed as exc:
            self._retry_later(x, str(exc))

    def _delivered(self, x: _Letter, err: Any) -> None:
        """Runs in: producer.poll(), on the supervisor's thread."""
        x.in_flight = False
        if err is not None and self._producer is not None:
            self._producer.note(err)
        if x.forgotten:
            # RACE: its partition was released while the letter was in flight. The record is
            # the next owner's (and may be ours again, under a new tracker): this report of
            # the old release completes nothing and is not retried.
            return
        if err is None:
            self._waiting.remove(x)
            self._done.append((x.tp, x.batch_id))
            self.last_error = None
        elif is_record_error(err) and x.letter.form != "reference":
            self._refused(x, str(err))
        else:
            self._retry_later(x, str(err))

    def _refused(self, x: _Letter, why: str) -> None:
        x.in_flight = False
        log.warning("dead letter refused for its size or content; writing a reference record",
                    extra={"tp": tp_label(x.tp), "offset": x.offset, "why": why})
        x.letter = reference_dead_letter(x.letter, x.tp[0], x.tp[1], x.offset)
        x.retry_at = 0.0

    def _retry_later(self, x: _Letter, why: str) -> None:
        x.in_flight = False
        delay = backoff_s(self._backoff_s, x.attempt - 1, self._backoff_max_s)
        x.retry_at = self._clock() + delay
        self.last_error = why
        log.warning("dead letter not delivered; will retry", extra={
            "tp": tp_label(x.tp), "offset": x.offset, "retry_in_s": round(delay, 2), "error": why})

    def close(self, timeout_s: float) -> None:
        if self._producer is not None:
            self._producer.flush(timeout_s)


def supervisor_letter(tp: TP, row: tuple[int, bytes | None, bytes | None, Any], error_type: str, message: str,
                      max_bytes: int, attempts: int = 1, plugin_version: str | None = None,
                      delivery_count: int | None = None) -> DeadLetter:
    """The dead letter of one record (``row``: offset, key, value, headers) as the supervisor
    words it, in the first form that fits ``max_bytes``; ``delivery_count``: a share group's."""
    offset, key, value, original = row
    headers = dead_letter_headers(original, error_type=error_type, message=message, traceback="",
                                  topic=tp[0], partition=tp[1], offset=offset, attempts=attempts,
                                  worker="supervisor", plugin_version=plugin_version,
                                  delivery_count=delivery_count)
    return fit_dead_letter(key, value, headers, max_bytes)
