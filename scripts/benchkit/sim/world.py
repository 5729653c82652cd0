"""The simulated world around a real Supervisor: a clock that only the simulation moves, a
topic (records that arrive at given times), a consumer that hands them out, worker rings,
workers and result pipes. Everything the supervisor decides, it decides with its own code:
only what it talks to is simulated.

Time. ``World.now`` moves only when someone spends time:

* the supervisor, through the consumer and the pool (``Costs``: per consume() call, per
  record fetched, per frame written, per result read): that time is the supervisor's busy
  time, and the workers run meanwhile;
* a wait: the supervisor's ``sleep`` (it has no descriptor to select on) runs the world until
  the next result or the timeout; ``consume(timeout)`` runs it until a fetch response puts
  records in the client's queue, or the timeout.

Workers run their frames in ring order, one at a time, each record costing its own time
(per-record cost × deterministic jitter), plus a per-batch cost; a result is in the pipe at
the moment its batch ends.

The client (``Fetcher``) is librdkafka's as the runtime configures it: a fetch thread with one
request in flight to the broker, whose responses land whole in one queue, a run of up to
``max.partition.fetch.bytes`` per partition, in the order the request named them; ``consume(n)``
hands out the queue's first n records, whichever partitions they belong to; the thread fetches
again once the queue is below ``queued.max.messages.kbytes``; a pause drops what was queued
for the partition, which is fetched again after the resume.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from zlib import crc32

from confluent_kafka import Message

from runtime.kafka.consumer import Fetched
from runtime.kafka.messages import bind_packer
from runtime.kafka.offset_commits import CommitResult
from runtime.transport.board import BOARD_BYTES, Board, EpochTable
from runtime.transport.frames import DONE, Result, decode_frame, encode_result


@dataclass(frozen=True)
class Costs:
    """What the supervisor spends, in simulated µs (its serial cost: the time its one thread
    is busy, during which it does nothing else). Its own code measured on the shared 2-core
    machine (``./scripts/bench --simulate-calibrate``, calibrate.py; docs/simulation.md): a
    turn 300-400 µs of CPU with 32 partitions and 15 workers, 140-160 with 3-8 and 2, a record
    cut 0.26-0.31, at a load average of 8-14 that slows such code more than the work unit;
    these defaults take about half, a quiet host's."""

    record_us: float = 1.0  # per record: consume() building Messages, packing, tracking (the case's sup)
    cut_us: float = 0.2  # ... of which this is paid when the record is cut (packing, registering)
    frame_us: float = 8.0  # per frame written to a ring (the cut's and the placing's share of a batch)
    result_us: float = 8.0  # per result read (decode, tracker, scheduler, counters)
    tick_us: float = 60.0  # per turn of the loop, plus the next two: its steps that look at...
    tick_partition_us: float = 2.0  # ... every partition (flow control, the cut, records_wanted)
    tick_worker_us: float = 4.0  # ... and every worker (room, allowance, the workforce, results' pipes)

    def turn_us(self, partitions: int, workers: int) -> float:
        return self.tick_us + self.tick_partition_us * partitions + self.tick_worker_us * workers


# Bytes a record takes in a fetch response: the benches' 256-byte values, a key, the record's
# own framing and its share of its record batch's header.
WIRE_BYTES_PER_RECORD = 330


@dataclass(frozen=True)
class Client:
    """The Kafka client's fetching, in records (``from_properties``: the librdkafka properties
    the daemon gives its consumer, runtime/kafka/properties.py)."""

    rtt_us: float = 500.0  # a fetch request to its response when the broker has records
    partition_records: int = 3_000  # a response's run per partition: max.partition.fetch.bytes, 1 MiB
    queue_records: int = 50_000  # fetching stops above this: queued.max.messages.kbytes, 16 MiB
    wait_max_s: float = 0.1  # fetch.wait.max.ms: a broker with nothing to send holds the fetch
    backoff_s: float = 0.01  # fetch.queue.backoff.ms: how soon a full queue is looked at again

    @classmethod
    def from_properties(cls, props: dict[str, Any]) -> Client:
        def num(name: str, default: float) -> float:
            return float(props.get(name, default))

        per_partition = num("max.partition.fetch.bytes", 1 << 20)
        queue_bytes = num("queued.max.messages.kbytes", 1 << 16) * 1024
        return cls(partition_records=max(1, int(per_partition / WIRE_BYTES_PER_RECORD)),
                   queue_records=max(1, int(queue_bytes / WIRE_BYTES_PER_RECORD)),
                   wait_max_s=num("fetch.wait.max.ms", 500) / 1000,
                   backoff_s=num("fetch.queue.backoff.ms", 1000) / 1000)


