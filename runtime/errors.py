"""The one error hierarchy. Every message says what is wrong and what to do about it.

Exit codes of ``ringmaster run`` (the systemd unit keeps 2 and 3 from restarting):

====  =====================================================================================
0     stopped cleanly (SIGTERM, or caught up with ``--until-caught-up``)
1     an internal error (a bug: the log has the traceback)
2     the configuration is invalid
3     the plugin cannot start: its import or ``setup()`` failed, as the worker reported
      before it ever became ready, on the daemon's first start
4     a resource of the host cannot be used: shared memory (too little, or none), a CPU other
      than x86-64 without the C speedups, the control socket's directory another user's
5     the Kafka client reported a fatal error
6     workers die during start-up without saying why (a crash loop before any was ready)
7     ``--until-caught-up`` found partitions blocked at a failing record (no dead-letter topic)
8     the Kafka cluster could not be reached within ``kafka.connect_timeout_s`` (``--until-caught-up``
      and the operator commands; the daemon itself waits for the cluster as long as it takes)
9     ``--until-caught-up`` ended before it caught up: a partition lost and not back, a commit
      the broker refused, no progress for ``supervisor.caught_up_timeout_s``, or a stop by
      signal first; one line names each partition left and the records left in it
13    ``admin.listen`` cannot be bound because its address is in use (another process, or
      this one's previous run, still holds the port) or not available yet: a condition that
      passes, so unlike 2 the systemd unit restarts it
14    the Kafka cluster refused the credentials (SASL authentication failed) or its TLS
      certificate is not trusted (``kafka.security``); not restarted by the systemd unit
====  =====================================================================================

Exit codes of ``ringmaster redrive``:

====  =====================================================================================
0     done: the redrive reached the end of the dead-letter topic as seen at its start (or
      ``--to``), or its group's cursor was there already; the summary says what was redriven
      and what was passed over, and why
1     an internal error (a bug: the log has the traceback)
2     the configuration or an option is invalid (no ``[dead_letter] topic``, a bad ``--from``)
3     ``--through-plugin``: the plugin cannot be imported or its ``setup()`` failed
5     Kafka: a fatal client error, a delivery that failed (an outage), a source record that
      could not be read, or the final commit was refused; progress is committed up to the last
      acknowledged letter: run it again
8     the Kafka cluster could not be reached within ``kafka.connect_timeout_s``
9     stopped before the end (SIGTERM, SIGINT), or another redrive of the same group holds the
      partitions; progress is committed: run it again to go on
14    the Kafka cluster refused the credentials or its certificate is not trusted
====  =====================================================================================

Exit codes of ``ringmaster reload`` and ``ringmaster scale`` (commands to a running daemon
over its control socket):

====  =====================================================================================
0     done: every worker runs the new plugin version / the pool has the size asked for
2     the configuration given to the command is invalid
10    the daemon refused or could not do it: a reload rolled back (the new version could not
      start; the daemon keeps its old code), a size above ``workers.max_processes``
11    no daemon answers at the control socket (not running, another config, no permission)
12    no answer within ``--timeout``: the operation may still finish (``ringmaster status``)
====  =====================================================================================
"""

from __future__ import annotations


class RingmasterError(Exception):
    """Base of every error the runtime raises on purpose."""

    exit_code = 1


class ConfigError(RingmasterError):
    """The configuration file or an environment override is invalid."""

    exit_code = 2


class PluginError(RingmasterError):
    """The plugin module cannot be imported, does not honour the contract, or cannot start."""

    exit_code = 3


class SharedMemoryError(RingmasterError):
    """Shared memory cannot be created (no space in /dev/shm, permissions...)."""

    exit_code = 4


class ControlDirUnusable(RingmasterError):
    """The control socket's default directory cannot be trusted (another user created it, or
    it is not private): a fault of the host, not of the config, so a service manager restarts
    the daemon (exit 4, as for shared memory) while the operator removes it."""

    exit_code = 4


class ArtifactMissing(RingmasterError):
    """Maven Central has no such artifact (runtime/dev/maven.py), as opposed to Maven failing
    to reach it: a caller may try another version."""


class KafkaError(RingmasterError):
    """The Kafka client reported a fatal error."""

    exit_code = 5


class KafkaUnreachable(KafkaError):
    """The Kafka cluster does not answer (nothing listens at bootstrap.servers, DNS, a network
    outage): not a bug and not the client's fatal error. A daemon waits for it; a batch run
    and the operator commands give up after ``kafka.connect_timeout_s``."""

    exit_code = 8


class KafkaAccessRefused(KafkaError):
    """The cluster answers but the client cannot get in: SASL authentication failed (a wrong
    user or password, an unknown mechanism) or the TLS handshake failed (the broker's
    certificate is not signed by a trusted CA, or not for its address). Not an outage: retrying
    with the same settings cannot succeed, so the commands stop at once with one line."""

    exit_code = 14


