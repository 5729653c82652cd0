"""What the cluster tests judge by, independent of the daemons' logs: a producer writing the
input at a steady rate, a reader of the outputs that notes when each input partition's outputs
arrive (``read_committed`` under exactly-once: visible, not merely written), and a sampler of
the group's committed offsets. From those, each fault's recovery time.

Recovery of a fault: from its end (the node back, the link mended, the replacement started)
until the outputs of every input partition flow again. Two figures per fault:
- ``first_output_s``: the longest, over input partitions, from the end to the first output
  to arrive after it;
- ``steady_s``: the longest, over input partitions, from the end to the arrival that closes
  the last gap of ``GAP_S`` or more in the partition's outputs before the next fault (an output
  that trickles in after the end and then stops again does not count as recovered): what the
  tests hold to the aim;
and ``first_commit_s``: the longest, over input partitions, from the end to the first sample
whose committed offset had moved past where it stood at the end.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from helpers import unique

# Outputs arrive every few ms at the steady rate; under exactly-once a read_committed reader
# gets them a transaction at a time, and a partition catching up on a backlog (larger batches,
# longer transactions) shows gaps of 2-4 s on a loaded 2-core machine with nothing wrong. A
# gap this long is an outage.
GAP_S = 5.0


class SteadyInput(threading.Thread):
    """Writes ``r<i>`` to ``partitions`` partitions round robin (key ``k<i>``) at ``rate`` records
    a second, idempotent with acks=all, until stopped; ``values`` are every value it wrote
    (acknowledged), ``counts`` the records acknowledged per partition. With ``poison_every``,
    every such record is ``raise:r<i>`` (the probe plugin raises: a dead letter)."""

    def __init__(self, props: dict[str, Any], topic: str, partitions: int, rate: float,
                 poison_every: int = 0) -> None:
        super().__init__(daemon=True, name="steady-input")
        self._p = Producer({**props, "linger.ms": 5, "enable.idempotence": True, "acks": "all",
                            "message.timeout.ms": 600_000, "log_level": 2})
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.poison_every = poison_every
        self.sent = 0  # handed to the client
        self.counts: Counter[int] = Counter()
        self.values: list[str] = []
        self.failed: list[str] = []
        self._halt = threading.Event()

    def _delivered(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(str(err))
            return
        self.counts[msg.partition()] += 1
        self.values.append(msg.value().decode())

    def run(self) -> None:
        start = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - start) * self.rate)
            while self.sent < due:
                i = self.sent
                poison = self.poison_every and i % self.poison_every == self.poison_every // 2
                try:
                    value = f"{'raise:' if poison else ''}r{i}".encode()
                    self._p.produce(self.topic, value, key=f"k{i}".encode(), partition=i % self.partitions,
                                    on_delivery=self._delivered)
                except BufferError:
                    break
                self.sent += 1
            self._p.poll(0.01)

    def finish(self, timeout_s: float = 120.0) -> None:
        """Stop writing; every record handed over acknowledged (or the test fails)."""
        self._halt.set()
        if self.ident is not None:
            self.join(10)
        left = self._p.flush(timeout_s)
        assert left == 0 and not self.failed, f"the input producer: {left} unacknowledged, {self.failed[:3]}"


Series = int | tuple[str, int]  # an input partition, or ("out", an output partition)


def series(partitions: int) -> list[Series]:
    """What must flow for a fault to be over: the outputs of every input partition, and every
    output partition (under exactly-once a transaction left open holds a read_committed reader
    of its output partitions, whatever input partition the outputs after it came from)."""
    return [*range(partitions), *(("out", q) for q in range(partitions))]


class OutputReader(threading.Thread):
    """Reads every partition of the output topic from the start, without a group, and notes
    when each output arrived, by the input partition (``p``) its body names and by the output
    partition it is in (``("out", q)``)."""

    def __init__(self, props: dict[str, Any], topic: str, exactly_once: bool) -> None:
        super().__init__(daemon=True, name="output-reader")
        self._c = Consumer({**props, "group.id": unique("flow-reader"), "enable.auto.commit": False,
                            "isolation.level": "read_committed" if exactly_once else "read_uncommitted",
                            "fetch.wait.max.ms": 50, "log_level": 2})
        self.topic = topic
        self.arrivals: dict[Series, list[float]] = defaultdict(list)
        self.ids: Counter[str] = Counter()
        self._halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            parts = self._c.list_topics(self.topic, timeout=30).topics[self.topic].partitions
            self._c.assign([TopicPartition(self.topic, p, 0) for p in parts])
            while not self._halt.is_set():
                for m in self._c.consume(1000, 0.1):
                    if m.error() is None:
                        body, now = json.loads(m.value()), time.monotonic()
                        self.arrivals[body["p"]].append(now)
                        self.arrivals[("out", m.partition())].append(now)
                        self.ids[body["id"]] += 1
        except BaseException as exc:  # judged by the test
            self.error = exc
        finally:
            self._c.close()

    def finish(self) -> None:
        self._halt.set()
        if self.ident is not None:  # started
            self.join(30)


class CommitSampler(threading.Thread):
    """The group's committed offsets every ``every_s``, stamped when read (a sample the
    coordinator could not answer is skipped: it is moving)."""

    def __init__(self, props: dict[str, Any], group: str, topic: str, partitions: int,
                 every_s: float = 0.5) -> None:
        super().__init__(daemon=True, name="commit-sampler")
        # read_uncommitted: never held back by a transaction in progress (require_stable)
        self._c = Consumer({**props, "group.id": group, "enable.auto.commit": False,
                            "isolation.level": "read_uncommitted", "log_level": 2})
        self._tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.every_s = every_s
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            while not self._halt.wait(self.every_s):
                try:
                    parts = self._c.committed(self._tps, timeout=5)
                except KafkaException:
                    continue
                if all(p.error is None for p in parts):
                    self.samples.append((time.monotonic(), {p.partition: p.offset for p in parts}))
        finally:
            self._c.close()

    def latest(self) -> dict[int, int]:
        return dict(self.samples[-1][1]) if self.samples else {}

    def finish(self) -> None:
        self._halt.set()
        if self.ident is not None:  # started
            self.join(30)


@dataclass
class FaultSpan:
    kind: str
    start: float  # monotonic: the fault struck
    end: float  # monotonic: it was undone
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Recovery:
    kind: str
    first_output_s: float | None  # None: some partition had no output after the end
    steady_s: float | None
    first_commit_s: float | None
    slowest: Series | None  # the input partition (or ("out", output partition)) that set steady_s
    fault_s: float = 0.0  # how long the fault lasted
    # (series, seconds from the fault's start, length): every gap of GAP_S or more
    gaps: tuple[tuple[Series, float, float], ...] = ()

    def figures(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 1)
        return {"fault": self.kind, "first_output_s": r(self.first_output_s), "steady_s": r(self.steady_s),
                "first_commit_s": r(self.first_commit_s), "slowest_partition": self.slowest,
                "fault_s": r(self.fault_s), "gaps": [(p, r(at), r(n)) for p, at, n in self.gaps]}


def recovery(span: FaultSpan, until: float, arrivals: dict[Series, list[float]], partitions: int,
             samples: list[tuple[float, dict[int, int]]], gap_s: float = GAP_S) -> Recovery:
    """The recovery of the fault ``span`` from what was seen up to ``until`` (the next fault,
    or the end of the run), over every series (``series``). See the module's docstring."""
    firsts: list[float] = []
    steady: list[tuple[float, Series]] = []
    gaps: list[tuple[Series, float, float]] = []
    for p in series(partitions):
        seen = arrivals.get(p, [])
        after = [t for t in seen if span.end <= t < until]
        if not after:
            firsts.append(float("inf"))
            steady.append((float("inf"), p))
            continue
        firsts.append(after[0] - span.end)
        # From the fault's start: a partition silent since then has been in one gap all along.
        window = [span.start, *(t for t in seen if span.start <= t < until)]
        closing = span.end
        for a, b in itertools.pairwise(window):
            if b - a >= gap_s:
                gaps.append((p, a - span.start, b - a))
                if b > span.end:
                    closing = b
        steady.append((closing - span.end, p))
    at_end = _sample_at(samples, span.end)
    commit = []
    for p in range(partitions):
        moved = [t for t, offs in samples if t >= span.end and at_end is not None
                 and offs.get(p, -1) > at_end.get(p, -1) and t < until]
        commit.append(moved[0] - span.end if moved else float("inf"))
    worst, slowest = max(steady, key=lambda x: x[0])

    def finite(x: float) -> float | None:
        return None if x == float("inf") else x
    return Recovery(span.kind, finite(max(firsts)), finite(worst), finite(max(commit)) if at_end else None,
                    slowest, span.end - span.start, tuple(sorted(gaps, key=lambda g: g[1])))


