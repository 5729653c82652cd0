"""Fakes for the supervisor's collaborators: a consumer that keeps librdkafka's pause state
the way librdkafka does (a new assignment starts fetching; a resume can be lost), worker
handles whose rings record the frames written to them and whose result pipes deliver what a
test reports, a clock the test moves. The Supervisor takes them in its constructor, as it
takes the real ones."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Message

from runtime.config import Settings
from runtime.errors import DeliveryFailed, SharedMemoryError
from runtime.kafka.consumer import Fetched
from runtime.kafka.group_offsets import GroupStanding
from runtime.kafka.messages import bind_packer
from runtime.kafka.offset_commits import CommitResult
from runtime.ops.metrics import Histograms
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.partition.partition import Outside, Partition
from runtime.supervisor.scheduling.capacity import Capacity
from runtime.supervisor.workers.workforce import NO_LIMIT
from runtime.transport.board import BOARD_BYTES, Board, EpochTable
from runtime.transport.frames import Result, encode_result

TP0, TP1 = ("t", 0), ("t", 1)


def msgs(tp: Any, *offsets: int, key: bytes | None = None) -> list[Message]:
    """Consumed messages as librdkafka hands them out (confluent-kafka's test constructor)."""
    return [Message(topic=tp[0], partition=tp[1], offset=o, key=key, value=b"v", timestamp=(1, 0))
            for o in offsets]


class Clock:
    """The time a test sets; ``step``: how far each reading moves it (for loops that wait)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.step = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@dataclass
class FakeRing:
    fill_value: float = 0.0
    capacity: int = 1000
    max_frame: int = 10_000
    frames: list[bytes] = field(default_factory=list)
    accept: bool = True

    def fill(self) -> float:
        return self.fill_value

    def used_bytes(self) -> int:
        return int(self.fill_value * self.capacity)

    def try_write(self, frame: bytes) -> bool:
        if not self.accept:
            return False
        self.frames.append(frame)
        return True

    def write_position(self) -> int:
        return 0

    def reader_reached(self, position: int) -> bool:
        return True

    def take(self) -> list[bytes]:
        """What the worker would read next, taken from the ring."""
        frames, self.frames = self.frames, []
        return frames

    def reset(self) -> None:
        self.frames.clear()


class FakeResults:
    """A worker's result pipe: results a test reports are read by the supervisor's next drain."""

    fd = -1

    def __init__(self) -> None:
        self.messages: list[bytes] = []

    def read(self) -> list[bytes]:
        out, self.messages = self.messages, []
        return out


class FakeLock:
    def acquire(self, timeout: float | None = None) -> bool:
        return True

    def release(self) -> None:
        pass


@dataclass(eq=False)
class FakeHandle:
    index: int
    ring: FakeRing = field(default_factory=FakeRing)
    board: Board = field(default_factory=lambda: Board(memoryview(bytearray(BOARD_BYTES))))
    lock: FakeLock = field(default_factory=FakeLock)
    incarnation: int = 0
    process: Any = None
    bell: Any = None
    results: FakeResults = field(default_factory=FakeResults)
    started_at: float = 0.0
    alive: bool = False
    pid: int | None = None


class FakePool:
    def __init__(self, n: int = 1, fill: float = 0.0, max_slots: int = 0) -> None:
        self.handles = [FakeHandle(i, FakeRing(fill)) for i in range(n)]
        self.epochs = EpochTable(memoryview(bytearray(8 * 16)))  # what the supervisor fences
        self.max_slots = max(max_slots, n + 1)
        self.killed: list[int] = []
        self.codes: dict[int, Any] = {}  # slot -> the code its last incarnation was started with

    def add_slot(self) -> FakeHandle:
        h = FakeHandle(len(self.handles))
        self.handles.append(h)
        return h

    def spawn_worker(self, h: FakeHandle, code: Any = None) -> None:
        h.incarnation += 1
        h.board.reset()
        self.codes[h.index] = code

    def result_fds(self) -> list[int]:
        return []

    def sentinels(self) -> list[Any]:
        return []

    def segment_paths(self) -> list[Path]:
        return []

    def dead(self) -> list[FakeHandle]:
        return []

    def forget(self, h: FakeHandle) -> int | None:
        return None  # never called: no worker here dies (dead() is empty)

    def kill(self, h: FakeHandle, sig: int = 9) -> None:
        self.killed.append(h.index)

    def watch_descendants(self) -> None:
        pass

    def code_held(self, generation: int) -> bool:
        return False

    def reap_orphans(self) -> None:
        pass

    def reclaim_dead_runs(self) -> None:
        pass

    def stop_all(self, timeout_s: float) -> None:
        pass


class FakeConsumer:
    """Records the client's actual pause state as librdkafka would hold it."""

    def __init__(self) -> None:
        bind_packer()  # as GroupConsumer does: the supervisor packs what it hands back
        self.paused: set[Any] = set()
        self.calls: list[tuple[str, list[Any]]] = []
        self.ignore_next_resume = False
        self.commits: list[dict[Any, int]] = []
        self.refused: dict[Any, int] = {}
        self.refuse_sync: dict[Any, str] = {}  # synchronous commits the broker refuses: tp -> why
        self.acknowledged: dict[Any, int] = {}
        self.seeks: list[tuple[Any, int]] = []
        self.seek_fails: set[Any] = set()
        self.started: list[list[Any]] = []
        self.high: dict[Any, int] = {}
        self.next_fetch: Callable[[int, float], Fetched] = lambda n, t: Fetched()
        self.abandoned = False
        self.stats_summary: dict[str, float] = {}
        self.group: GroupStanding | None = None
        self.group_asks: list[bool] = []
        self.settled: GroupStanding | None = None
        self.settle_asks = 0
        self.callbacks: dict[str, Any] = {}  # what subscribe() was given, as librdkafka keeps it

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        self.callbacks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}

    def consume(self, n: int, timeout: float) -> Fetched:
        return self.next_fetch(n, timeout)

    def pause(self, tps: Any) -> None:
        tps = list(tps)
        self.calls.append(("pause", tps))
        self.paused |= set(tps)

    def resume(self, tps: Any) -> None:
        tps = list(tps)
        self.calls.append(("resume", tps))
        if self.ignore_next_resume and tps:
            self.ignore_next_resume = False  # the pause-assign-resume race: lost
            return
        self.paused -= set(tps)

    def commit(self, offsets: dict[Any, int], asynchronous: bool, timeout_s: float = 30.0) -> CommitResult:
        self.commits.append(dict(offsets))
        if asynchronous:
            return CommitResult(True)
        refused = {tp: self.refuse_sync[tp] for tp in offsets if tp in self.refuse_sync}
        self.acknowledged.update({tp: o for tp, o in offsets.items() if tp not in refused})
        return CommitResult(True, refused)

    def take_refused_commits(self) -> dict[Any, int]:
        refused, self.refused = self.refused, {}
        return refused

    def release(self, tp: Any, run: Any, keep: bool = False) -> None:
        pass

    def seek_to_start(self, tps: Any) -> list[Any]:
        tps = list(tps)
        self.started.append(tps)
        return [tp for tp in tps if tp in self.seek_fails]

    def seek(self, tp: Any, offset: int) -> bool:
        if tp in self.seek_fails:
            return False
        self.seeks.append((tp, offset))
        return True

    def high_watermark(self, tp: Any) -> int | None:
        return self.high.get(tp)

    def group_standing(self, ask_committed: bool, settle_s: float = 0.0,
                       held: Any = ()) -> GroupStanding | None:
        """A test sets ``group`` to give the member a view of the group (None: judged alone);
        ``settled``, if set, is the view a stable read waited for (``settle_s``) gives."""
        self.group_asks.append(ask_committed)
        if settle_s > 0:
            self.settle_asks += 1
            if self.settled is not None:
                return self.settled
        return self.group

    def assign(self, tps: list[Any]) -> None:
        self.paused -= set(tps)  # a (re)assigned partition starts fetching

    def stop(self) -> None:
        pass

    def close(self, timeout_s: float = 0) -> bool:
        return True


