"""The naive peer, simulated: ``multiprocessing.Pool(N).imap_unordered(work, records,
chunksize=100)`` fed by one parent that consumes the records. The parent is serial and pays
the same costs as the supervisor (per record fetched, per chunk sent, per chunk's result
read, and its loop's turn); a chunk leaves once its 100 records have reached the parent
through the same model of the Kafka client as ringmaster's (world.Fetcher, with librdkafka's
defaults, as the benches' parent has them) and it has read them; the N workers take chunks
first come, first served, each paying the per-batch cost once per chunk. No order is kept,
nothing is committed: this is the peer's upper bound. (Until issue 41 the parent read every
record the moment it existed, with no client between: at the start of a short run it was
busy while ringmaster's first fetch was still on its way.)"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from benchkit.sim.world import Client, Costs, Fetcher, Topic, World

CHUNK = 100
POLL = 1000  # records the parent asks consume() for


@dataclass
class PoolRun:
    elapsed_s: float
    parent_busy_s: float
    busy_s: list[float]
    latencies: list[float]


def handed_out(topic: Topic, client: Client, costs: Costs) -> list[tuple[float, int, int]]:
    """(when, partition, offset) of every record, in the order and at the time the client can
    hand it to consume(): the fetcher alone, its queue taken as fast as it fills (the parent's
    own pace is applied by the caller)."""
    world = World(topic, 0, costs)
    fetcher = world.fetcher = Fetcher(world, client)
    out: list[tuple[float, int, int]] = []
    while len(out) < topic.total:
        if not fetcher.queued:
            at = fetcher.next_event_at()
            assert at is not None, "records left and nothing to fetch them"
            world.run_until(at, until=lambda: fetcher.queued > 0)
            continue
        for p, first, end in fetcher.take(POLL):
            out += [(world.now, p, o) for o in range(first, end)]
    return out


def simulate_pool(topic: Topic, workers: int, costs: Costs, batch_us: float) -> PoolRun:
    records = handed_out(topic, Client(), costs)
    parent = 0.0
    parent_busy = 0.0
    free = [(0.0, w) for w in range(workers)]  # (free at, worker)
    busy = [0.0] * workers
    latencies: list[float] = []
    end = 0.0
    # Per chunk: sending it and reading its result, and a share of the parent's turn: one
    # consume(1000) a turn, as the benches' parent (scripts/benchkit/runners.py).
    per_chunk_s = (costs.frame_us + costs.result_us + costs.tick_us * CHUNK / POLL) / 1e6
    for i in range(0, len(records), CHUNK):
        chunk = records[i:i + CHUNK]
        for t, _p, _o in chunk:  # the parent reads each record once the client has it
            parent = max(parent, t) + costs.record_us / 1e6
            parent_busy += costs.record_us / 1e6
        parent += per_chunk_s
        parent_busy += per_chunk_s
        at, w = heapq.heappop(free)
        start = max(at, parent)
        took = batch_us / 1e6 + sum(topic.costs[p][o] for _t, p, o in chunk)
        done = start + took
        busy[w] += took
        latencies += [done - topic.arrivals[p][o] for _t, p, o in chunk]
        end = max(end, done)
        heapq.heappush(free, (done, w))
    return PoolRun(max(end, parent), parent_busy, busy, latencies)
