"""Outputs the cluster refused inside a batch's transaction, so that the batch's next
transaction dead-letters their records without producing them again (exactly-once, issue 44).

Under at-least-once a refused output fails its record like an exception: retried, bisected,
dead-lettered (runtime/kafka/producer.py has the classes). Inside a transaction the refusal
of a delivered message also fails the transaction (librdkafka: a transaction in which a
delivery failed can only be aborted), so its commit was refused, the batch deferred, and its
next run produced the same output into a new transaction, which failed alike: the partition
stuck for good. The runner remembers what was refused (a topic that refuses every message, or
one message by its topic, key and value: a failed message does not bring its headers back)
and refuses a matching output itself, before producing it: the record fails as it would have,
and nothing the cluster refused enters the new transaction.

Runs in: a worker, for the length of one batch (transactional.py).
"""

from __future__ import annotations

from runtime.errors import OutputRejected
from runtime.kafka.producer import Refusal


class KnownRefusals:
    def __init__(self) -> None:
        self._topics: dict[str, str] = {}
        self._messages: dict[tuple[str, bytes | None, bytes | None], str] = {}

    def __len__(self) -> int:
        return len(self._topics) + len(self._messages)

    def learn(self, refused: list[Refusal]) -> None:
        for r in refused:
            if r.whole_topic:
                self._topics.setdefault(r.topic, r.reason)
            else:
                self._messages.setdefault((r.topic, r.key, r.value), r.reason)

    def of(self, topic: str, key: bytes | None, value: bytes | None) -> OutputRejected | None:
        """The refusal an output to ``topic`` would meet, raised by the runner before producing."""
        why = self._topics.get(topic) or self._messages.get((topic, key, value))
        return None if why is None else OutputRejected(f"{why} (refused before, in an aborted transaction)")
