"""What a redrive does with a letter it takes: send the record to its source topic, run it
through the plugin, or (a dry run) only count it. Runs in: the CLI (``ringmaster redrive``),
one thread; with ``--through-plugin`` the plugin runs here too.

Every action reports an :class:`Outcome` per letter only once the broker acknowledged what the
letter became (its copy, the plugin's outputs and, for a record that fails again, its new dead
letter): the engine commits nothing past a letter before that (at-least-once). An outage
(``DeliveryFailed``, a delivery timing out) is nobody's fault and never passes a letter over:
the action sets ``error`` and the run stops, its progress committed up to the last
acknowledged letter, to be run again.
"""

from __future__ import annotations

import enum
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.errors import BatchDeferred, DeliveryFailed, OutputRejected
from runtime.execution.acked import Acknowledged, acknowledged, raise_settled
from runtime.execution.deadletter_format import DeadLetter, reference_dead_letter
from runtime.execution.routing import OutputRoute, with_version
from runtime.execution.run import Failure, RetryPolicy, run_batch
from runtime.kafka.producer import OutputProducer, is_record_error
from runtime.kafka.topic_reader import Stored
from runtime.plugin import Output, Plugin, Record, backoff_wait
from runtime.redrive.letters import Letter, redriven_headers
from runtime.tp import TP, tp_label

log = logging.getLogger("ringmaster.redrive")



class Result(enum.Enum):
    REDRIVEN = "redriven"  # the copy is acknowledged (through the plugin: it went through)
    FAILED_AGAIN = "failed-again"  # through the plugin: failed again, its new dead letter acknowledged
    REFUSED = "refused"  # the broker refused the copy for what it is: passed over


@dataclass(frozen=True, slots=True)
class Outcome:
    tp: TP  # of the dead-letter topic
    offset: int
    error_type: str
    source_topic: str
    result: Result
    detail: str = ""


class Action(Protocol):
    error: str | None

    def submit(self, tp: TP, letter: Letter, record: Stored) -> None: ...
    def flush_pending(self) -> None: ...
    def poll(self) -> list[Outcome]: ...
    def settle(self, timeout_s: float) -> list[Outcome]: ...
    def forget(self, tps: Iterable[TP]) -> None: ...
    def close(self) -> None: ...


def _outcome(tp: TP, letter: Letter, result: Result, detail: str = "") -> Outcome:
    assert letter.source is not None
    return Outcome(tp, letter.offset, letter.error_type, letter.source.topic, result, detail)


class Count:
    """``--dry-run``: every letter taken counts as redriven; nothing is sent."""

    error: str | None = None

    def __init__(self) -> None:
        self._done: list[Outcome] = []

    def submit(self, tp: TP, letter: Letter, record: Stored) -> None:
        self._done.append(_outcome(tp, letter, Result.REDRIVEN))

    def flush_pending(self) -> None:
        pass

    def poll(self) -> list[Outcome]:
        done, self._done = self._done, []
        return done

    def settle(self, timeout_s: float) -> list[Outcome]:
        return self.poll()

    def forget(self, tps: Iterable[TP]) -> None:
        pass

    def close(self) -> None:
        pass