@dataclass
class Topic:
    """Records per partition and when each arrives (seconds); keys for key ordering."""

    name: str
    arrivals: list[list[float]]  # per partition, non-decreasing
    costs: list[list[float]]  # per partition, per record: the plugin's seconds
    keys: int = 1000  # distinct keys, spread over every partition

    @property
    def total(self) -> int:
        return sum(len(a) for a in self.arrivals)

    def key(self, partition: int, offset: int) -> bytes:
        return b"k%d" % ((offset * 7919 + partition * 104729) % self.keys)


def make_topic(name: str, partitions: int, records: int, work_us: float, jitter: float, seed: int,
               rate: float = 0.0, hot: float = 1.0, keys: int = 1000) -> Topic:
    """``records`` spread over the partitions (partition 0 takes ``hot`` times the others'
    share); each costs ``work_us`` × (1 ± ``jitter``, uniform). ``rate``: records/s over the
    whole topic, arriving evenly in time, to a partition drawn at random (0: every record is
    there at the start, a backlog to drain)."""
    rng = random.Random(seed)
    weights = [hot] + [1.0] * (partitions - 1)
    total_w = sum(weights)
    arrivals: list[list[float]] = [[] for _ in range(partitions)]
    costs: list[list[float]] = [[] for _ in range(partitions)]
    if rate > 0:
        for i in range(records):
            p = rng.choices(range(partitions), weights)[0]
            arrivals[p].append(i / rate)
    else:
        counts = [int(records * w / total_w) for w in weights]
        counts[-1] += records - sum(counts)
        for p, n in enumerate(counts):
            arrivals[p] = [0.0] * n
    for p in range(partitions):
        costs[p] = [work_us * 1e-6 * (1 + jitter * (2 * rng.random() - 1)) for _ in arrivals[p]]
    return Topic(name, arrivals, costs, keys)


_END, _SETTLED = 0, 1  # a worker's events: the plugin is done with its batch; acknowledgements are in


@dataclass
class Frame:
    batch_id: int
    slot: int
    epoch: int
    tp: tuple[str, int]
    offsets: Sequence[int]
    lane: tuple[tuple[str, int], int | None]
    size: int
    written_at: float


@dataclass
class SimWorker:
    index: int
    queue: deque[Frame] = field(default_factory=deque)
    current: Frame | None = None
    ends_at: float = 0.0
    took: float = 0.0  # the current batch's time
    busy_s: float = 0.0
    records: int = 0
    batches: int = 0
    queued_bytes: int = 0
    delivering: tuple[Frame, float] | None = None  # a batch whose outputs are not acknowledged yet (when)
    settling: bool = False  # waiting for acknowledgements: nothing starts until they are in
    finished: Frame | None = None  # done by the plugin, its outputs waiting for the batch before's
    first_start: float | None = None  # when it began its first batch