class AdminListenFailed(RingmasterError):
    """``admin.listen``'s address is in use or not available yet: not the configuration's
    fault (the same config works once the port is free), so not ConfigError's exit 2, which
    the systemd unit does not restart."""

    exit_code = 13


class WorkerCrashLoop(RingmasterError):
    """Workers die before becoming ready, again and again, without reporting why."""

    exit_code = 6


class PartitionsBlocked(RingmasterError):
    """A batch run (``--until-caught-up``) ended with partitions stopped at a failing record."""

    exit_code = 7


class InvalidControlRecord(RingmasterError):
    """A record of the control topic that is not a valid pause or resume (its key is not a
    scope, its value not the document ``ringmaster pause`` writes). Never stops anything: the
    reader logs it once and ignores it; it neither pauses nor resumes. ``kind`` groups alike
    problems in the log ("until_ms", "key", "value", ...)."""

    def __init__(self, problem: str, kind: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.kind = kind


class CommandFailed(RingmasterError):
    """The running daemon refused a command or could not carry it out (a reload rolled back)."""

    exit_code = 10


class DaemonUnreachable(RingmasterError):
    """No daemon answers at the control socket."""

    exit_code = 11


class CommandTimeout(RingmasterError):
    """The daemon did not answer a command in time; it may still carry it out."""

    exit_code = 12


class NotCaughtUp(RingmasterError):
    """A batch run (``--until-caught-up``) ended without every partition it held processed to
    its end and committed with the broker's acknowledgement (or handed over cleanly)."""

    exit_code = 9


class FrameError(RingmasterError):
    """A frame on a ring or a result pipe could not be decoded."""


class FrameTooLarge(RingmasterError):
    """A single frame can never fit in the ring, whatever the reader does."""


class BatchDeferred(RingmasterError):
    """The batch is neither done nor failed: it must be tried again later, in order, from its
    first record. Raised through the retry/bisect path untouched: deferring is not the
    records' fault, so it never counts towards dead-lettering.

    ``scope`` is ``"partition"`` (the batch's partition waits) or ``"all"`` (every partition
    of this supervisor waits)."""

    cause = "deferred"

    def __init__(self, reason: str, delay_s: float | None = None, scope: str = "partition") -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s
        self.scope = scope


class TransactionAborted(BatchDeferred):
    """Exactly-once: the batch's transaction was not committed (the broker refused its offsets
    because this member lost the partition or the group moved to a new generation, the
    producer was fenced by a newer one with its transactional id, the transaction timed out,
    or the broker was away). Nothing of it is visible to a read_committed reader; the batch
    is tried again from its first record, in a new transaction."""

    cause = "transaction"


class DeliveryFailed(BatchDeferred):
    """Outputs or dead letters could not be delivered (broker or leader away, delivery timeout,
    a topic the configuration names missing or refusing this client): not the record's fault
    (the classes: runtime/kafka/producer.py). The batch is retried after a back-off, its
    partition paused meanwhile, and nothing of it is committed."""

    cause = "delivery"

    # Which of the outputs given to the delivering call the broker acknowledged before it
    # failed (indices into that list), when the producer knows; None: unknown, none assumed
    # written (runtime/execution/acked.py). Set by whoever delivered, not by the producer.
    acknowledged: frozenset[int] | None = None


class WorkerExhausted(RingmasterError):
    """The worker process ran out of a per-process resource while running the plugin: file
    descriptors (EMFILE), the system's file table (ENFILE), memory (ENOMEM, MemoryError).
    The worker's fault, not the record's – typically a plugin that leaks – so it is never
    counted towards dead-lettering: the worker reports the batch as not done and exits, and
    the batch runs again on a fresh one (runtime/worker/batch_runner.py, supervisor/workers/workforce.py)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class OutputRejected(RingmasterError):
    """The broker or the client refuses one output for what it is (too large, invalid for
    the topic, an invalid topic name), or a topic the plugin routed it to refuses every
    message (missing, not authorised): the record that produced it is at fault, like a
    plugin exception (the classes: runtime/kafka/producer.py)."""

    acknowledged: frozenset[int] | None = None  # as DeliveryFailed.acknowledged


class RedriveIncomplete(RingmasterError):
    """``ringmaster redrive`` stopped before the end (a signal, or another redrive of its group
    holds the partitions); its progress is committed and a new run goes on from there."""

    exit_code = 9


class UnreadableRecord(RingmasterError):
    """A consumed record has a field the Kafka client cannot give us (a header name that is
    not UTF-8, which Go and C producers can write): raised by the frame packers, C and
    Python alike, naming the record by its ``index`` in the run handed to them. The record is
    the input's fault, not the packer's: the supervisor dead-letters it (or, without a
    dead-letter topic, stops its partition there) and packs the rest of its batch."""

    def __init__(self, index: int, field: str, cause: str) -> None:
        super().__init__(f"the Kafka client cannot read the {field} of record {index} of the run: {cause}")
        self.index = index
        self.field = field
        self.cause = cause