def settings(dead_letter: dict[str, Any] | None = None, **workers: Any) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1, **workers},
        "dead_letter": dead_letter or {}})


def make(workers: int = 1, desk: DeadLetterDesk | None = None, dead_letter: dict[str, Any] | None = None,
         histograms: Histograms | None = None, **w: Any) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    """A supervisor with fakes; ``desk``: its own dead-letter desk (make_desk), ``dead_letter``:
    that section of the settings, ``histograms``: what it feeds."""
    clock = Clock()
    pool = FakePool(workers)
    consumer = FakeConsumer()
    sup = Supervisor(settings(dead_letter, processes=workers, **w), consumer, pool, pool.epochs, clock=clock,
                     dead_letters=desk, histograms=histograms)
    sup.workforce.start_all()  # every worker starting: rings accept frames
    return sup, consumer, clock, pool


class FakeProducer:
    """The dead-letter desk's producer: queues messages; the test decides each one's
    delivery report (deliver_next), as the broker would."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.pending: list[tuple[Any, dict[str, Any]]] = []
        self.fatal: str | None = None
        self.refuse_produce = False

    @property
    def broken(self) -> bool:
        return self.fatal is not None

    def produce(self, topic: str, value: bytes | None, key: bytes | None, headers: Any, on_delivery: Any,
                queue_wait_s: float) -> None:
        if self.refuse_produce:
            raise DeliveryFailed("local queue full")
        msg = {"topic": topic, "value": value, "key": key, "headers": dict(headers),
               "queue_wait_s": queue_wait_s}
        self.sent.append(msg)
        self.pending.append((on_delivery, msg))

    def poll(self, timeout: float = 0) -> None:
        pass

    def note(self, err: Any) -> None:
        pass

    def deliver_next(self, err: Any = None) -> None:
        cb, _msg = self.pending.pop(0)
        cb(err, None)

    def flush(self, timeout: float) -> int:
        return 0


def make_desk(clock: Callable[[], float], max_bytes: int = 1_000_000) -> tuple[DeadLetterDesk, FakeProducer]:
    p = FakeProducer()
    return DeadLetterDesk("dlq", lambda: p, max_bytes, clock, backoff_s=1.0, backoff_max_s=4.0), p  # type: ignore[arg-type,return-value]


class _Nobody:
    """What a partition made alone in a test tells its changes to: nobody (epoch 1)."""

    def fence(self, slot: int) -> int:
        return 1

    def release(self, tp: Any, run: Any, keep: bool = False) -> None:
        pass

    def seek(self, tp: Any, offset: int) -> bool:
        return True

    def discard(self, tp: Any) -> list[Any]:
        return []


def partition(tp: Any = TP0, batch_records: int = 500, share: bool = False) -> Partition:
    """A partition on its own, outside any supervisor."""
    nobody = _Nobody()
    return Partition(tp, 0, batch_records, Outside(nobody, nobody, nobody, lambda: 0.0), 0.0, share)


def room(workers: int = 1) -> Capacity:
    """Every worker has room and nothing waits for one: a cut takes whatever is open."""
    return Capacity((NO_LIMIT,) * workers, frozenset(range(workers)), frozenset(range(workers)), False)


def assign(sup: Supervisor, consumer: FakeConsumer, tps: list[Any]) -> None:
    """The group assigns tps inside a consume() that returns nothing: the client assigns them
    (and forgets pauses) and calls back; the loop's rebalance step applies the assignment and
    starts each partition at its committed offset."""
    consumer.assign(tps)
    sup.rebalance.on_assign(tps)
    sup.rebalanced(Fetched())


def revoke(sup: Supervisor, tps: list[Any]) -> None:
    """The group revokes tps inside a consume() that returns nothing: the callback releases
    them (fence, wait, commit, forget) and the loop's rebalance step hears what that left."""
    sup.rebalance.on_revoke(tps)
    sup.rebalanced(Fetched())