class World:
    """The clock, the topic, the workers; the consumer and pool below act on it."""

    def __init__(self, topic: Topic, workers: int, costs: Costs, batch_us: float = 20.0,
                 key_lanes: int = 0, ack_us: float = 0.0, pipelined: bool = False) -> None:
        self.topic = topic
        self.costs = costs
        self.batch_s = batch_us / 1e6  # a worker's fixed time per batch: decode, result, bookkeeping
        # The broker's acknowledgement of a batch's outputs comes this long after they are
        # produced. ``pipelined``: the worker starts its next batch meanwhile, if one is in
        # its ring, and reports the batch when that one's outputs are to be produced (or,
        # with nothing in its ring, once the acknowledgements are in); else it waits.
        self.ack_s = ack_us / 1e6
        self.pipelined = pipelined
        self.key_lanes = key_lanes  # key ordering: the supervisor's lanes per partition (for lane moves)
        self.now = 0.0
        self.sup_busy_s = 0.0
        self.workers = [SimWorker(i) for i in range(workers)]
        self.pipes: list[list[tuple[float, bytes]]] = [[] for _ in range(workers)]
        self.done_records = 0
        self.last_end = 0.0
        self.latencies: list[float] = []
        self.lane_moves = 0
        self._lane_at: dict[Any, int] = {}
        self._ends: list[tuple[float, int, int]] = []  # (time, worker, _END/_SETTLED): workers' next events
        self.fetcher: Fetcher | None = None  # the client's fetch thread (SimConsumer sets it)

    # ------------------------------------------------------------------ time
    def spend(self, seconds: float) -> None:
        """The supervisor is busy this long; the workers and the client's fetcher run meanwhile."""
        self.sup_busy_s += seconds
        self.run_until(self.now + seconds)

    def run_until(self, t: float, until: Callable[[], bool] | None = None) -> None:
        """Run the workers and the fetcher to time t, or (``until``) to the first event after
        which it holds."""
        while True:
            end = self._ends[0][0] if self._ends else None
            fetch = self.fetcher.next_event_at() if self.fetcher is not None else None
            nxt = end if fetch is None or (end is not None and end <= fetch) else fetch
            if nxt is None or nxt > t:
                break
            if nxt == end:
                _, w, kind = heapq.heappop(self._ends)
                if kind == _END:
                    self._finish(self.workers[w], nxt)
                else:
                    self._settled(self.workers[w], nxt)
            else:
                assert self.fetcher is not None
                self.fetcher.fire(nxt)
            if until is not None and until():
                self.now = max(self.now, nxt)
                return
        self.now = max(self.now, t)

    def next_result_at(self) -> float | None:
        return self._ends[0][0] if self._ends else None

    # ------------------------------------------------------------------ workers
    def write(self, w: int, raw: bytes, capacity: int) -> bool:
        worker = self.workers[w]
        if worker.queued_bytes + len(raw) > capacity:
            return False
        f = decode_frame(raw)
        if f is None:  # a STOP frame: the simulated worker has nothing to stop
            return True
        tp = (f.topic, f.partition)
        offsets = f.columns.offset_list()
        lane: Any = None
        if self.key_lanes:
            key = f.columns.keys[0]
            lane = None if key is None else crc32(key) % self.key_lanes
        frame = Frame(f.batch_id, f.slot, f.epoch, tp, offsets, (tp, lane), len(raw), self.now)
        worker.queue.append(frame)
        worker.queued_bytes += len(raw)
        if worker.current is None and not worker.settling:
            self._start(worker, self.now)
        self.spend(self.costs.frame_us / 1e6)
        return True

    def cut(self, records: int) -> None:
        """The supervisor cut this many records into frames (packing, registering)."""
        self.spend(self.costs.cut_us * records / 1e6)

    def _start(self, worker: SimWorker, at: float) -> None:
        if worker.first_start is None:
            worker.first_start = at
        frame = worker.queue.popleft()
        worker.queued_bytes -= frame.size
        worker.current = frame
        costs = self.topic.costs[frame.tp[1]]
        took = self.batch_s + sum(costs[o] for o in frame.offsets)
        worker.ends_at = at + took
        worker.took = took
        worker.busy_s += took
        if frame.lane[1] is not None or not self.key_lanes:
            last = self._lane_at.get(frame.lane)
            if last is not None and last != worker.index:
                self.lane_moves += 1
            self._lane_at[frame.lane] = worker.index
        heapq.heappush(self._ends, (worker.ends_at, worker.index, _END))

    def _finish(self, worker: SimWorker, at: float) -> None:
        """The plugin is done with the current batch: its outputs go to the broker."""
        frame = worker.current
        assert frame is not None
        worker.current = None
        if worker.delivering is not None:
            # Before this batch's outputs are produced, the one before it is settled: waited
            # for if its acknowledgements are not in yet.
            prev, acked_at = worker.delivering
            if acked_at > at:
                worker.settling = True
                worker.finished = frame
                heapq.heappush(self._ends, (acked_at, worker.index, _SETTLED))
                return
            worker.delivering = None
            self._report(worker, prev, at)
        self._produced(worker, frame, at)

    def _produced(self, worker: SimWorker, frame: Frame, at: float) -> None:
        if not self.ack_s:
            self._report(worker, frame, at)
            if worker.queue:
                self._start(worker, at)
            return
        if not self.pipelined:
            worker.settling = True
            worker.delivering = (frame, at + self.ack_s)
            heapq.heappush(self._ends, (at + self.ack_s, worker.index, _SETTLED))
            return
        worker.delivering = (frame, at + self.ack_s)
        if worker.queue:
            self._start(worker, at)
        else:  # nothing to run meanwhile: wait for the acknowledgements, then report
            worker.settling = True
            heapq.heappush(self._ends, (at + self.ack_s, worker.index, _SETTLED))

    def _settled(self, worker: SimWorker, at: float) -> None:
        """The acknowledgements a waiting worker waited for are in."""
        assert worker.delivering is not None
        worker.settling = False
        self._report(worker, worker.delivering[0], at)
        worker.delivering = None
        if worker.finished is not None:  # the batch after it, whose outputs go out now
            frame, worker.finished = worker.finished, None
            self._produced(worker, frame, at)
            return
        if worker.queue:
            self._start(worker, at)

    def _report(self, worker: SimWorker, frame: Frame, at: float) -> None:
        n = len(frame.offsets)
        arrivals = self.topic.arrivals[frame.tp[1]]
        self.latencies += [at - arrivals[o] for o in frame.offsets]
        worker.records += n
        worker.batches += 1
        self.done_records += n
        self.last_end = max(self.last_end, at)
        # What a worker reports it took: from the batch's start to its report, the wait for the
        # acknowledgements too, unless it ran the next batch meanwhile.
        took = self.batch_s + sum(self.topic.costs[frame.tp[1]][o] for o in frame.offsets)
        busy_ms = (took + (0.0 if self.pipelined else self.ack_s)) * 1000
        self.pipes[worker.index].append((at, encode_result(Result(
            DONE, frame.batch_id, frame.slot, frame.epoch, processed=n, busy_ms=busy_ms))))

    def read_results(self, w: int) -> list[bytes]:
        pipe = self.pipes[w]
        if not pipe:
            return []
        self.pipes[w] = []
        self.spend(self.costs.result_us * len(pipe) / 1e6)
        return [m for _, m in pipe]


