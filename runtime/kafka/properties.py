"""The librdkafka properties each client is given, built from validated settings: ringmaster's
defaults, then the user's pass-through tables (kafka.consumer, kafka.producer), then
[kafka.security], then what the runtime owns for its guarantees. Every client the runtime
makes starts from these (the group and share consumers, the producers of the supervisor and
the workers, admin clients, the redrive, produce/tail, Spark).

Runs in: the CLI (``ringmaster check`` prints them), the supervisor, the redrive, Spark.
"""

from __future__ import annotations

from typing import Any

from runtime.config import (
    SECURITY_PROPERTIES,
    KafkaSecuritySettings,
    LibrdkafkaValue,
    Settings,
    group_protocol,
)


def security_properties(security: KafkaSecuritySettings) -> dict[str, LibrdkafkaValue]:
    """The librdkafka properties [kafka.security] stands for (only those set). The password
    is read again on each call: a client made after its file changed gets the new one."""
    values = {"protocol": security.protocol, "sasl_mechanism": security.sasl_mechanism,
              "username": security.username, "password": security.read_password(),
              "ca_location": security.ca_location}
    return {SECURITY_PROPERTIES[k]: v for k, v in values.items() if v is not None}


def consumer_properties(settings: Settings) -> dict[str, LibrdkafkaValue]:
    """librdkafka consumer config: our defaults, then the user's pass-through, then the
    properties the runtime must own for its guarantees (offsets are ours to store).

    The classic protocol gets cooperative-sticky assignment (a rebalance moves only the
    partitions that change owner); KIP-848's is incremental by design, with the broker's
    assignor."""
    props: dict[str, LibrdkafkaValue] = {
        "auto.offset.reset": "earliest",
        # Measured: the default 1000 ms backoff stalls fetching once the queue is full.
        "fetch.queue.backoff.ms": 10,
        "queued.max.messages.kbytes": 16384,
        # Flow control pauses and resumes partitions; a resumed partition is fetched only
        # after the fetch request in flight returns, which a broker may hold this long
        # (confluent-kafka-javascript#363 lowered it for the same reason). Measured with
        # 1 MiB rings: 37,915 records/s at librdkafka's 500 ms, 106,095 at 100 ms (docs/performance.md,
        # Tuning).
        "fetch.wait.max.ms": 100,
        "enable.partition.eof": True,
        # The supervisor calls consume() every few milliseconds whatever the plugin does
        # (only a revocation holds it, for at most revoke_timeout_s), so the default 300 s
        # only makes the group wait longer for a member that died mid-rebalance: brokers that
        # wait a dead member's rebalance timeout (the embedded one does) stall that long.
        "max.poll.interval.ms": max(60_000, int(settings.supervisor.revoke_timeout_s * 3000)),
    }
    if settings.workers.ordering == "partition":
        # A partition runs on one worker at a time, so a fetch response's run of 1 MiB per
        # partition (librdkafka's default, ~3,000 records of 256 bytes) is more than its worker
        # can start on soon, and consume() hands the client's queue out in the order the runs
        # landed: with 16 partitions over 15 workers, the last partitions' first records came
        # 45,000 records in, and the workers waited ~90 ms for them at 2 µs a record (the
        # simulator, issue 41). A quarter of that still keeps a worker fed: 256 KiB a round trip
        # is 33 MB/s at 8 ms.
        props["max.partition.fetch.bytes"] = 256 * 1024
    if group_protocol(settings.kafka.consumer) == "classic":
        props["partition.assignment.strategy"] = "cooperative-sticky"
    return _layered(settings, props, {"enable.auto.commit": False, "enable.auto.offset.store": False})


def producer_properties(settings: Settings) -> dict[str, LibrdkafkaValue]:
    """librdkafka producer config (every producer: outputs, dead letters, the redrive, the
    control topic): our defaults, then the user's pass-through, then [kafka.security]."""
    props: dict[str, LibrdkafkaValue] = {
        "linger.ms": 5, "enable.idempotence": True,
        # librdkafka fails a message it could not deliver in this time itself, so a batch
        # waiting for acknowledgements learns of an outage within output.delivery_timeout_s.
        "message.timeout.ms": int(settings.output.delivery_timeout_s * 1000),
    }
    if settings.output.guarantee == "exactly-once":
        # A batch's transaction lasts its processing and delivery; librdkafka refuses a
        # message.timeout.ms above it. What a killed worker left open is aborted by its
        # successor at once (the same transactional id), or after this long.
        props["transaction.timeout.ms"] = max(60_000, int(props["message.timeout.ms"]))
    props.update(settings.kafka.producer)
    props.update(security_properties(settings.kafka.security))
    props["bootstrap.servers"] = settings.kafka.bootstrap_servers
    return props


def share_consumer_properties(settings: Settings) -> dict[str, LibrdkafkaValue]:
    """librdkafka share consumer config: the user's pass-through, then [kafka.security], then
    what the runtime owns (acknowledgements are explicit: a record is accepted only when its
    outputs are delivered)."""
    # A poll is run whole before the next and must finish within the records' lock
    # (docs/share-groups.md): the broker hands out whole producer batches, up to about this.
    return _layered(settings, {"max.poll.records": 500}, {"share.acknowledgement.mode": "explicit"})


def _layered(settings: Settings, defaults: dict[str, LibrdkafkaValue],
             owned: dict[str, LibrdkafkaValue]) -> dict[str, LibrdkafkaValue]:
    """A group's consumer, in layers: our defaults (and the statistics interval), the user's
    kafka.consumer, [kafka.security], then the cluster, the group and what the runtime owns."""
    props = dict(defaults)
    if settings.admin.librdkafka_stats_s:
        props["statistics.interval.ms"] = int(settings.admin.librdkafka_stats_s * 1000)
    props.update(settings.kafka.consumer)
    props.update(security_properties(settings.kafka.security))
    props.update({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": settings.kafka.group_id,
                  **owned})
    return props


def effective_settings(settings: Settings) -> dict[str, Any]:
    """The settings as plain data, where ``kafka.consumer`` and ``kafka.producer`` are the
    properties the clients are really given: ringmaster's defaults, the file's and the
    environment's, and those the runtime owns. Secrets in clear: pass it through
    runtime.config.redacted before showing it."""
    data = settings.model_dump()
    data["kafka"]["consumer"] = dict(sorted(consumer_properties(settings).items()))
    data["kafka"]["producer"] = dict(sorted(producer_properties(settings).items()))
    return data