def lose(sup: Supervisor, tps: list[Any]) -> None:
    """The same for partitions lost (nothing committed)."""
    sup.rebalance.on_lost(tps)
    sup.rebalanced(Fetched())


def assign_in_consume(sup: Supervisor, consumer: FakeConsumer, tps: list[Any]) -> None:
    """The callback alone, as librdkafka runs it inside consume(): the loop's rebalance step
    applies it once consume() returns."""
    consumer.assign(tps)
    sup.rebalance.on_assign(tps)


def fetch(sup: Supervisor) -> Fetched:
    """The tick's steps up to the cut, as the loop runs them: wait, consume() (its callbacks),
    the rebalance step, start retries, the fatal check, the records handed to the partitions."""
    capacity = sup.capacity()
    fetched = sup.fetch(capacity, sup.intake.within_the_lock(sup.flow.records_wanted()))
    sup.rebalanced(fetched)
    sup.starts.retry(fetched)
    sup.check_fatal()
    sup.take(fetched)
    return fetched


def start(sup: Supervisor, consumer: FakeConsumer, tps: list[Any]) -> None:
    """The group assigns tps and the next tick settles them (each starts at its committed
    offset), as the loop does."""
    assign_in_consume(sup, consumer, tps)
    fetch(sup)


def cut(sup: Supervisor, drained: bool = True) -> None:
    """The tick's cut as if every worker had room: batches to the lanes, records set aside
    dead-lettered."""
    sup.cut(room(len(sup.pool.handles)), drained)