class Fetcher:
    """The client's fetch thread and its queue (module docstring): what ``consume()`` can hand
    out, and when it got there. Positions are offsets per partition."""

    def __init__(self, world: World, client: Client) -> None:
        self.world = world
        self.client = client
        n = len(world.topic.arrivals)
        self.fetch_at = [0] * n  # the next offset to fetch
        self.handed = [0] * n  # the next offset to hand out (the consumer's position)
        self.high: list[int | None] = [None] * n  # high watermarks, as fetch responses said
        self.paused: set[int] = set()
        self.queue: deque[list[int]] = deque()  # runs [partition, first, end] in arrival order
        self.queued = 0
        self._queued_of = [0] * n
        self._version = [0] * n  # a pause or a seek makes what is in flight for the partition stale
        self._in_flight: tuple[float, float, list[tuple[int, int]]] | None = None  # (lands, answered, asked)
        self._next_request = 0.0  # a full queue: not before this
        self._rotate = 0  # librdkafka rotates the partitions a request starts with
        self.requests = 0

    def _arrived(self, p: int, t: float) -> int:
        """How many of the partition's records the broker has at time t."""
        return bisect.bisect_right(self.world.topic.arrivals[p], t)

    def next_event_at(self) -> float | None:
        if self._in_flight is not None:
            return self._in_flight[0]
        if self._fetchable():
            return max(self._next_request, self.world.now)
        return None

    def _fetchable(self) -> list[int]:
        arrivals = self.world.topic.arrivals
        return [p for p in range(len(arrivals))
                if p not in self.paused and self.fetch_at[p] < len(arrivals[p])]

    def fire(self, at: float) -> None:
        if self._in_flight is not None:
            self._land(at)
        else:
            self._request(at)

    def _request(self, at: float) -> None:
        asked = self._fetchable()
        if not asked:
            return
        if self.queued >= self.client.queue_records:
            self._next_request = at + self.client.backoff_s
            return
        k = self._rotate % len(asked)
        asked = asked[k:] + asked[:k]
        self._rotate += 1
        self.requests += 1
        half = self.client.rtt_us / 2e6
        reach = at + half
        # The broker answers at once when it has a record for the request, else when the first
        # arrives, or after fetch.wait.max.ms.
        soonest = min((self.world.topic.arrivals[p][self.fetch_at[p]] for p in asked), default=reach)
        answered = min(max(reach, soonest), reach + self.client.wait_max_s)
        self._in_flight = (answered + half, answered, [(p, self._version[p]) for p in asked])

    def _land(self, at: float) -> None:
        assert self._in_flight is not None
        _, answered, asked = self._in_flight
        self._in_flight = None
        for p, version in asked:
            arrived = self._arrived(p, answered)
            self.high[p] = max(self.high[p] or 0, arrived)
            if version != self._version[p] or p in self.paused:
                continue  # paused or sought meanwhile: librdkafka drops the outdated records
            first = self.fetch_at[p]
            end = min(arrived, first + self.client.partition_records)
            if end > first:
                self.queue.append([p, first, end])
                self.queued += end - first
                self._queued_of[p] += end - first
                self.fetch_at[p] = end
        self._next_request = at
        self._request(at)  # the next request goes out as the response is handled

    def take(self, max_records: int) -> list[tuple[int, int, int]]:
        """Up to max_records from the head of the queue: (partition, first, end) runs."""
        out = []
        want = max_records
        while want and self.queue:
            run = self.queue[0]
            p, first, end = run
            n = min(want, end - first)
            out.append((p, first, first + n))
            want -= n
            self.queued -= n
            self._queued_of[p] -= n
            self.handed[p] = first + n
            if first + n == end:
                self.queue.popleft()
            else:
                run[1] = first + n
        return out

    def drop(self, p: int, position: int) -> None:
        """A pause or a seek: what was fetched for the partition goes; it is fetched again from
        ``position``."""
        if self._queued_of[p]:
            self.queue = deque(run for run in self.queue if run[0] != p)
            self.queued -= self._queued_of[p]
            self._queued_of[p] = 0
        self._version[p] += 1
        self.handed[p] = self.fetch_at[p] = position


