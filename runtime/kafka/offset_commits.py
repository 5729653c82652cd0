"""Offsets committed to the group: what the group consumer's commit() does, and what the broker
answered (GroupConsumer delegates here; one job of the member, kept apart from fetching and
positions).

Asynchronous commits are fire and forget; a refusal comes back through librdkafka's
on_commit and is sent again by the supervisor (take_refused). A synchronous commit (a
revocation, a stop) says per partition whether the broker has the offset, and waits at most
its timeout: outside a rebalance callback on a helper thread, abandoned (the client then
``wedged``) when the broker never answers.

Runs in: supervisor (and the redrive's member); commit() inside a rebalance callback too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka import KafkaError as _CKError

from runtime.backoff import backoff_s
from runtime.kafka import coordinator
from runtime.kafka.client_log import same_line
from runtime.tp import TP

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What one commit call came to. Asynchronous: only whether it was sent (the broker's
    answer comes later, through on_commit: refused offsets are taken with
    take_refused_commits). Synchronous: the broker's answer, per partition."""

    sent: bool
    refused: dict[TP, str] = field(default_factory=dict)  # synchronous: partition -> why
    # Synchronous: those of ``refused`` that a moving or loading group coordinator refused
    # (runtime/kafka/coordinator.py) after the commit asked again until its time was half gone.
    busy: frozenset[TP] = frozenset()

    @property
    def ok(self) -> bool:
        return self.sent and not self.refused


