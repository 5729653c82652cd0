"""The user's librdkafka consumer properties as the Java Kafka client's, for Spark's own Kafka
source (``spark.source = "kafka"``), which runs the Java client on the driver and executors.

Connection and security properties are carried over (renamed where the names differ);
the local consumer's own tuning (queues, polling, group membership) means nothing to Spark's
source, which manages its consumers itself, and is left out. Anything else is refused by
name, so a setting the user relies on (a certificate, a login) is never dropped silently:
its Java equivalent goes in ``spark.kafka_options`` instead.
"""

from __future__ import annotations

from collections.abc import Mapping

Value = str | int | float | bool

# Same name and meaning in both clients.
_SAME = frozenset({
    "security.protocol", "sasl.mechanism", "client.id", "client.rack", "isolation.level",
    "fetch.min.bytes", "fetch.max.bytes", "max.partition.fetch.bytes", "request.timeout.ms",
    "receive.buffer.bytes", "send.buffer.bytes", "reconnect.backoff.ms", "reconnect.backoff.max.ms",
    "retry.backoff.ms", "metadata.max.age.ms", "connections.max.idle.ms",
    "socket.connection.setup.timeout.ms", "sasl.kerberos.service.name",
    "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
})
_RENAMED = {"sasl.mechanisms": "sasl.mechanism", "fetch.wait.max.ms": "fetch.max.wait.ms"}
# The local consumer's own tuning and group membership: Spark's source owns these.
_LOCAL_ONLY = frozenset({
    "auto.offset.reset", "enable.partition.eof", "fetch.queue.backoff.ms", "queued.max.messages.kbytes",
    "queued.min.messages", "max.poll.interval.ms", "session.timeout.ms", "heartbeat.interval.ms",
    "group.protocol", "group.remote.assignor", "partition.assignment.strategy", "group.instance.id",
    "statistics.interval.ms", "debug", "log_level", "log.connection.close", "socket.keepalive.enable",
    "topic.metadata.refresh.interval.ms", "api.version.request", "check.crcs", "fetch.error.backoff.ms",
    "coordinator.query.interval.ms", "enable.auto.commit", "enable.auto.offset.store",
    "auto.commit.interval.ms",
})
_LOGIN = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


def java_properties(librdkafka: Mapping[str, Value]) -> dict[str, str]:
    """The Java client properties for ``librdkafka`` (the user's ``kafka.consumer``).

    Raises ValueError naming the first property with no known Java equivalent. The isolation
    level defaults to librdkafka's (read_committed; the Java client's is read_uncommitted), so
    both sources read the same records of a transactional topic."""
    props: dict[str, str] = {"isolation.level": "read_committed"}
    for key, value in librdkafka.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in _LOCAL_ONLY or key in ("sasl.username", "sasl.password"):
            continue
        if key in _SAME:
            props[key] = text
        elif key in _RENAMED:
            props[_RENAMED[key]] = text
        elif key == "ssl.ca.location":
            props.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": text})
        elif key == "ssl.endpoint.identification.algorithm":
            props[key] = "" if text == "none" else text
        else:
            raise ValueError(f"{key} has no known equivalent in the Java client that Spark's Kafka source "
                             "runs: give its Java properties in spark.kafka_options (\"kafka.<property>\") "
                             "and remove it here, or use spark.source = \"python\"")
    if "ssl.keystore.location" in props:
        props["ssl.keystore.type"] = "PKCS12"  # librdkafka's keystore is always PKCS#12
    if "sasl.username" in librdkafka or "sasl.password" in librdkafka:
        mechanism = props.get("sasl.mechanism", "GSSAPI").upper()
        module = _LOGIN.get(mechanism)
        if module is None:
            raise ValueError(f"sasl.username/sasl.password with sasl.mechanism {mechanism}: only PLAIN "
                             "and SCRAM logins are translated; give kafka.sasl.jaas.config in "
                             "spark.kafka_options")
        user = _quoted(str(librdkafka.get("sasl.username", "")))
        password = _quoted(str(librdkafka.get("sasl.password", "")))
        props["sasl.jaas.config"] = f'{module} required username="{user}" password="{password}";'
    return props


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