class SimConsumer:
    """The group consumer: the whole topic is assigned to this member at its first consume();
    records come from the client's queue (``Fetcher``); pause and resume as librdkafka keeps
    them."""

    def __init__(self, world: World, client: Client | None = None,
                 on_idle: Callable[[], bool] = lambda: False) -> None:
        bind_packer()  # as GroupConsumer does: the supervisor packs what it hands back
        self.world = world
        self.fetcher = world.fetcher = Fetcher(world, client or Client())
        self.on_idle = on_idle  # called each consume(): True stops handing out (the run is over)
        self.acknowledged: dict[tuple[str, int], int] = {}
        self.stats_summary: dict[str, float] = {}
        n = len(world.topic.arrivals)
        self.tps = [(world.topic.name, p) for p in range(n)]
        self.commits = 0
        self.consumes = 0
        self._assign: Callable[[list[tuple[str, int]]], None] | None = None

    @property
    def paused(self) -> set[int]:
        return self.fetcher.paused

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self._assign = on_assign

    def consume(self, max_records: int, timeout_s: float) -> Fetched:
        w = self.world
        self.consumes += 1
        w.spend(w.costs.turn_us(len(self.tps), len(w.workers)) / 1e6)
        if self._assign is not None:
            assign, self._assign = self._assign, None
            assign(list(self.tps))
            return Fetched()
        if self.on_idle():
            return Fetched()
        f = self.fetcher
        if not f.queued and timeout_s > 0:
            w.run_until(w.now + timeout_s, until=lambda: f.queued > 0)
        out = self._hand_out(f.take(max_records))
        if out.count:
            w.spend((w.costs.record_us - w.costs.cut_us) * out.count / 1e6)
        return out

    def _hand_out(self, runs: list[tuple[int, int, int]]) -> Fetched:
        out = Fetched()
        topic = self.world.topic
        for p, first, end in runs:
            msgs = [Message(topic=topic.name, partition=p, offset=o, key=topic.key(p, o), value=b"v" * 16,
                            timestamp=(1, 0)) for o in range(first, end)]
            tp = self.tps[p]
            if tp in out.runs:
                out.runs[tp].extend(msgs)
            else:
                out.runs[tp] = msgs
            out.count += end - first
        return out

    def pause(self, tps: Any) -> None:
        f = self.fetcher
        for tp in tps:
            p = tp[1]
            if p not in f.paused:
                f.paused.add(p)
                f.drop(p, f.handed[p])

    def resume(self, tps: Any) -> None:
        self.fetcher.paused -= {tp[1] for tp in tps}

    def commit(self, offsets: dict[Any, int], asynchronous: bool, timeout_s: float = 0.0) -> CommitResult:
        self.commits += 1
        self.acknowledged.update(offsets)
        return CommitResult(True)

    def take_refused_commits(self) -> dict[Any, int]:
        return {}

    def release(self, tp: Any, run: Any, keep: bool = False) -> None:
        pass

    def seek_to_start(self, tps: Any) -> list[Any]:
        return []

    def seek(self, tp: Any, offset: int) -> bool:
        self.fetcher.drop(tp[1], offset)
        return True

    def high_watermark(self, tp: Any) -> int | None:
        return self.fetcher.high[tp[1]]  # as the last fetch response said (librdkafka's cache)

    def group_standing(self, ask_committed: bool) -> None:
        return None  # one member: judged alone

    def stop(self) -> None:
        pass

    def close(self, timeout_s: float = 0.0) -> bool:
        return True


