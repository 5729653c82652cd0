"""The simulated world around a real Supervisor: a clock that only the simulation moves, a
topic (records that arrive at given times), a consumer that hands them out, worker rings,
workers and result pipes. Everything the supervisor decides, it decides with its own code:
only what it talks to is simulated.

Time. ``World.now`` moves only when someone spends time:

* the supervisor, through the consumer and the pool (``Costs``: per consume() call, per
  record fetched, per frame written, per result read): that time is the supervisor's busy
  time, and the workers run meanwhile;
* a wait: the supervisor's ``sleep`` (it has no descriptor to select on) runs the world until
  the next result or the timeout; ``consume(timeout)`` runs it until the next record arrives
  or the timeout.

Workers run their frames in ring order, one at a time, each record costing its own time
(per-record cost × deterministic jitter), plus a per-batch cost; a result is in the pipe at
the moment its batch ends.
"""

from __future__ import annotations

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
    is busy, during which it does nothing else)."""

    record_us: float = 1.0  # per record fetched: consume() building Messages, packing, tracking
    frame_us: float = 4.0  # per frame written to a ring (a batch's fixed cost: pack call, ring write)
    result_us: float = 3.0  # per result read (decode, tracker, counters)
    tick_us: float = 10.0  # per consume() call (the rest of one turn of the loop)


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


class World:
    """The clock, the topic, the workers; the consumer and pool below act on it."""

    def __init__(self, topic: Topic, workers: int, costs: Costs, batch_us: float = 20.0,
                 key_lanes: int = 0) -> None:
        self.topic = topic
        self.costs = costs
        # A worker's fixed time per batch: decode, result, bookkeeping and (cases.Case.ack_us) the
        # wait for its outputs' acknowledgement.
        self.batch_s = batch_us / 1e6
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
        self._ends: list[tuple[float, int]] = []  # (time, worker): the next batch end of each busy worker

    # ------------------------------------------------------------------ time
    def spend(self, seconds: float) -> None:
        """The supervisor is busy this long; the workers run meanwhile."""
        self.sup_busy_s += seconds
        self.run_until(self.now + seconds)

    def run_until(self, t: float) -> None:
        while self._ends and self._ends[0][0] <= t:
            end, w = heapq.heappop(self._ends)
            self._finish(self.workers[w], end)
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
        if worker.current is None:
            self._start(worker, self.now)
        self.spend(self.costs.frame_us / 1e6)
        return True

    def _start(self, worker: SimWorker, at: float) -> None:
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
        heapq.heappush(self._ends, (worker.ends_at, worker.index))

    def _finish(self, worker: SimWorker, at: float) -> None:
        frame = worker.current
        assert frame is not None
        n = len(frame.offsets)
        arrivals = self.topic.arrivals[frame.tp[1]]
        self.latencies += [at - arrivals[o] for o in frame.offsets]
        worker.records += n
        worker.batches += 1
        self.done_records += n
        self.last_end = max(self.last_end, at)
        self.pipes[worker.index].append((at, encode_result(Result(
            DONE, frame.batch_id, frame.slot, frame.epoch, processed=n,
                busy_ms=worker.took * 1000))))
        worker.current = None
        if worker.queue:
            self._start(worker, at)

    def read_results(self, w: int) -> list[bytes]:
        pipe = self.pipes[w]
        if not pipe:
            return []
        self.pipes[w] = []
        self.spend(self.costs.result_us * len(pipe) / 1e6)
        return [m for _, m in pipe]


class SimConsumer:
    """The group consumer: the whole topic is assigned to this member at its first consume();
    pause/resume as librdkafka keeps them; records a partition has fetched come back in
    offset order, up to ``chunk`` per partition per call, partitions taken in turn."""

    def __init__(self, world: World, chunk: int = 500, on_idle: Callable[[], bool] = lambda: False) -> None:
        bind_packer()  # as GroupConsumer does: the supervisor packs what it hands back
        self.world = world
        self.chunk = chunk
        self.on_idle = on_idle  # called each consume(): True stops handing out (the run is over)
        self.acknowledged: dict[tuple[str, int], int] = {}
        self.stats_summary: dict[str, float] = {}
        n = len(world.topic.arrivals)
        self.tps = [(world.topic.name, p) for p in range(n)]
        self.position = [0] * n
        self.paused: set[int] = set()
        self.commits = 0
        self._assign: Callable[[list[tuple[str, int]]], None] | None = None
        self._turn = 0

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self._assign = on_assign

    def _available(self, p: int) -> int:
        arrivals = self.world.topic.arrivals[p]
        pos = self.position[p]
        hi = len(arrivals)
        # arrivals are non-decreasing: how many of them have arrived by now
        lo_, hi_ = pos, hi
        while lo_ < hi_:
            mid = (lo_ + hi_) // 2
            if arrivals[mid] <= self.world.now:
                lo_ = mid + 1
            else:
                hi_ = mid
        return lo_ - pos

    def _next_arrival(self) -> float | None:
        best = None
        for p, arrivals in enumerate(self.world.topic.arrivals):
            if p in self.paused or self.position[p] >= len(arrivals):
                continue
            t = arrivals[self.position[p]]
            best = t if best is None else min(best, t)
        return best

    def consume(self, max_records: int, timeout_s: float) -> Fetched:
        w = self.world
        w.spend(w.costs.tick_us / 1e6)
        if self._assign is not None:
            assign, self._assign = self._assign, None
            assign(list(self.tps))
            return Fetched()
        if self.on_idle():
            return Fetched()
        out = self._take(max_records)
        if not out.count and timeout_s > 0:
            nxt = self._next_arrival()
            until = w.now + timeout_s if nxt is None else min(w.now + timeout_s, max(nxt, w.now))
            w.run_until(until)
            out = self._take(max_records)
        if out.count:
            w.spend(w.costs.record_us * out.count / 1e6)
        return out

    def _take(self, max_records: int) -> Fetched:
        out = Fetched()
        n = len(self.tps)
        topic = self.world.topic
        for i in range(n):
            if out.count >= max_records:
                break
            p = (self._turn + i) % n
            if p in self.paused:
                continue
            take = min(self._available(p), self.chunk, max_records - out.count)
            if take <= 0:
                continue
            start = self.position[p]
            self.position[p] += take
            out.runs[self.tps[p]] = [
                Message(topic=topic.name, partition=p, offset=o, key=topic.key(p, o), value=b"v" * 16,
                        timestamp=(1, 0)) for o in range(start, start + take)]
            out.count += take
        self._turn = (self._turn + 1) % n
        return out

    def pause(self, tps: Any) -> None:
        self.paused |= {tp[1] for tp in tps}

    def resume(self, tps: Any) -> None:
        self.paused -= {tp[1] for tp in tps}

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
        self.position[tp[1]] = offset
        return True

    def high_watermark(self, tp: Any) -> int | None:
        p = tp[1]
        return self.position[p] + self._available(p)  # what has arrived by now

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
