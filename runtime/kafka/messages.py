"""What a message the consumer handed back is sure to carry, as types say it.

The client's stub types ``topic()``, ``partition()`` and ``offset()`` as Optional (a message
made by hand, or a client-level error event, has none), and ``headers()`` as what
``produce()`` accepts (a dict, str values). A fetched record and its partition's
end-of-partition event always have a topic, a partition and an offset, and consumed headers
are always a list of (name, bytes or None). Runs in: wherever a consumer reads.
"""

from __future__ import annotations

import functools
from typing import cast

from confluent_kafka import Message

from runtime.tp import TP
from runtime.transport import packing

Headers = list[tuple[str, bytes | None]]


@functools.cache
def bind_packer() -> None:
    """Tell the transport's packer the type of this client's messages (runtime/transport/packing.py
    reads them through its methods, from Python or C). Called by each consumer as it is made and
    by ``ringmaster check``, which reports the packer's path. Once per process (cached): a later
    call must not bring back a C path the packer gave up on."""
    packing.bind(Message)


def partition_of(m: Message) -> int:
    partition = m.partition()
    assert partition is not None, "a fetched record (or its partition's EOF) has a partition"
    return partition


def offset_of(m: Message) -> int:
    offset = m.offset()
    assert offset is not None, "a fetched record (or its partition's EOF) has an offset"
    return offset


def tp_of(m: Message) -> TP:
    topic = m.topic()
    assert topic is not None, "a fetched record (or its partition's EOF) has a topic"
    return topic, partition_of(m)


def headers_of(m: Message) -> Headers | None:
    return cast("Headers | None", m.headers())