class SimRing:
    def __init__(self, world: World, index: int, capacity: int) -> None:
        self.world, self.index, self._capacity = world, index, capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def max_frame(self) -> int:
        return self._capacity // 2

    def fill(self) -> float:
        return self.world.workers[self.index].queued_bytes / self._capacity

    def try_write(self, payload: bytes) -> bool:
        return self.world.write(self.index, payload, self._capacity)

    def write_position(self) -> int:
        return 0

    def reader_reached(self, position: int) -> bool:
        return False  # no doorbell to ring: the simulated worker never sleeps on its ring


class SimPipe:
    fd = -1  # nothing to select on: the supervisor reads every pipe each collect()

    def __init__(self, world: World, index: int) -> None:
        self.world, self.index = world, index

    def read(self) -> list[bytes]:
        return self.world.read_results(self.index)


class _Lock:
    def acquire(self, timeout: float | None = None) -> bool:
        return True

    def release(self) -> None:
        pass


@dataclass(eq=False)
class SimHandle:
    index: int
    ring: SimRing
    results: SimPipe
    board: Board = field(default_factory=lambda: Board(memoryview(bytearray(BOARD_BYTES))))
    lock: _Lock = field(default_factory=_Lock)
    incarnation: int = 0
    process: Any = None
    bell: Any = None
    started_at: float = 0.0
    alive: bool = True
    pid: int | None = None


class SimPool:
    """The worker pool: N slots whose workers are ready at once and never die."""

    def __init__(self, world: World, ring_bytes: int) -> None:
        self.world = world
        self.handles = [SimHandle(i, SimRing(world, i, ring_bytes), SimPipe(world, i))
                        for i in range(len(world.workers))]
        self.max_slots = len(self.handles)
        self.epochs = EpochTable(memoryview(bytearray(8 * 4096)))

    def add_slot(self) -> SimHandle:
        raise RuntimeError("the simulation has a fixed number of workers")

    def spawn_worker(self, h: SimHandle, code: Any = None) -> None:
        h.incarnation += 1
        h.board.reset()
        h.board.set_ready()

    def segment_paths(self) -> list[str]:
        return []  # no shared memory: the simulated rings are objects

    def result_fds(self) -> list[int]:
        return []

    def sentinels(self) -> list[Any]:
        return []

    def dead(self) -> list[SimHandle]:
        return []

    def forget(self, h: SimHandle) -> int | None:
        return 0

    def kill(self, h: SimHandle, sig: int = 9) -> None:
        pass

    def watch_descendants(self) -> None:
        pass

    def reap_orphans(self) -> None:
        pass

    def stop_all(self, timeout_s: float) -> None:
        pass

    def sleep(self, timeout_s: float) -> None:
        """The supervisor's wait for a result (it has no descriptor to select on here)."""
        w = self.world
        if any(w.pipes):
            return  # a result is there to read: select() would return at once
        nxt = w.next_result_at()
        w.run_until(w.now + timeout_s if nxt is None else min(w.now + timeout_s, max(nxt, w.now)))
