"""Real consumed messages, byte for byte as a producer wrote them, without a broker process:
librdkafka's built-in mock cluster (``test.mock.num.brokers``, shipped inside confluent-kafka)
takes the Produce requests of tests/wire.py, and a confluent-kafka consumer reads them back.

This is how unit tests and the fuzzer get ``Message`` objects that confluent-kafka cannot
build by itself: a header name that is not UTF-8 makes ``headers()`` raise SystemError (and
cache a list holding a tuple whose name is NULL), exactly as on a real broker.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence

from confluent_kafka import Consumer, Message, Producer, TopicPartition
from wire import RawRecord, produce_raw

_cluster: Producer | None = None  # keeps the mock cluster alive for the process
_bootstrap = ""
_topics = itertools.count()


def bootstrap() -> str:
    global _cluster, _bootstrap
    if _cluster is None:
        _cluster = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "", "log_level": 0})
        meta = _cluster.list_topics(timeout=10)
        broker = next(iter(meta.brokers.values()))
        _bootstrap = f"{broker.host}:{broker.port}"
    return _bootstrap


def consumed(records: Sequence[RawRecord], log_append_time: bool = False,
             timeout_s: float = 20.0) -> list[Message]:
    """The records as a consumer gets them (one partition, in order), each a fresh Message
    whose methods were never called."""
    boot = bootstrap()
    topic = f"wire-{next(_topics)}"
    produce_raw(boot, topic, 0, records, log_append_time)
    c = Consumer({"bootstrap.servers": boot, "group.id": "mockwire", "enable.auto.commit": False,
                  "log_level": 0})
    out: list[Message] = []
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while len(out) < len(records):
            if time.monotonic() > deadline:
                raise AssertionError(f"the mock cluster gave back {len(out)} of {len(records)} records")
            out += [m for m in c.consume(len(records) - len(out), 0.2) if m.error() is None]
    finally:
        c.close()
    return out
