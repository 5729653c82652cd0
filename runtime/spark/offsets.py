"""Kafka offsets for the Spark source: start, end and JSON forms, and offset ranges.

Offsets travel as ``{"topic": {"partition": next_offset}}`` (JSON-safe strings as keys).

End offsets (``spark.end_offsets``): by default (``"checked"``) ListOffsets answers, then one
fetch at that answer per partition says whether records lie beyond it: the fetch response's
high watermark is the end (on Apache Kafka it is the same offset, and the fetch returns no
record; the embedded Tansu broker answers ListOffsets with the base offset of the last batch,
short of the end, and the fetch corrects it). So no broker's stale answer makes a batch run
stop short and report success. ``"list"`` trusts ListOffsets alone (no fetch); ``"fetch"``
fetches from the low watermark. Start offsets of partitions nobody has read yet are their low
watermark (ListOffsets "earliest", right on Tansu too), as in Spark's own Kafka source.

Every function that plans reading covers every partition it is given, or fails naming the
ones it cannot place: a partition is never skipped silently.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from runtime.backoff import backoff_s
from runtime.errors import RingmasterError
from runtime.kafka import coordinator

log = logging.getLogger("ringmaster.spark")

Offsets = dict[str, dict[str, int]]
Range = tuple[str, int, int, int]  # topic, partition, start, end (exclusive)
GROUP_TIMEOUT_S = 30.0  # reading or committing the group's offsets, a busy coordinator asked again
# Spark's conventions inside JSON offsets.
EARLIEST = -2
LATEST = -1
_JSON_FORM = 'JSON like {"topic": {"0": 100, "1": -2}} (-2: earliest, -1: latest)'


def client(props: Mapping[str, Any]) -> Consumer:
    return Consumer({**props, "enable.auto.commit": False, "enable.partition.eof": True})


def partitions_of(c: Consumer, topics: Iterable[str], timeout_s: float = 30.0) -> list[tuple[str, int]]:
    """Every partition of the topics, as the broker knows them now (call again to see new ones)."""
    out: list[tuple[str, int]] = []
    for topic in topics:
        md = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if md is None or md.error is not None:
            raise RingmasterError(f"topic {topic!r} cannot be described: {md.error if md else 'missing'}")
        out.extend((topic, p) for p in sorted(md.partitions))
    return out


def earliest(c: Consumer, tps: Iterable[tuple[str, int]]) -> Offsets:
    return _pack({tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[0] for tp in tps})


def latest(c: Consumer, tps: list[tuple[str, int]], mode: str) -> Offsets:
    """The end of every partition of ``tps`` (the offset after its last record), by ``mode``
    (the module docstring says how each finds it)."""
    listed = {tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[1] for tp in tps}
    if mode == "list" or not tps:
        return _pack(listed)
    # Assign, and wait until every partition returned a record or an EOF event: only then does
    # librdkafka's cached high watermark come from a fetch response (before that it may hold
    # the ListOffsets answer).
    wanted = set(tps)
    at = ({tp: c.get_watermark_offsets(TopicPartition(*tp), timeout=30)[0] for tp in tps} if mode == "fetch"
          else {tp: max(o, 0) for tp, o in listed.items()})
    c.assign([TopicPartition(t, p, at[(t, p)]) for t, p in tps])
    fetched: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 30
    try:
        while fetched != wanted and time.monotonic() < deadline:
            for m in c.consume(1000, 0.2):
                tp = (m.topic(), m.partition())
                if tp in wanted:  # a client-level error event names no partition
                    fetched.add(tp)
        highs = {tp: c.get_watermark_offsets(TopicPartition(*tp), cached=True)[1] for tp in fetched}
    finally:
        c.unassign()
    if fetched != wanted:
        raise RingmasterError(f"no fetch response within 30 s for {_names(wanted - fetched)} "
                              f'(spark.end_offsets = "{mode}"; "list" trusts ListOffsets alone)')
    if mode == "checked":
        stale = {tp: (listed[tp], highs[tp]) for tp in tps if highs[tp] > listed[tp]}
        if stale:
            log.info("the broker's ListOffsets answer is short of the end; the fetch's high watermark "
                     "is used", extra={"partitions": _names(stale), "example": next(iter(stale.values()))})
        highs = {tp: max(highs[tp], listed[tp]) for tp in tps}
    return _pack(highs)


def committed(c: Consumer, tps: list[tuple[str, int]]) -> Offsets:
    """The group's committed offsets, only for the partitions that have one. A coordinator
    that is moving or loading is asked again (runtime/kafka/coordinator.py)."""
    wanted = [TopicPartition(*tp) for tp in tps]
    try:
        parts = coordinator.until_answered(lambda: c.committed(wanted, timeout=GROUP_TIMEOUT_S),
                                           GROUP_TIMEOUT_S, "the group's committed offsets")
    except KafkaException as exc:
        raise RingmasterError(f"cannot read the group's committed offsets: {exc}") from None
    # A partition refused in the answer (not authorised) has no offset to give: read as "none
    # committed" it would be read again from the job's starting offsets.
    refused = [p for p in parts if p.error is not None]
    if refused:
        raise RingmasterError(f"cannot read the group's committed offsets: {refused[0].topic}"
                              f"[{refused[0].partition}]: {refused[0].error}")
    return _pack({(p.topic, p.partition): p.offset for p in parts if p.offset != OFFSET_INVALID})


def commit(c: Consumer, offsets: Offsets) -> None:
    """Commit as a simple (non-member) consumer of the group: accepted while the group has
    no active members (do not run `ringmaster run` on the same group at the same time).
    Partitions a moving or loading coordinator refused are committed again until
    GROUP_TIMEOUT_S has passed; any other refusal is an error naming them."""
    pending = [TopicPartition(t, int(p), o) for t, ps in offsets.items() for p, o in ps.items()]
    deadline = time.monotonic() + GROUP_TIMEOUT_S
    refusals = 0
    while pending:
        answer: list[TopicPartition] | None = coordinator.until_answered(
            partial(c.commit, offsets=pending, asynchronous=False),
            max(deadline - time.monotonic(), 0.0), "committing group offsets")
        refused = [part for part in (answer or []) if part.error is not None]
        pending = [part for part in refused if coordinator.is_busy(part.error)]
        wait = backoff_s(coordinator.FIRST_WAIT_S, refusals, coordinator.MAX_WAIT_S)
        if len(pending) < len(refused) or (pending and time.monotonic() + wait > deadline):
            names = _names((part.topic, part.partition) for part in refused)
            raise RingmasterError(f"the group's offsets were not committed for {names}: {refused[0].error}")
        if pending:
            refusals += 1
            time.sleep(wait)


def parse(spec: str, c: Consumer, tps: list[tuple[str, int]], mode: str, what: str = "offsets",
          ending: bool = False) -> Offsets:
    """'earliest', 'latest', 'committed' (earliest where the group has committed nothing), or
    JSON naming every partition of `tps`. `what` names the option in errors; `ending` says it
    is an end (exclusive), where -2 (earliest) means nothing and is refused, as Spark does."""
    if spec == "earliest":
        return earliest(c, tps)
    if spec == "latest":
        return latest(c, tps, mode)
    if spec == "committed":
        lows = earliest(c, tps)
        # A commit below the low watermark points at records retention has deleted.
        return at_least(merge(lows, committed(c, tps)), lows)
    return _from_json(spec, c, tps, mode, what, ending)


def _from_json(spec: str, c: Consumer, tps: list[tuple[str, int]], mode: str, what: str,
               ending: bool) -> Offsets:
    given = _read_json(spec, what)
    unknown_topics = sorted({t for t, _ in given} - {t for t, _ in tps})
    if unknown_topics:
        raise RingmasterError(f"{what}: {', '.join(map(repr, unknown_topics))} not in kafka.topics "
                              f"({', '.join(sorted({t for t, _ in tps}))})")
    unknown = set(given) - set(tps)
    if unknown:
        raise RingmasterError(f"{what}: no such partition {_names(unknown)}")
    missing = set(tps) - set(given)
    if missing:
        fix = "-1 for latest" if ending else "-2 for earliest"
        raise RingmasterError(f"{what} gives no offset for {_names(missing)}: add them, or give {fix}")
    refused = {tp for tp, o in given.items() if o < EARLIEST or (ending and o == EARLIEST)}
    if refused:
        allowed = "-1 (latest) or an offset" if ending else "-2 (earliest), -1 (latest) or an offset"
        raise RingmasterError(f"{what}: {_names(refused)} must be {allowed}")
    out = _pack({tp: o for tp, o in given.items() if o >= 0})
    out = merge(out, earliest(c, [tp for tp, o in given.items() if o == EARLIEST]))
    return merge(out, latest(c, sorted(tp for tp, o in given.items() if o == LATEST), mode))


def _read_json(spec: str, what: str) -> dict[tuple[str, int], int]:
    bad = RingmasterError(f"{what} {spec!r}: expected earliest, latest, committed or {_JSON_FORM}")
    try:
        given = json.loads(spec)
    except ValueError:
        raise bad from None
    if not isinstance(given, dict) or not all(isinstance(ps, dict) for ps in given.values()):
        raise bad
    out = {}
    for t, ps in given.items():
        for p, o in ps.items():
            if not (p.isascii() and p.isdigit()) or type(o) is not int:
                raise bad
            out[(str(t), int(p))] = o
    return out


def plan(c: Consumer, tps: list[tuple[str, int]], mode: str, start_spec: str, end_spec: str,
         what: tuple[str, str] = ("--from", "--to")) -> tuple[Offsets, Offsets]:
    """Start and end offsets of a batch read, for every partition of `tps`. A start past its end
    is an error; starts below the low watermark (deleted by retention) move up to it."""
    start = parse(start_spec, c, tps, mode, what[0])
    end = parse(end_spec, c, tps, mode, what[1], ending=True)
    past = {(t, int(p)) for t, ps in start.items() for p, s in ps.items() if s > end[t][p]}
    if past:
        shown = ", ".join(f"{t}[{p}] {start[t][str(p)]} > {end[t][str(p)]}" for t, p in sorted(past)[:10])
        raise RingmasterError(f"{what[0]} is past {what[1]} for {shown}")
    start = at_least(start, earliest(c, tps))
    return start, at_least(end, start)


def admit(start: Offsets, end: Offsets, max_records: int) -> Offsets:
    """Admission control: move from `start` towards `end` by at most `max_records` records in
    all, shared fairly over the partitions that have some. Every partition of `start` and `end`
    is in the result; `start` must place every partition of `end` (see with_starts)."""
    _require_starts(start, end)
    out = at_least(start, {})
    budget = max_records
    pending = [(t, p, e) for t, ps in end.items() for p, e in ps.items() if e > out[t][p]]
    while budget > 0 and pending:
        share = max(1, budget // len(pending))
        nxt = []
        for t, p, e in pending:
            take = min(share, e - out[t][p], budget)
            out[t][p] += take
            budget -= take
            if out[t][p] < e:
                nxt.append((t, p, e))
            if budget <= 0:
                break
        pending = nxt
    return out


def new_partitions(start: Offsets, end: Offsets) -> list[tuple[str, int]]:
    """Partitions of `end` that `start` does not know: added to a topic, or not yet in a
    checkpoint."""
    return [(t, int(p)) for t, ps in sorted(end.items()) for p in sorted(ps, key=int)
            if p not in start.get(t, {})]


def with_starts(c: Consumer, start: Offsets, end: Offsets) -> Offsets:
    """`start`, plus the low watermark of every partition of `end` it does not know, so a new
    partition is read from its beginning rather than skipped."""
    new = new_partitions(start, end)
    return merge(start, earliest(c, new)) if new else start


def ranges(start: Offsets, end: Offsets) -> list[Range]:
    """The offset ranges to read: one per partition of `end` with records past its start."""
    _require_starts(start, end)
    out = []
    for t, ps in sorted(end.items()):
        for p, e in sorted(ps.items(), key=lambda x: int(x[0])):
            s = start[t][p]
            if e > s:
                out.append((t, int(p), s, e))
    return out


def _require_starts(start: Offsets, end: Offsets) -> None:
    missing = new_partitions(start, end)
    if missing:  # a bug, not a user error: a partition without a start would be skipped
        raise RingmasterError(f"no start offset for {_names(missing)}")


def records(planned: Iterable[Range]) -> int:
    return sum(e - s for _, _, s, e in planned)


def merge(base: Offsets, over: Offsets) -> Offsets:
    out = {t: dict(ps) for t, ps in base.items()}
    for t, ps in over.items():
        out.setdefault(t, {}).update(ps)
    return out


def at_least(offsets: Offsets, floor: Offsets) -> Offsets:
    """Every partition of either, at the higher of its two offsets: a partition never moves back."""
    out = merge(floor, offsets)
    for t, ps in floor.items():
        for p, o in ps.items():
            out[t][p] = max(out[t][p], o)
    return out


def _pack(by_tp: Mapping[tuple[str, int], int]) -> Offsets:
    out: Offsets = {}
    for (t, p), o in by_tp.items():
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def _names(tps: Iterable[tuple[str, int]]) -> str:
    shown = sorted(tps)
    more = f" and {len(shown) - 10} more" if len(shown) > 10 else ""
    return ", ".join(f"{t}[{p}]" for t, p in shown[:10]) + more