class ToSource:
    """The record goes back to the topic and partition it came from: the original key, value
    and headers, plus the raised redrive count. Produced asynchronously; ``poll`` serves the
    acknowledgements. The partition is the original one, not the partitioner's choice: the
    producer that first wrote the record may have used another partitioner (Java's murmur2
    against librdkafka's CRC-32), and a key's records must stay together."""

    def __init__(self, producer: OutputProducer, delivery_timeout_s: float) -> None:
        self._producer = producer
        self._timeout_s = delivery_timeout_s
        self._done: list[Outcome] = []
        self._in_flight = 0
        self.error: str | None = None

    def submit(self, tp: TP, letter: Letter, record: Stored) -> None:
        src = letter.source
        assert src is not None

        def delivered(err: Any, _msg: Any) -> None:
            """Runs in: producer poll/flush, on this thread."""
            self._in_flight -= 1
            if err is None:
                self._done.append(_outcome(tp, letter, Result.REDRIVEN))
                return
            self._producer.note(err)
            if is_record_error(err):
                self._done.append(_outcome(tp, letter, Result.REFUSED, f"{src}: {err}"))
            else:
                self.error = self.error or f"delivery to {src.topic}[{src.partition}] failed: {err}"

        self._in_flight += 1
        try:
            self._producer.produce(src.topic, record.value, record.key,
                                   redriven_headers(record.headers, letter.count + 1), on_delivery=delivered,
                                   queue_wait_s=self._timeout_s, partition=src.partition)
        except OutputRejected as exc:
            self._in_flight -= 1
            self._done.append(_outcome(tp, letter, Result.REFUSED, f"{src}: {exc}"))
        except DeliveryFailed as exc:
            self._in_flight -= 1
            self.error = self.error or str(exc)

    def flush_pending(self) -> None:
        pass

    def poll(self) -> list[Outcome]:
        self._producer.poll(0)
        if self._producer.broken and self.error is None:
            self.error = f"the producer hit a fatal error: {self._producer.fatal}"
        done, self._done = self._done, []
        return done

    def settle(self, timeout_s: float) -> list[Outcome]:
        """Wait (at most timeout_s) for every copy in flight to be acknowledged or refused, also
        after an outage: each copy acknowledged now is one the next run does not send again."""
        deadline = time.monotonic() + timeout_s
        while self._in_flight > 0 and time.monotonic() < deadline:
            self._producer.flush(min(0.5, max(0.0, deadline - time.monotonic())))
        if self._in_flight > 0 and self.error is None:
            self.error = f"{self._in_flight} redriven record(s) not acknowledged within {timeout_s:g} s"
        return self.poll()

    def forget(self, tps: Iterable[TP]) -> None:
        pass  # copies already sent are sent: a new owner of the partition may send them again

    def close(self) -> None:
        self._producer.flush(2.0)


@dataclass(frozen=True, slots=True)
class _Taken:
    tp: TP
    letter: Letter
    record: Record


