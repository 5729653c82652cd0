"""One consumer configuration per process: `python -m benchkit.runners KIND ...` consumes
the whole topic from the start with a fresh group, commits everything, and prints one
JSON line: records, window_s (first record consumed → all offsets committed), and the
CPU seconds of the main process and of its worker processes."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from benchkit.work import do_work, work_batch
from runtime.kafka.topic_reader import partition_bounds

FETCH = {"fetch.queue.backoff.ms": 10, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
         "enable.partition.eof": True, "enable.auto.commit": False, "auto.offset.reset": "earliest"}


class WindowCPU:
    """CPU seconds of this process and of its children between the first record and the
    end, so that start-up and group joins do not count (ringmaster reports the same)."""

    def __init__(self) -> None:
        self.me = psutil.Process()
        self.at_start: tuple[float, dict[int, float]] | None = None
        self.used: tuple[float, float] = (0.0, 0.0)

    def _sample(self) -> tuple[float, dict[int, float]]:
        t = self.me.cpu_times()
        kids = {}
        for k in self.me.children(recursive=True):
            try:
                kt = k.cpu_times()
                kids[k.pid] = kt.user + kt.system
            except psutil.Error:
                pass
        return t.user + t.system, kids

    def start(self) -> None:
        if self.at_start is None:
            self.at_start = self._sample()

    def stop(self) -> None:
        assert self.at_start is not None
        me, kids = self._sample()
        me0, kids0 = self.at_start
        self.used = (me - me0, sum(v - kids0.get(pid, 0.0) for pid, v in kids.items()))


CPU = WindowCPU()


def _commit(c: Consumer, offsets: Mapping[tuple[str, int], int], asynchronous: bool = False) -> None:
    if offsets:
        c.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                 asynchronous=asynchronous)


class Outputs:
    """--output-topic: one output a record (the work's result), produced by this process and
    delivered before the offsets of its records are committed (what a user's loop must do)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.topic = args.output_topic
        self.p = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 5}) if self.topic else None

    def send(self, results: list[int]) -> None:
        if self.p is None:
            return
        for r in results:
            while True:
                try:
                    self.p.produce(self.topic, b"%08x" % (r & 0xFFFFFFFF))
                    break
                except BufferError:
                    self.p.poll(0.01)
        self.p.poll(0)

    def flush(self) -> None:
        """Every output acknowledged: only then may the offsets be committed."""
        if self.p is not None and self.p.flush(60):
            raise RuntimeError("outputs not delivered in 60 s")


