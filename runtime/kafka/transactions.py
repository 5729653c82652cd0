"""Exactly-once (docs/exactly-once.md): a worker's batch in one Kafka transaction – its outputs,
its dead letters and its partition's next offset, committed with the consumer group's
metadata (KIP-447). Runs in: a worker.

* **One transactional id per worker slot** (``transactional_id``): a worker started again in
  the same slot calls ``init_transactions`` with its predecessor's id, which fences the
  predecessor and aborts the transaction it left open (a SIGKILL mid-batch), at once rather
  than after ``transaction.timeout.ms``.
* **Offsets through the group's metadata**: the broker checks the member and generation, so a
  worker of a member that lost the partition (revoked, session timed out while SIGSTOPped)
  cannot commit its offsets, and its transaction is aborted with them.
* **Already committed?** A worker killed after it asked the broker to commit, but before it
  reported, leaves its supervisor not knowing whether the batch is done; the batch comes back.
  So each batch starts by reading the partition's committed offset with ``require_stable``
  (librdkafka's default under read_committed: the broker answers once no transaction with
  offsets of that partition is open), and the records below it are done already
  (runtime/kafka/committed_offsets.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from runtime.errors import TransactionAborted
from runtime.tp import TP

# A batch's commit (its offsets sent into the transaction, then EndTxn) is two replicated
# writes on the coordinators: milliseconds, seconds on a loaded host. It gets this long, or the
# delivery timeout if shorter; past it the batch is aborted and runs again (an outage), and a
# worker blocked in it longer is librdkafka's hang (librdkafka#5511, #5456: the group
# coordinator's node gone), which the supervisor ends by killing the worker.
COMMIT_TIMEOUT_S = 5.0


def commit_timeout_s(delivery_timeout_s: float) -> float:
    return min(delivery_timeout_s, COMMIT_TIMEOUT_S)


def transactional_id(group: str, member: str, slot: int) -> str:
    """Stable across the worker's restarts in one slot of one member (see the module)."""
    return f"ringmaster-{group}-{member}-w{slot}"


# The client's calls can end in SystemError with its fatal error as the cause: confluent-kafka
# leaves a fenced producer's error pending (runtime/kafka/producer.py, _client_failed).
CLIENT_ERRORS = (KafkaException, SystemError)


def _reason(what: str, exc: BaseException) -> str:
    if isinstance(exc, SystemError):
        exc = exc.__cause__ or exc
    err = exc.args[0] if exc.args else exc
    text = err.str() if hasattr(err, "str") else str(err)
    return f"{what}: {text}"


class BatchTransactions:
    """One open transaction at a time on ``client`` (a producer with a transactional.id).
    Every failure raises TransactionAborted; the caller then replaces the producer (a new one
    with the same id fences this one and settles what it left open), so no state of a failed
    transaction outlives it."""

    def __init__(self, client: Producer, timeout_s: float, commit_timeout_s: float | None = None) -> None:
        """``timeout_s``: what starting and aborting a transaction may take;
        ``commit_timeout_s``: what its commit may take (default ``timeout_s``)."""
        self._p = client
        self.timeout_s = timeout_s
        self.commit_timeout_s = timeout_s if commit_timeout_s is None else commit_timeout_s
        try:
            self._p.init_transactions(timeout_s)
        except CLIENT_ERRORS as exc:
            raise TransactionAborted(_reason("cannot start transactions", exc)) from None

    def begin(self) -> None:
        try:
            self._p.begin_transaction()
        except CLIENT_ERRORS as exc:
            raise TransactionAborted(_reason("cannot begin a transaction", exc)) from None

    def commit(self, offsets: Mapping[TP, int], group_metadata: bytes) -> None:
        """Send ``offsets`` (the next offset to read, per partition) into the transaction and
        commit it, within the timeout (a retriable error of the commit is tried again). A
        failure is not aborted here: the caller replaces the producer, and the new one's
        init_transactions aborts what this one left open; an abort on top took up to two more
        timeouts, which the supervisor's bound on a commit had to allow for."""
        deadline = time.monotonic() + self.commit_timeout_s
        try:
            self._p.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in offsets.items()], group_metadata,
                self.commit_timeout_s)
            while True:
                try:
                    self._p.commit_transaction(max(0.1, deadline - time.monotonic()))
                    break
                except KafkaException as exc:
                    if not exc.args[0].retriable() or time.monotonic() >= deadline:
                        raise
        except CLIENT_ERRORS as exc:
            raise TransactionAborted(_reason("the batch's transaction was not committed", exc)) from None

    def abort(self) -> bool:
        """Abort the open transaction; True once librdkafka acknowledged it (the producer is
        ready for the next one). False: replace the producer (a new one with the same
        transactional id fences this one, and the broker aborts what it left open).

        After a broker stall the abort may need an epoch bump (KIP-360) that outlasts
        ``timeout_s``; librdkafka's contract is that an abort that timed out is called again
        until it succeeds before the next transaction begins. So a timed-out abort is asked
        again, once, and then the producer is given up rather than used half-aborted.
        """
        for _ in range(2):
            try:
                self._p.abort_transaction(self.timeout_s)
                return True
            except CLIENT_ERRORS as exc:
                err: Any = exc.args[0] if exc.args else None
                if not (hasattr(err, "retriable") and err.retriable()):  # SystemError's is a str
                    return False
        return False
