"""Kafka offsets for the Spark source: start, end and JSON forms.

Offsets travel as ``{"topic": {"partition": next_offset}}`` (JSON-safe strings as keys).

End offsets come from ListOffsets (``get_watermark_offsets``) by default: correct on Apache
Kafka. ``end_offsets = "fetch"`` instead reads each partition's high watermark from a fetch
response (the cached watermark), for brokers whose ListOffsets answer is wrong (the embedded
Tansu broker returns the base offset of the last batch). It is a switch, never the default.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from runtime.errors import RingmasterError

Offsets = dict[str, dict[str, int]]


def client(props: Mapping[str, Any]) -> Consumer:
    return Consumer({**props, "enable.auto.commit": False, "enable.partition.eof": True})


def partitions_of(c: Consumer, topics: Iterable[str], timeout_s: float = 30.0) -> list[tuple[str, int]]:
    out = []
    for topic in topics:
        md = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            raise RingmasterError(f"topic {topic!r} cannot be described: {md.error if md else 'missing'}")
        out.extend((topic, p) for p in sorted(md.partitions))
    return out


def earliest(c: Consumer, tps: Iterable[tuple[str, int]]) -> Offsets:
    return _pack({tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[0] for tp in tps})


def latest(c: Consumer, tps: list[tuple[str, int]], mode: str) -> Offsets:
    if mode == "list":
        return _pack({tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[1] for tp in tps})
    # "fetch": assign at the low watermark and wait until every partition returned a record
    # or an EOF event: only then does librdkafka's cached high watermark come from a fetch
    # response (before that it may hold the stale ListOffsets answer).
    lows = {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[0] for tp in tps}
    c.assign([TopicPartition(t, p, lows[(t, p)]) for t, p in tps])
    fetched: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 30
    while len(fetched) < len(tps) and time.monotonic() < deadline:
        for m in c.consume(1000, 0.2):
            fetched.add((m.topic(), m.partition()))
    highs = {tp: c.get_watermark_offsets(TopicPartition(*tp), cached=True)[1] for tp in fetched}
    c.unassign()
    if len(fetched) < len(tps):
        raise RingmasterError("no fetch response for some partitions within 30 s (end_offsets = \"fetch\")")
    return _pack(highs)


def committed(c: Consumer, tps: list[tuple[str, int]]) -> Offsets:
    try:
        parts = c.committed([TopicPartition(*tp) for tp in tps], timeout=30)
    except KafkaException as exc:
        raise RingmasterError(f"cannot read the group's committed offsets: {exc}") from None
    return _pack({(p.topic, p.partition): p.offset for p in parts if p.offset != OFFSET_INVALID})


def commit(c: Consumer, offsets: Offsets) -> None:
    """Commit as a simple (non-member) consumer of the group: accepted while the group has
    no active members (do not run `ringmaster run` on the same group at the same time)."""
    parts = [TopicPartition(t, int(p), o) for t, ps in offsets.items() for p, o in ps.items()]
    if parts:
        c.commit(offsets=parts, asynchronous=False)


def parse(spec: str, c: Consumer, tps: list[tuple[str, int]], mode: str) -> Offsets:
    """'earliest', 'latest', 'committed' (falling back to earliest), or a JSON object."""
    if spec == "earliest":
        return earliest(c, tps)
    if spec == "latest":
        return latest(c, tps, mode)
    if spec == "committed":
        base = earliest(c, tps)
        for t, ps in committed(c, tps).items():
            base.setdefault(t, {}).update(ps)
        return base
    try:
        given = json.loads(spec)
        return {str(t): {str(p): int(o) for p, o in ps.items()} for t, ps in given.items()}
    except (ValueError, AttributeError, TypeError):
        raise RingmasterError(f"offsets {spec!r}: expected earliest, latest, committed or JSON like "
                              '{"topic": {"0": 100}}') from None


def _pack(by_tp: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in by_tp.items():
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def total(start: Offsets, end: Offsets) -> int:
    return sum(max(0, o - start.get(t, {}).get(p, 0)) for t, ps in end.items() for p, o in ps.items())