def feed(sup: Supervisor, consumer: FakeConsumer, tp: Any, messages: list[Message]) -> None:
    """One tick's intake, as the loop runs it: consume() returns these messages; they are
    cut, what fits no ring is set aside for a dead letter, the rest goes to rings."""
    consumer.next_fetch = lambda n, t: Fetched(runs={tp: messages}, count=len(messages))
    fetch(sup)
    consumer.next_fetch = lambda n, t: Fetched()
    cut(sup)
    dispatch(sup)


def dispatch(sup: Supervisor) -> None:
    """The tick's placing: batches to rings, as far as the workers have room now."""
    sup.scheduler.dispatch(sup.capacity())



def applied(sup: Supervisor, worker: int, result: Result) -> None:
    """Worker ``worker``'s report, read and applied (as the loop's collect does)."""
    sup.applier.apply(sup.results.apply(worker, result))


def redeliver(sup: Supervisor, death: Any) -> None:
    """A dead worker's batches, back in their lanes (as the loop's manage_workers does)."""
    sup.applier.apply(sup.results.redeliver(death))


def pending(sup: Supervisor, tp: Any) -> int:
    """Batches of tp cut and waiting for a ring."""
    return sup.scheduler.snapshot().pending.get(tp, 0)


def status(sup: Supervisor) -> Any:
    """The status snapshot as the loop builds it now."""
    return sup.reporter.snapshot(sup.sections(), 0.0, True, None)


def report(pool: FakePool, worker: int, result: Result) -> None:
    """Worker `worker` writes `result` on its result pipe."""
    pool.handles[worker].results.messages.append(encode_result(result))


class RingWorker:
    """A worker's side of its ring, run by the test in the supervisor's own thread: each
    read of its result pipe (the supervisor's ``collect``) finishes the batch in progress
    (DONE) and starts the next frame through the worker's real fence check, against the
    epoch table the supervisor fences and the board it reads. Plug it in as the handle's
    ``results``; ``step()`` runs it outside a read."""

    fd = -1

    def __init__(self, pool: FakePool, index: int, busy_for: int = 1, pipelined: bool = False) -> None:
        """``pipelined``: as a worker whose outputs are in flight while it runs its next batch
        (runtime/worker/batch_runner.py): a finished batch is handed over on the board and
        reported when the next one finishes, or when the ring has nothing more."""
        from runtime.worker.fence import FenceCheck

        self.h = pool.handles[index]
        self.h.alive = True
        self.h.results = self  # type: ignore[assignment]
        self.fence = FenceCheck(pool.epochs, self.h.board, _NoLock())
        self.busy_for = busy_for  # reads a batch takes before it is done
        self.current: Any = None
        self.left = 0
        self.ran: list[int] = []  # batch ids begun, in order
        self.fenced: list[int] = []  # batch ids skipped
        self.messages: list[bytes] = []
        self.pipelined = pipelined
        self.delivering: Any = None  # pipelined: the batch handed over, reported later

    def _report(self, f: Any) -> None:
        from runtime.transport.frames import DONE

        done = Result(DONE, f.batch_id, f.slot, f.epoch, processed=len(f.columns))
        self.messages.append(encode_result(done))

    def step(self) -> None:
        from runtime.transport.frames import FENCED, decode_frame

        if self.current is not None:
            self.left -= 1
            if self.left > 0:
                return
            f, self.current = self.current, None
            if self.delivering is not None:  # settled before this one's outputs go out
                self._report(self.delivering)
                self.h.board.delivered(len(self.delivering.columns))
                self.delivering = None
            if self.pipelined:
                self.h.board.hand_over()
                self.delivering = f
            else:
                self._report(f)
                self.h.board.end(len(f.columns))
        if self.delivering is not None and not self.h.ring.frames:  # nothing to run meanwhile
            self._report(self.delivering)
            self.h.board.delivered(len(self.delivering.columns))
            self.delivering = None
        while self.h.ring.frames:
            raw = self.h.ring.frames.pop(0)
            f = decode_frame(raw)
            assert f is not None
            if self.fence.admit(f.batch_id, f.slot, f.epoch):
                self.ran.append(f.batch_id)
                self.current, self.left = f, self.busy_for
                return
            self.fenced.append(f.batch_id)
            self.messages.append(encode_result(Result(FENCED, f.batch_id, f.slot, f.epoch)))

    def read(self) -> list[bytes]:
        self.step()
        out, self.messages = self.messages, []
        return out