def _sample_at(samples: list[tuple[float, dict[int, int]]], t: float) -> dict[int, int] | None:
    before = [offs for ts, offs in samples if ts <= t]
    return before[-1] if before else None


def wait_steady(reader: OutputReader, since: float, partitions: int, hold_s: float, timeout_s: float) -> bool:
    """Until every series (``series``) has had outputs arriving for ``hold_s`` without a gap
    of GAP_S since ``since``: the group has recovered (False: not within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.monotonic()
        ok = True
        for p in series(partitions):
            seen = [t for t in reader.arrivals.get(p, []) if t >= since]
            if not seen or now - seen[-1] >= GAP_S:
                ok = False
                break
            gaps = [b for a, b in itertools.pairwise(seen) if b - a >= GAP_S]
            flowing_since = gaps[-1] if gaps else seen[0]
            if now - flowing_since < hold_s:
                ok = False
                break
        if ok:
            return True
        time.sleep(0.2)
    return False


def committed_now(props: dict[str, Any], group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets, asked again while its coordinator moves."""
    c = Consumer({**props, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted", "log_level": 2})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                parts = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
                return {p.partition: p.offset for p in parts}
            except KafkaException as exc:
                if time.monotonic() > deadline or exc.args[0].code() not in (
                        KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT):
                    raise
                time.sleep(0.5)
    finally:
        c.close()


def transactions_settled(props: dict[str, Any], topics: list[str], timeout_s: float) -> bool:
    """Until no transaction is open on any partition of ``topics`` (every partition's last
    stable offset at its end): what a read_committed reader reads is then all it will ever
    read. A member killed on another host leaves its transactions open for
    transaction.timeout.ms (False: still open after ``timeout_s``)."""
    admin = AdminClient({**props, "log_level": 2})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            meta = admin.list_topics(timeout=10).topics
            tps = [TopicPartition(t, p) for t in topics for p in meta[t].partitions]
            ends = {level: admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level)
                    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)}
            stable, high = ([ends[level][tp].result(10).offset for tp in tps]
                            for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED))
            if stable == high:
                return True
        except KafkaException:  # a leader moving: asked again
            pass
        time.sleep(1.0)
    return False
