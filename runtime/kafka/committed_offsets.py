"""Exactly-once: a partition's committed offset, read by a worker before each batch
(runtime/worker/transactional.py) as a consumer of the group would read it at assignment:
``require_stable`` (librdkafka's default under read_committed), so never while a transaction
holding offsets of the partition is open. Runs in: a worker.

**Bounded, whatever librdkafka does.** While such a transaction is open the broker answers
UNSTABLE_OFFSET_COMMIT, and librdkafka asks again inside ``committed()`` with no bound of its
own until the transaction ends (an OffsetFetch retried without an absolute timeout, in
rd_kafka_handle_OffsetFetch); the call itself is bounded by the timeout it is given. Issue 40
still saw a worker more than 3 minutes inside ``rd_kafka_committed`` after a supervisor
SIGKILL on a three-node cluster, its partition behind. So the call runs on a thread of the
client's own, and the worker waits for it only until a hard deadline (the timeout and
``GRACE_S``). Past it the client is given up: a fresh one answers the next read, and the stuck
one is closed on its own thread once its call returns. The batch is deferred with the reason;
the supervisor runs it again after a back-off, and its bound on the worker's phase
(PHASE_OFFSETS, runtime/supervisor/workers/workforce.py) ends a worker that never came back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from runtime.errors import TransactionAborted, WorkerExhausted
from runtime.kafka.client_log import with_logger
from runtime.kafka.coordinator import until_answered
from runtime.tp import TP, tp_label

log = logging.getLogger("ringmaster.kafka")

# What a read may take past the timeout given to librdkafka before its client is given up: the
# call returns at its timeout in the ordinary case, a moment later on a loaded host.
GRACE_S = 5.0
# Clients given up and still stuck (each holds its threads and sockets) before the worker itself
# is replaced rather than leak another: WorkerExhausted, the batch runs again on a new worker.
MAX_STUCK = 3


class CommittedOffsets:
    """The group's committed offsets, by a client that never joins the group; one read at a
    time (a worker's)."""

    def __init__(self, props: Mapping[str, Any], new_client: Callable[[dict[str, Any]], Any] = Consumer,
                 grace_s: float = GRACE_S) -> None:
        """``new_client``: makes the client from its properties (tests give a fake)."""
        self._props = with_logger({**props, "isolation.level": "read_committed", "enable.auto.commit": False})
        self._new_client = new_client
        self.grace_s = grace_s
        self.given_up = 0  # clients given up, stuck in a call past its deadline
        self._stuck: list[Future[Any]] = []  # their calls, until they return
        self._c, self._calls = self._client()

    def _client(self) -> tuple[Any, ThreadPoolExecutor]:
        return self._new_client(self._props), ThreadPoolExecutor(1, thread_name_prefix="committed-offsets")

    def of(self, tp: TP, timeout_s: float) -> int | None:
        """The partition's committed offset (None: nothing committed), within ``timeout_s`` and
        ``grace_s``; TransactionAborted (the batch is deferred) if not, WorkerExhausted if more
        than MAX_STUCK clients given up are still stuck. A coordinator moving or
        loading (a node of the cluster killed, frozen or cut off) is asked again within
        ``timeout_s`` (runtime/kafka/coordinator.py)."""
        client = self._c
        call = self._calls.submit(self._read, client, tp, timeout_s)
        try:
            part = call.result(timeout_s + self.grace_s)
        except FutureTimeout:
            self._give_up(tp, timeout_s, call)
            raise TransactionAborted(
                f"the partition's committed offset was not read within {timeout_s + self.grace_s:g} s: "
                "the Kafka client did not return past its timeout (a transaction holding the "
                "partition's offsets still open, or the group coordinator not answering); the client "
                "is replaced and the batch runs again") from None
        except KafkaException as exc:
            raise TransactionAborted(_reason(exc)) from None
        if part.error is not None:
            raise TransactionAborted(f"cannot read the partition's committed offset: {_text(part.error)}")
        return part.offset if part.offset >= 0 else None

    @staticmethod
    def _read(client: Any, tp: TP, timeout_s: float) -> Any:
        deadline = time.monotonic() + timeout_s
        wanted = [TopicPartition(tp[0], tp[1])]
        [part] = until_answered(
            lambda: client.committed(wanted, timeout=max(0.1, deadline - time.monotonic())),
            timeout_s, "the partition's committed offset")
        return part

    def _give_up(self, tp: TP, timeout_s: float, stuck: Future[Any]) -> None:
        """Replace the client stuck in ``stuck``: its thread closes it once the call returns
        (queued behind it), and nothing waits for that. WorkerExhausted past MAX_STUCK still
        stuck."""
        old, calls = self._c, self._calls
        self.given_up += 1
        self._stuck = [f for f in self._stuck if not f.done()] + [stuck]
        if len(self._stuck) > MAX_STUCK:
            raise WorkerExhausted(f"{len(self._stuck)} Kafka clients stuck in committed() past their timeout")
        log.warning("the committed-offset read did not return past its deadline; replacing its client",
                    extra={"tp": tp_label(tp), "timeout_s": timeout_s, "given_up": self.given_up})
        calls.submit(old.close)
        calls.shutdown(wait=False)
        self._c, self._calls = self._client()

    def close(self) -> None:
        """Close the client in use, within ``grace_s`` (on its thread, after its read if one
        were still running: never, between a worker's batches)."""
        closing = self._calls.submit(self._c.close)
        self._calls.shutdown(wait=False)
        try:
            closing.result(self.grace_s)
        except FutureTimeout:
            log.warning("the committed-offset client did not close in time; leaving it",
                        extra={"timeout_s": self.grace_s})


def _text(err: Any) -> str:
    if isinstance(err, KafkaError):
        name = err.name()
        return f"{err.str()} ({name})" if name and name not in err.str() else err.str()
    return str(err)


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else exc
    return f"cannot read the partition's committed offset: {_text(err)}"