class _NoLock:
    def __enter__(self) -> _NoLock:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


# ---------------------------------------------------------------------- process-level fakes
# For the rooms that judge workers by their processes (workforce, rollout): processes with an
# exit code a test sets, rings that keep the frames written to them, one clock for the rooms
# and the boards (tests patch runtime.transport.board's time with TickClock.ns).
class TickClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def ns(self) -> int:
        return int(self.now * 1e9)


@dataclass
class FakeProcess:
    pid: int
    exitcode: int | None = None

    def join(self, timeout: float | None = None) -> None:
        pass


class StopRing:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.room = True

    def try_write(self, frame: bytes) -> bool:
        if self.room:
            self.frames.append(frame)
        return self.room

    def write_position(self) -> int:
        return len(self.frames)

    def reader_reached(self, position: int) -> bool:
        return True


@dataclass(eq=False)
class ProcHandle:
    index: int
    board: Board
    ring: StopRing = field(default_factory=StopRing)
    bell: Any = None
    started_at: float = 0.0
    process: FakeProcess | None = None
    incarnation: int = 0

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class ProcPool:
    def __init__(self, processes: int, clock: TickClock, max_slots: int = 0) -> None:
        self.clock = clock
        self.handles = [ProcHandle(i, Board(memoryview(bytearray(BOARD_BYTES)))) for i in range(processes)]
        self.max_slots = max(max_slots, processes + 1)
        self.codes: dict[int, Any] = {}
        self.spawned: list[int] = []
        self.kills: list[tuple[int, int]] = []
        self.forgotten: list[int] = []
        self.watched = 0
        self.reaped = 0
        self.reclaims = 0
        self.no_room: str | None = None  # add_slot fails with this (shm_dir full)
        self._pid = 5000

    # --- what Workforce calls
    def add_slot(self) -> ProcHandle:
        if self.no_room is not None:
            raise SharedMemoryError(self.no_room)
        h = ProcHandle(len(self.handles), Board(memoryview(bytearray(BOARD_BYTES))))
        self.handles.append(h)
        return h

    def spawn_worker(self, h: ProcHandle, code: Any = None) -> None:
        self.codes[h.index] = code
        h.incarnation += 1
        h.board.reset()
        self._pid += 1
        h.process = FakeProcess(self._pid)
        h.started_at = self.clock()
        self.spawned.append(h.index)

    def dead(self) -> list[ProcHandle]:
        return [h for h in self.handles if h.process is not None and h.process.exitcode is not None]

    def forget(self, h: ProcHandle) -> int | None:
        assert h.process is not None
        code = h.process.exitcode
        h.process = None
        self.forgotten.append(h.index)
        return code

    def kill(self, h: ProcHandle, sig: int = signal.SIGKILL) -> None:
        if h.alive:
            self.kills.append((h.index, sig))

    def watch_descendants(self) -> None:
        self.watched += 1

    def code_held(self, generation: int) -> bool:
        return False

    def reap_orphans(self) -> None:
        self.reaped += 1

    def reclaim_dead_runs(self) -> None:
        self.reclaims += 1

    def stop_all(self, timeout_s: float) -> None:
        for h in self.handles:
            if h.alive:
                assert h.process is not None
                h.process.exitcode = -signal.SIGTERM

    # --- test helpers
    def exit(self, i: int, code: int) -> None:
        p = self.handles[i].process
        assert p is not None and p.exitcode is None, "not running"
        p.exitcode = code