class ThroughPlugin:
    """The records go through the configured plugin in this process, in batches of one source
    partition (as a worker gets them), through the same retries and bisection as a worker
    (runtime/execution/run.py). Outputs go to ``[output] topic`` (or their own topic); a
    record that fails again goes back to the dead-letter topic, its count kept
    (runtime/execution/deadletter_format.py carries it). A plugin's ``Backoff`` waits, then the
    same batch runs again; the wait ends early when the redrive is told to stop.

    Synchronous: a batch is run and everything it produced acknowledged before its outcomes
    are reported. The engine flushes the pending batch before it consumes or waits."""

    def __init__(self, plugin: Plugin, policy: RetryPolicy, producer_factory: Callable[[], OutputProducer],
                 output_topic: str | None, dead_letter_topic: str, max_message_bytes: int,
                 delivery_timeout_s: float, batch_max_records: int, backoff_s: float,
                 wait: Callable[[float], bool], version: str) -> None:
        self.plugin, self.policy = plugin, policy
        self.version = version  # on every output and dead letter, as a worker's
        self._factory = producer_factory
        self._producer = producer_factory()
        self.output_topic, self.dead_letter_topic = output_topic, dead_letter_topic
        self.max_message_bytes, self.delivery_timeout_s = max_message_bytes, delivery_timeout_s
        self.batch_max_records, self.backoff_s = batch_max_records, backoff_s
        self._wait = wait
        self.who = f"redrive-{os.getpid()}"
        self._pending: list[_Taken] = []
        self._done: list[Outcome] = []
        self.error: str | None = None
        self.outputs = 0
        self._route = OutputRoute(output_topic, counted_in="the summary")

    @property
    def discarded(self) -> int:
        """Outputs with no topic to go to, this run."""
        return self._route.discarded

    def submit(self, tp: TP, letter: Letter, record: Stored) -> None:
        src = letter.source
        assert src is not None
        rec = Record(src.topic, src.partition, src.offset, record.key, record.value,
                     redriven_headers(record.headers, letter.count + 1), record.timestamp)
        if self._pending and ((self._pending[-1].record.topic, self._pending[-1].record.partition)
                              != (rec.topic, rec.partition) or len(self._pending) >= self.batch_max_records):
            self.flush_pending()
        self._pending.append(_Taken(tp, letter, rec))

    def flush_pending(self) -> None:
        """Run the pending batch through the plugin and deliver what came out."""
        waits = 0
        # What a backed-off run of the batch had acknowledged, for its next run: valid while
        # the batch begins with the same records (a rebalance during the wait may change it).
        carried: tuple[list[Record], Acknowledged] | None = None
        while self._pending and self.error is None:
            batch = list(self._pending)
            records = [t.record for t in batch]
            acked = Acknowledged()
            if carried is not None and len(records) >= len(carried[0]) and all(
                    a is b for a, b in zip(records, carried[0], strict=False)):
                acked = carried[1]
            try:
                outcome = run_batch(self.plugin, records, self.policy, self.who,
                                    deliver=self._deliver, acked=acked)
                self._dead_letter(outcome.failures)
            except DeliveryFailed as exc:
                self.error = exc.reason
                return
            except BatchDeferred as d:  # the plugin's Backoff
                delay = backoff_wait(d.delay_s if d.delay_s is not None else self.backoff_s, waits)
                waits += 1
                acked.keep()
                carried = (records, acked)
                log.warning("plugin backing off; the batch runs again after the wait",
                            extra={"reason": d.reason, "wait_s": round(delay, 3), "records": len(batch)})
                if not self._wait(delay):
                    return  # told to stop: the batch stays unsettled, the next run redoes it
                continue  # the wait may have served a rebalance: pending is read again
            failed = {id(f.record) for f in outcome.failures}
            for t in batch:
                result = Result.FAILED_AGAIN if id(t.record) in failed else Result.REDRIVEN
                self._done.append(_outcome(t.tp, t.letter, result))
            self._pending = self._pending[len(batch):]

    # -- producing (as runtime/worker/batch_runner.py BatchRunner does, without shared memory) ----------
    def _deliver(self, outputs: list[Output]) -> None:
        """On failure the exception says which outputs the broker acknowledged (as a worker's
        does: runtime/execution/acked.py), so the retries do not write them again."""
        i = 0
        try:
            for i, out in enumerate(outputs):  # noqa: B007 (i: where a refusal stopped us)
                topic = self._route.topic(out)
                if topic is None:
                    continue
                self._producer.produce(topic, out.value, out.key, with_version(out.headers, self.version),
                                       queue_wait_s=self.delivery_timeout_s)
                self.outputs += 1
        except (OutputRejected, DeliveryFailed) as exc:
            raise_settled(outputs[:i], exc, self._deliver_or_renew, self._undelivered,
                          self._route.output_topic)
        try:
            self._deliver_or_renew()
        except (OutputRejected, DeliveryFailed) as exc:
            exc.acknowledged = acknowledged(outputs, self._undelivered(), self._route.output_topic)
            raise

    def _undelivered(self) -> list[Any] | None:
        return self._producer.undelivered

    def _deliver_or_renew(self) -> None:
        try:
            self._producer.deliver(self.delivery_timeout_s)
        except DeliveryFailed:
            if self._producer.broken:
                self._producer.discard()  # its threads and connections go with it (producer.py)
                self._producer = self._factory()
            raise

    def _dead_letter(self, failures: list[Failure]) -> None:
        if not failures:
            return
        letters = [f.dead_letter(self.who, self.max_message_bytes, self.version) for f in failures]
        try:
            self._write_letters(letters)
        except OutputRejected:
            # As a worker does: a letter refused for what it is goes as a reference record.
            try:
                self._write_letters([reference_dead_letter(letter, f.record.topic, f.record.partition,
                                                           f.record.offset)
                                     for f, letter in zip(failures, letters, strict=True)])
            except OutputRejected as exc:
                raise DeliveryFailed(f"the dead-letter topic {self.dead_letter_topic!r} refuses even a "
                                     f"reference record: {exc}") from None
        for f in failures:
            log.warning("redriven record failed again; dead-lettered with its count", extra={
                "tp": tp_label((f.record.topic, f.record.partition)), "offset": f.record.offset,
                "error": f"{f.error_type}: {f.message}"})

    def _write_letters(self, letters: list[DeadLetter]) -> None:
        for letter in letters:
            self._producer.produce(self.dead_letter_topic, letter.value, letter.key, letter.headers,
                                   queue_wait_s=self.delivery_timeout_s)
        self._deliver_or_renew()

    def poll(self) -> list[Outcome]:
        done, self._done = self._done, []
        return done

    def settle(self, timeout_s: float) -> list[Outcome]:
        return self.poll()  # synchronous: nothing is in flight outside flush_pending

    def forget(self, tps: Iterable[TP]) -> None:
        gone = set(tps)
        self._pending = [t for t in self._pending if t.tp not in gone]

    def close(self) -> None:
        self._producer.flush(2.0)
