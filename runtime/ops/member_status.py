"""Each member's status record on the group's status topic: what ``ringmaster console`` shows of
every member on every host, without reaching their admin ports. Runs in: the supervisor (one
record every ``control.status_interval_s``, and a last one when it stops); the console (reading).

    supervisor: status snapshot (every supervisor.status_interval_s)
        ─▶ StatusPublisher.offer: due? render once (JSON) ─▶ producer (async, never waited for)
        ─▶ status topic _ringmaster.status.<group>, key = member id ─▶ ringmaster console

The topic (``control.status_topic``) is created when missing, one partition, compacted *and*
deleted: compaction keeps the last record of every member (a member that stopped is shown as
stopped, one that vanished as gone), ``min.compaction.lag.ms`` keeps the last hour whole for the
console's plots, and ``retention.ms`` forgets members a day after their last word.

The record is a small JSON document (``render``), rendered once per publication, as the admin
endpoint renders its answers once per snapshot. Publishing never blocks the supervisor's loop
and never stops the daemon: a record the client cannot queue is dropped (the next one says it
all again), a failure is logged once a minute. Its cost is measured where it is spent (the
thread CPU time of ``offer``) and carried in the record itself (``publish_cpu_s``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.config import Settings
from runtime.errors import RingmasterError
from runtime.kafka.admin import create_topic
from runtime.kafka.properties import consumer_properties
from runtime.ops.status import OperationStatus, StatusSnapshot

log = logging.getLogger("ringmaster.status")

FORMAT = 1  # the record's "format": a reader skips records of a format it does not know
TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "min.compaction.lag.ms": str(3600 * 1000),  # the console's history: an hour kept whole
    "retention.ms": str(24 * 3600 * 1000),  # a member's last word, a day after it
    "segment.ms": str(3600 * 1000),  # segments close hourly, so both apply
}
_WARN_EVERY_S = 60.0


def status_topic(settings: Settings) -> str:
    return settings.control.status_topic_for(settings.kafka.group_id)


def ensure_status_topic(settings: Settings) -> None:
    """Create the status topic unless it exists. KafkaUnreachable or KafkaError, one line."""
    create_topic(consumer_properties(settings), status_topic(settings), 1,
                 settings.control.replication_factor, TOPIC_CONFIG, what="status topic",
                 timeout_s=settings.kafka.connect_timeout_s)


def member_id(pid: int | None = None) -> str:
    """``host:pid``: one daemon of the group, the key of its status records."""
    return f"{socket.gethostname()}:{pid or os.getpid()}"


@dataclass(frozen=True)
class Extra:
    """What the record carries beside the snapshot: the configuration's guarantee and group type,
    how far the member read the control topic, and its answers to commands."""

    guarantee: str
    group_type: str
    control_read_to: int | None = None
    commands: list[dict[str, Any]] = field(default_factory=list)


def render(snap: StatusSnapshot, member: str, interval_s: float, extra: Extra, publish_cpu_s: float) -> bytes:
    """The record's value: the snapshot's parts an operator looks at, compact (each partition
    and worker a few numbers; no revocation list, no librdkafka statistics)."""
    doc = {
        "format": FORMAT, "member": member, "host": member.rpartition(":")[0], "pid": snap.pid,
        "group": snap.group, "taken_at": round(snap.taken_at, 3), "started_at": round(snap.started_at, 3),
        "interval_s": interval_s, "ready": snap.ready,
        "stopped": None if snap.stopped is None else {
            "code": snap.stopped.code, "reason": snap.stopped.reason, "at": round(snap.stopped.at, 3)},
        "guarantee": extra.guarantee, "group_type": extra.group_type, "ordering": snap.ordering,
        "plugin": snap.plugin, "plugin_version": snap.plugin_version,
        "generation": max((w.generation for w in snap.workers), default=0),
        "records": snap.records, "outputs": snap.outputs, "dead_letters": snap.dead_letters,
        "batches": snap.batches, "rate": snap.recent_rate, "lag": snap.lag, "restarts": snap.restarts,
        "rebalances": snap.rebalances, "paused": snap.paused, "supervisor_rss": snap.supervisor_rss,
        "supervisor_cpu_s": snap.supervisor_cpu_s, "publish_cpu_s": round(publish_cpu_s, 6),
        "workers_target": snap.workers_target, "workers_max": snap.workers_max,
        "partitions": [{"topic": p.topic, "partition": p.partition, "lag": p.lag, "rate": p.rate,
                        "records": p.records, "dead_letters": p.dead_letters, "committed": p.committed,
                        "high": p.high, "worker": p.worker, "paused": p.paused, "reasons": p.pause_reasons,
                        "oldest_s": p.oldest_unprocessed_s} for p in snap.partitions],
        "over_capacity": [o["tp"] for o in snap.over_capacity],
        "workers": [{"index": w.index, "pid": w.pid, "alive": w.alive, "state": w.state, "busy_s": w.busy_s,
                     "records": w.records, "rss": w.rss, "restarts": w.restarts, "generation": w.generation,
                     "version": w.plugin_version} for w in snap.workers],
        "operator_pauses": [{k: p.get(k) for k in ("scope", "key", "by", "since_ms", "until_ms")}
                            for p in snap.operator_pauses],
        "reload": _operation(snap.reload), "scale": _operation(snap.scale),
        "control_read_to": extra.control_read_to, "commands": extra.commands,
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def _operation(op: OperationStatus | None) -> dict[str, Any] | None:
    return None if op is None else {"state": op.state, "message": op.message, "by": op.requested_by}


class Sender(Protocol):
    """What the publisher needs of runtime.kafka.producer.OutputProducer (tests fake it)."""

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: list[tuple[str, bytes | None]] | None = None, on_delivery: Any = None,
                queue_wait_s: float = 30.0, partition: int | None = None) -> None: ...
    def poll(self, timeout_s: float = 0.0) -> None: ...
    def flush(self, timeout_s: float) -> int: ...


class StatusPublisher:
    """Publishes this member's status record every ``interval_s`` (and the final one at once).
    ``offer`` runs in the supervisor's loop, with each snapshot."""

    def __init__(self, topic: str, sender: Sender, interval_s: float, extra: Callable[[], Extra],
                 member: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.sender = sender
        self.interval_s = interval_s
        self.extra = extra
        self.member = member or member_id()
        self.clock = clock
        self._last = float("-inf")
        self._warned_at = float("-inf")
        self.published = 0
        self.failed = 0
        self.cpu_s = 0.0  # thread CPU time spent in offer(): rendering, queueing, serving callbacks

    def offer(self, snap: StatusSnapshot) -> None:
        now = self.clock()
        if snap.stopped is None and now - self._last < self.interval_s:
            return
        started = time.thread_time()
        self._last = now
        try:
            value = render(snap, self.member, self.interval_s, self.extra(), self.cpu_s)
            self.sender.produce(self.topic, value, self.member.encode(), on_delivery=self._delivered,
                                queue_wait_s=0.0)
            self.published += 1
        except RingmasterError as exc:  # the local queue is full (an outage): the next one says it all
            self._failed(str(exc))
        self.sender.poll(0)
        self.cpu_s += time.thread_time() - started

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self._failed(str(err))

    def _failed(self, why: str) -> None:
        self.failed += 1
        now = self.clock()
        if now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            log.warning("cannot publish the status record; carrying on", extra={
                "topic": self.topic, "error": why, "failed": self.failed})

    def close(self, timeout_s: float = 2.0) -> None:
        """Deliver what is queued (the final record), for at most timeout_s."""
        self.sender.flush(timeout_s)
