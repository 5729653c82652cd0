"""Fakes for the supervisor's collaborators: a consumer that keeps librdkafka's pause state
the way librdkafka does (a new assignment starts fetching; a resume can be lost), worker
handles with rings of a given fill, a clock the test moves. The Supervisor takes them in
its constructor, as it takes the real ones."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from runtime.board import BOARD_BYTES, Board, EpochTable
from runtime.config import Settings
from runtime.kafka import Fetched
from runtime.supervisor import Supervisor

TP0, TP1 = ("t", 0), ("t", 1)


def msgs(tp: Any, *offsets: int, key: bytes | None = None) -> list[Message]:
    """Consumed messages as librdkafka hands them out (confluent-kafka's test constructor)."""
    return [Message(topic=tp[0], partition=tp[1], offset=o, key=key, value=b"v", timestamp=(1, 0))
            for o in offsets]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
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

    def reset(self) -> None:
        self.frames.clear()


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
    results: Any = None
    started_at: float = 0.0
    alive: bool = False
    pid: int | None = None


class FakePool:
    def __init__(self, n: int = 1, fill: float = 0.0) -> None:
        self.handles = [FakeHandle(i, FakeRing(fill)) for i in range(n)]
        self.killed: list[int] = []

    def spawn_worker(self, h: FakeHandle) -> None:
        h.incarnation += 1
        h.board.reset()

    def result_fds(self) -> list[int]:
        return []

    def sentinels(self) -> list[Any]:
        return []

    def dead(self) -> list[FakeHandle]:
        return []

    def kill(self, h: FakeHandle, sig: int = 9) -> None:
        self.killed.append(h.index)

    def watch_descendants(self) -> None:
        pass

    def reap_orphans(self) -> None:
        pass

    def stop_all(self, timeout_s: float, drain: Callable[[], None] = lambda: None) -> None:
        pass


class FakeConsumer:
    """Records the client's actual pause state as librdkafka would hold it."""

    def __init__(self) -> None:
        self.paused: set[Any] = set()
        self.calls: list[tuple[str, list[Any]]] = []
        self.ignore_next_resume = False
        self.commits: list[dict[Any, int]] = []
        self.refused: dict[Any, int] = {}
        self.seeks: list[tuple[Any, int]] = []
        self.seek_fails: set[Any] = set()
        self.started: list[list[Any]] = []
        self.high: dict[Any, int] = {}
        self.next_fetch: Callable[[int, float], Fetched] = lambda n, t: Fetched()
        self.abandoned = False
        self.stats_summary: dict[str, float] = {}

    def subscribe(self, topics: list[str], on_assign: Any, on_revoke: Any, on_lost: Any) -> None:
        pass

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

    def commit(self, offsets: dict[Any, int], asynchronous: bool) -> bool:
        self.commits.append(dict(offsets))
        return True

    def take_refused_commits(self) -> dict[Any, int]:
        refused, self.refused = self.refused, {}
        return refused

    def seek_to_start(self, tps: Any) -> list[Any]:
        tps = list(tps)
        self.started.append(tps)
        return [tp for tp in tps if tp in self.seek_fails]

    def seek(self, tp: Any, offset: int) -> bool:
        self.seeks.append((tp, offset))
        return True

    def high_watermark(self, tp: Any) -> int | None:
        return self.high.get(tp)

    def assign(self, tps: list[Any]) -> None:
        self.paused -= set(tps)  # a (re)assigned partition starts fetching

    def close(self, timeout_s: float = 0) -> bool:
        return True


def settings(**workers: Any) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1, **workers}})


def make(fill: float = 0.0, workers: int = 1, **w: Any) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    clock = Clock()
    pool = FakePool(workers, fill)
    consumer = FakeConsumer()
    epochs = EpochTable(memoryview(bytearray(8 * 16)))
    sup = Supervisor(settings(processes=workers, **w), consumer, pool, epochs, clock=clock)  # type: ignore[arg-type]
    sup.workforce.start_all()  # every worker starting: rings accept frames
    return sup, consumer, clock, pool


def assign(sup: Supervisor, consumer: FakeConsumer, tps: list[Any]) -> None:
    consumer.assign(tps)
    sup.assignment.on_assign(tps)
