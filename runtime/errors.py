"""The one error hierarchy. Every message says what is wrong and what to do about it.

Exit codes of ``ringmaster run`` (the systemd unit keeps 2 and 3 from restarting):

====  =====================================================================================
0     stopped cleanly (SIGTERM, or caught up with ``--until-caught-up``)
1     an internal error (a bug: the log has the traceback)
2     the configuration is invalid
3     the plugin cannot start: its import or ``setup()`` failed, as the worker reported
      before it ever became ready, on the daemon's first start
4     shared memory cannot be created
5     the Kafka client reported a fatal error
6     workers die during start-up without saying why (a crash loop before any was ready)
7     ``--until-caught-up`` found partitions blocked at a failing record (no dead-letter topic)
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


class KafkaError(RingmasterError):
    """The Kafka client reported a fatal error."""

    exit_code = 5


class WorkerCrashLoop(RingmasterError):
    """Workers die before becoming ready, again and again, without reporting why."""

    exit_code = 6


class PartitionsBlocked(RingmasterError):
    """A batch run (``--until-caught-up``) ended with partitions stopped at a failing record."""

    exit_code = 7


class FrameError(RingmasterError):
    """A frame on a ring or a result pipe could not be decoded."""


class RingFull(RingmasterError):
    """Backpressure: the ring has no room for this frame now (not a failure)."""


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


class DeliveryFailed(BatchDeferred):
    """Outputs or dead letters could not be delivered (broker away, topic missing or refusing,
    delivery timeout): not the record's fault. The batch is retried after a back-off, its
    partition paused meanwhile, and nothing of it is committed."""

    cause = "delivery"


class OutputRejected(RingmasterError):
    """The broker or the client refuses one output for what it is (too large, invalid for
    the topic): the record that produced it is at fault, like a plugin exception."""