def _plain_loop(c: Consumer, args: argparse.Namespace, records: int) -> tuple[int, float | None, float]:
    """Consume(1000) and work, produce the outputs, commit once a second and at the end, until
    ``records`` records. Returns the records, the first one's time and the end."""
    out = Outputs(args)
    done, first, offsets, last_commit = 0, None, {}, time.monotonic()
    while done < records:
        msgs = [m for m in c.consume(1000, 0.1) if not m.error()]
        if msgs and first is None:
            first = time.monotonic()
            CPU.start()
        results = work_batch(args.workload, args.iterations, [m.value() for m in msgs])
        for m in msgs:
            offsets[(m.topic(), m.partition())] = m.offset() + 1
        done += len(msgs)
        out.send(results)
        if time.monotonic() - last_commit >= 1:
            out.flush()
            _commit(c, offsets, asynchronous=True)
            last_commit = time.monotonic()
    out.flush()
    _commit(c, offsets)
    end = time.monotonic()
    CPU.stop()
    return done, first, end


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """One process: the plain loop (``_plain_loop``) as a group member."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, **FETCH})
    c.subscribe([args.topic])
    done, first, end = _plain_loop(c, args, args.records)
    c.close()
    return {"records": done, "window_s": end - (first or end)}


def _copy(args: argparse.Namespace, share: dict[int, tuple[int, int]], ready: Any, results: Any) -> None:
    """One copy of the plain loop over its share of the partitions (partition -> first and end
    offset), from their start to their end, once every copy is up (``ready``: a barrier, so
    that no copy's start-up counts). Puts its records, first and end times, and its CPU
    seconds in that window on ``results``."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, **FETCH})
    c.assign([TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in share])
    ready.wait()
    done, first, end = _plain_loop(c, args, sum(e - f for f, e in share.values()))
    c.close()
    results.put((done, first, end, CPU.used[0]))


def copies(args: argparse.Namespace) -> dict[str, Any]:
    """N copies of the plain loop, one process each, the partitions dealt out as a group would
    settle them (partition p to copy p mod N, no rebalance in the window): what running the
    single-process consumer N times on the host gives. Window: the first record of any copy to
    the last copy's final commit; CPU: each copy's own window (no consumer side here)."""
    bounds = partition_bounds(args.topic, {"bootstrap.servers": args.bootstrap, "group.id": args.group}, 30)
    parts = sorted(bounds)
    shares = [{p: bounds[p] for p in parts[i::args.processes]} for i in range(args.processes)]
    shares = [s for s in shares if s]
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Barrier(len(shares)), ctx.Queue()
    procs = [ctx.Process(target=_copy, args=(args, share, ready, results)) for share in shares]
    for proc in procs:
        proc.start()
    ran = [results.get(timeout=900) for _ in procs]
    for proc in procs:
        proc.join()
    start = min(first for _, first, _, _ in ran if first is not None)
    end = max(e for _, _, e, _ in ran)
    CPU.used = (0.0, sum(cpu for *_, cpu in ran))
    return {"records": sum(done for done, *_ in ran), "window_s": end - start}


def _work_batch(payload: tuple[str, int, list[bytes]]) -> list[int]:
    workload, iterations, values = payload
    return work_batch(workload, iterations, values)


def pool(args: argparse.Namespace) -> dict[str, Any]:
    """The naive answer: multiprocessing.Pool(N) over pickled batches, commits in order."""
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, **FETCH})
    c.subscribe([args.topic])
    out = Outputs(args)  # the parent produces what the workers return
    done, first, last_commit = 0, None, time.monotonic()
    offsets: dict[tuple[str, int], int] = {}
    pending: list[tuple[Any, dict[tuple[str, int], int]]] = []
    with multiprocessing.get_context("spawn").Pool(args.processes) as p:
        while done < args.records:
            msgs = [m for m in c.consume(1000, 0.05) if not m.error()]
            if msgs:
                if first is None:
                    first = time.monotonic()
                    CPU.start()
                ends = {(m.topic(), m.partition()): m.offset() + 1 for m in msgs}
                pending.append((p.apply_async(_work_batch, ((args.workload, args.iterations,
                                                              [m.value() for m in msgs]),)), ends))
            while pending and (pending[0][0].ready() or len(pending) > 4 * args.processes):
                res, ends = pending.pop(0)
                results = res.get()
                out.send(results)
                done += len(results)
                offsets.update(ends)
            if time.monotonic() - last_commit >= 1:
                out.flush()
                _commit(c, offsets, asynchronous=True)
                last_commit = time.monotonic()
        out.flush()
        _commit(c, offsets)
        end = time.monotonic()
        CPU.stop()
    c.close()
    return {"records": done, "window_s": end - (first or end)}


def _arroyo_work(message: Any) -> int:
    workload, iterations = _ARROYO_WORK
    return do_work(workload, iterations, message.payload.value)


_ARROYO_WORK = ("trivial", 0)


def _arroyo_init(workload: str, iterations: int) -> None:
    global _ARROYO_WORK
    _ARROYO_WORK = (workload, iterations)