class OffsetCommits:
    """The member's commits on ``client``, and the broker's answers."""

    def __init__(self, client: Consumer) -> None:
        self._c = client
        self._refused: dict[TP, int] = {}
        self.acknowledged: dict[TP, int] = {}  # the last offset the broker acknowledged, per partition
        # A synchronous commit that never returned holds the client: every call on it would
        # wait behind that one (measured: consume, pause, get_watermark_offsets all block).
        self.wedged: str | None = None
        self.abandoned = False  # a synchronous commit gave up waiting for librdkafka

    def on_commit(self, err: _CKError | None, parts: list[TopicPartition]) -> None:
        """Runs in: consume()/commit(). Remember refused offsets so they are sent again:
        an asynchronous commit that fails (broker away, REBALANCE_IN_PROGRESS, ...) must
        not be forgotten, or the group lags behind what was done until the next record."""
        for p in parts:
            if err is not None or p.error is not None:
                self._refused[(p.topic, p.partition)] = p.offset
            elif p.offset >= 0:
                self.acknowledged[(p.topic, p.partition)] = p.offset
        if err is not None and err.code() != _CKError._NO_OFFSET:
            log.warning("commit refused; will retry", extra={
                "error": str(err), "partitions": len(parts), "throttle": f"commit refused {err.code()}"})

    def take_refused(self) -> dict[TP, int]:
        refused, self._refused = self._refused, {}
        return refused

    def commit(self, offsets: Mapping[TP, int], asynchronous: bool, timeout_s: float,
               consuming: bool, in_callback: bool) -> CommitResult:
        """Commit next-offsets. Never raises for commit errors (logged): an uncommitted offset
        is only a duplicate later, never a loss; but a synchronous commit says, per
        partition, whether the broker acknowledged it (``--until-caught-up`` exits 0 only
        then).

        A synchronous commit at a stop waits at most ``timeout_s``: librdkafka's has no
        timeout, and a broker that takes OffsetCommit requests without answering them kept it
        waiting for ever (librdkafka times a request out after socket.timeout.ms and sends it
        again), holding SIGTERM with it. It runs on a helper thread; one that does not return
        in time is abandoned (its partitions count as refused), the client is ``wedged`` (every
        call on it would wait behind the commit) and the process must end with os._exit, as
        after an abandoned close(). Inside a rebalance callback it cannot: the client is
        busy in consume() there, and a commit from another thread waits for that to return
        (measured), so a revocation's commit is the plain synchronous call, bounded only by
        librdkafka's request timeout (socket.timeout.ms) and retries.

        Outside a callback, partitions that a moving or loading group coordinator refused are
        committed again (runtime/kafka/coordinator.py): librdkafka finds the new coordinator
        but hands the refusal to the caller, and a final commit is the one that says whether
        the work is done."""
        if not offsets:
            return CommitResult(False)
        if not consuming or self.wedged:
            why = f"not sent: {self.wedged or 'the consumer is not consuming'}"
            return CommitResult(False, {tp: why for tp in offsets})
        parts = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        if asynchronous:
            try:
                self._c.commit(offsets=parts, asynchronous=True)
            except KafkaException as exc:
                error = str(exc.args[0])
                log.warning("commit failed", extra={"error": error, "partitions": len(parts),
                                                    "throttle": f"commit failed {same_line(error)}"})
                return CommitResult(False)
            return CommitResult(True)
        if in_callback:
            answer: list[Any] = []
            try:
                answer.append(self._c.commit(offsets=parts, asynchronous=False))
            except KafkaException as exc:
                answer.append(exc)
            return self._answered(answer[0], offsets)
        return self._commit_sync(offsets, timeout_s)

    def _commit_sync(self, offsets: Mapping[TP, int], timeout_s: float) -> CommitResult:
        """A synchronous commit outside a callback, sent again for the partitions a busy group
        coordinator refused. A new attempt starts only while half of ``timeout_s`` is left, so
        each has that long to be answered: a healthy broker is never abandoned (wedging the
        client) just because an earlier attempt found its coordinator loading."""
        deadline = time.monotonic() + timeout_s
        pending = dict(offsets)
        refused: dict[TP, str] = {}
        sent, refusals = False, 0
        while True:
            answer = self._commit_once(pending, max(deadline - time.monotonic(), 0.0))
            if answer is None:
                self.abandoned = True
                self.wedged = (f"a commit got no answer from the broker within {timeout_s:g} s and holds the "
                               "Kafka client; stopping (a new start makes a new client)")
                log.error("the broker did not answer a commit in time; going on without it",
                          extra={"timeout_s": timeout_s, "partitions": len(pending)})
                why = f"no answer from the broker within {timeout_s:g} s"
                return CommitResult(True, {**refused, **dict.fromkeys(pending, why)})
            result = self._answered(answer, pending)
            sent = sent or result.sent
            refused.update({tp: why for tp, why in result.refused.items() if tp not in result.busy})
            busy = {tp: result.refused[tp] for tp in result.busy}
            wait = backoff_s(coordinator.FIRST_WAIT_S, refusals, coordinator.MAX_WAIT_S)
            if not busy or deadline - (time.monotonic() + wait) < timeout_s / 2:
                return CommitResult(sent, {**refused, **busy}, frozenset(busy))
            refusals += 1
            log.info("the group coordinator is busy; committing again", extra={
                "error": next(iter(busy.values())), "partitions": len(busy), "refusals": refusals,
                "throttle": "coordinator busy commit"})
            time.sleep(wait)
            pending = {tp: offsets[tp] for tp in busy}

    def _commit_once(self, offsets: Mapping[TP, int], timeout_s: float) -> Any:
        """One synchronous commit on a helper thread: its answer (the partitions, or the
        KafkaException), or None when none came within ``timeout_s``."""
        parts = [TopicPartition(t, p, off) for (t, p), off in offsets.items()]
        answer: list[Any] = []

        def commit_sync() -> None:
            try:
                answer.append(self._c.commit(offsets=parts, asynchronous=False))
            except KafkaException as exc:
                answer.append(exc)

        helper = threading.Thread(target=commit_sync, name="kafka-commit", daemon=True)
        helper.start()
        helper.join(timeout_s)
        return answer[0] if answer else None

    def _answered(self, answer: Any, offsets: Mapping[TP, int]) -> CommitResult:
        """A synchronous commit's answer: a KafkaException, or the partitions with their errors."""
        if isinstance(answer, KafkaException):
            error = str(answer.args[0])
            log.warning("commit failed", extra={"error": error, "partitions": len(offsets)})
            return CommitResult(False, dict.fromkeys(offsets, error),
                                frozenset(offsets) if coordinator.is_busy(answer) else frozenset())
        refused, busy = {}, set()
        for p in answer or []:
            tp = (p.topic, p.partition)
            if p.error:
                refused[tp] = str(p.error)
                if coordinator.is_busy(p.error):
                    busy.add(tp)
            else:
                self.acknowledged[tp] = p.offset
        if refused:
            log.warning("commit failed for some partitions",
                        extra={"error": next(iter(refused.values())), "partitions": len(refused)})
        return CommitResult(True, refused, frozenset(busy))

