"""Who to hurt on a cluster: a partition's leader, a group's coordinator, a transactional id's
coordinator, a share partition's coordinator. Asked of the cluster's metadata, computed as
the broker computes them (BROKER.md): each coordinator is the leader of the partition of its
internal topic that its key hashes to, ``abs(String.hashCode()) % partitions`` in Java."""

from __future__ import annotations

import base64

from confluent_kafka.admin import AdminClient

OFFSETS = "__consumer_offsets"
TRANSACTIONS = "__transaction_state"
SHARE_STATE = "__share_group_state"


def java_hash(text: str) -> int:
    """Java's ``String.hashCode()``: UTF-16 code units, 31 × h + c, as a signed 32-bit int."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode()) % partitions`` (abs of MIN_VALUE is 0 there)."""
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class Who:
    """Lookups against one cluster (``props``: a client's properties, bootstrap.servers in them)."""

    def __init__(self, props: dict[str, str]) -> None:
        self._admin = AdminClient({**props, "log_level": 2})

    def leader_of(self, topic: str, partition: int) -> int:
        """The node id of the partition's leader now (-1: none, an election under way)."""
        meta = self._admin.list_topics(topic, timeout=10)
        return int(meta.topics[topic].partitions[partition].leader)

    def replicas_of(self, topic: str, partition: int) -> tuple[list[int], list[int]]:
        """(replicas, in-sync replicas) of a partition."""
        p = self._admin.list_topics(topic, timeout=10).topics[topic].partitions[partition]
        return list(p.replicas), list(p.isrs)

    def _internal_leader(self, topic: str, key: str) -> int:
        parts = self._admin.list_topics(topic, timeout=10).topics[topic].partitions
        if not parts:
            raise LookupError(f"{topic} does not exist yet (no group, transaction or share group used it)")
        return int(parts[partition_for(key, len(parts))].leader)

    def group_coordinator(self, group: str) -> int:
        """The node coordinating a group (classic, KIP-848 or share group)."""
        return self._internal_leader(OFFSETS, group)

    def transaction_coordinator(self, transactional_id: str) -> int:
        return self._internal_leader(TRANSACTIONS, transactional_id)

    def share_coordinator(self, group: str, topic: str, partition: int) -> int:
        """The node keeping a share partition's state (KIP-932: ``group:topicId:partition``)."""
        [description] = self._admin.describe_topics(_topics([topic])).values()
        uuid = description.result(10).topic_id
        # Java's Uuid.toString(): the 16 bytes in URL-safe base64, without padding.
        raw = b"".join((bits & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
                       for bits in (uuid.get_most_significant_bits(), uuid.get_least_significant_bits()))
        topic_id = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        return self._internal_leader(SHARE_STATE, f"{group}:{topic_id}:{partition}")


def _topics(names: list[str]) -> object:
    from confluent_kafka import TopicCollection

    return TopicCollection(names)