def arroyo(args: argparse.Namespace) -> dict[str, Any]:
    """sentry-arroyo's RunTaskWithMultiprocessing as its docs advise: N processes, batches
    of 1000, commits once per second (and fetch.queue.backoff.ms=10 for fairness)."""
    import functools

    from arroyo.backends.kafka import KafkaConsumer
    from arroyo.backends.kafka.configuration import build_kafka_consumer_configuration
    from arroyo.commit import ONCE_PER_SECOND
    from arroyo.processing.processor import StreamProcessor
    from arroyo.processing.strategies import CommitOffsets, ProcessingStrategyFactory
    from arroyo.processing.strategies.run_task_with_multiprocessing import (
        MultiprocessingPool,
        RunTaskWithMultiprocessing,
    )
    from arroyo.types import Topic

    state = {"first": None, "committed_at": None}
    ends: dict[int, int] = {}

    class Measured(KafkaConsumer):  # type: ignore[misc]
        def poll(self, timeout: float | None = None) -> Any:
            m = super().poll(timeout)
            if m is not None and state["first"] is None:
                state["first"] = time.monotonic()
                CPU.start()
            return m

        def commit_offsets(self) -> Any:
            result = super().commit_offsets()
            for part, off in (result or {}).items():
                ends[part.index] = off
            if sum(ends.values()) >= args.records and state["committed_at"] is None:
                state["committed_at"] = time.monotonic()
                CPU.stop()
            return result

    mp_pool = MultiprocessingPool(args.processes, functools.partial(_arroyo_init, args.workload,
                                                                     args.iterations))

    class Factory(ProcessingStrategyFactory):  # type: ignore[misc]
        def create_with_partitions(self, commit: Any, partitions: Any) -> Any:
            return RunTaskWithMultiprocessing(_arroyo_work, CommitOffsets(commit), max_batch_size=1000,
                                              max_batch_time=1.0, pool=mp_pool,
                                              input_block_size=16 * 2**20, output_block_size=16 * 2**20)

    config = build_kafka_consumer_configuration(
        {"bootstrap.servers": args.bootstrap}, group_id=args.group, auto_offset_reset="earliest",
        enable_auto_commit=False,
        override_params={"fetch.queue.backoff.ms": 10, "session.timeout.ms": 6000,
                         "heartbeat.interval.ms": 500})
    processor = StreamProcessor(Measured(config), Topic(args.topic), Factory(), ONCE_PER_SECOND)
    while state["committed_at"] is None:
        processor._run_once()
    processor._shutdown()
    mp_pool.close()
    return {"records": args.records, "window_s": state["committed_at"] - state["first"]}


def latency(args: argparse.Namespace) -> dict[str, Any]:
    """The single-process baseline for the latency figure: consume, work, stamp each record's
    produce → processed time, until SIGTERM. Commits once a second like a real consumer."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ldir = Path(args.latency_dir)
    c = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group, **FETCH,
                  "fetch.wait.max.ms": args.fetch_wait_ms})
    c.subscribe([args.topic], on_assign=lambda _c, _p: (ldir / "ready").touch())
    last_commit = time.monotonic()
    with open(ldir / f"{os.getpid()}.lat", "a") as out:
        while not stop:
            msgs = [m for m in c.consume(1000, 0.02) if not m.error()]
            stamps = []
            for m in msgs:
                do_work(args.workload, args.iterations, m.value())
                stamps.append(f"{(time.time_ns() - int(m.value()[:19])) / 1e6:.3f}\n")
            out.write("".join(stamps))
            out.flush()
            if time.monotonic() - last_commit >= 1:
                c.commit(asynchronous=True)
                last_commit = time.monotonic()
    c.close()
    return {"records": 0, "window_s": 0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["baseline", "copies", "pool", "arroyo", "latency"])
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--records", type=int, required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--iterations", type=int, default=0)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--latency-dir", default=None)
    ap.add_argument("--fetch-wait-ms", type=int, default=500)
    ap.add_argument("--output-topic", default=None,
                    help="baseline, copies, pool: produce one output a record here")
    args = ap.parse_args()
    kinds = {"baseline": baseline, "copies": copies, "pool": pool, "arroyo": arroyo, "latency": latency}
    result = kinds[args.kind](args)
    main_cpu, worker_cpu = CPU.used
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result.update(main_cpu_s=main_cpu, worker_cpu_s=worker_cpu,
                  total_cpu_s=me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime)
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
