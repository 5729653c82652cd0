"""What the rooms call on the worker pool and its handles: Protocols of what they use and no
more.

The real ones are runtime/supervisor/workers/pool.py WorkerPool and WorkerHandle;
tests/unit/fakes.py has fakes. Neither inherits from these: both fit them structurally,
which is what lets the rooms be built on fakes in the unit tests.

A pool is generic in its handle type: the workforce hands back to the pool the very handles
the pool gave it (spawn, kill, forget), so the rooms that pass handles on (the loop, the
workforce, results, rebalance) keep that type; those that never hand one back (caught_up,
rollout, report) take ``Workforce[Any]``.

:class:`PluginCode`, the one value the rooms hand the pool (what a worker runs), is here with
the pool's Protocol, so that naming it takes no room down to the real pool. Runs in:
supervisor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from runtime.transport.board import Board


@dataclass(frozen=True)
class PluginCode:
    """What a worker runs: the plugin module and its settings, as of one reading of the config
    (``generation`` 1 at start, one more for each reload)."""

    generation: int
    plugin: str
    settings: dict[str, Any]


class SlotRing(Protocol):
    """A worker's ring, as the scheduler and the workforce write to it."""

    def try_write(self, payload: bytes, /) -> bool: ...
    def write_position(self) -> int: ...
    def reader_reached(self, position: int, /) -> bool: ...


class SizedRing(SlotRing, Protocol):
    """... and as the loop sizes batches by it and the status reports it (transport/ring.py's
    Ring fits it)."""

    @property
    def capacity(self) -> int: ...
    @property
    def max_frame(self) -> int: ...
    def fill(self) -> float: ...


class Bell(Protocol):
    def ring(self) -> None: ...


class Process(Protocol):
    def join(self, timeout: float | None = ..., /) -> None: ...


class TimedLock(Protocol):
    """The lock a worker holds while it changes its board's current batch, as the supervisor
    takes it: with a timeout, and an answer of unknown when it runs out (transport/board.py
    BoardLock; rebalance.py)."""

    def acquire(self, timeout: float | None = ...) -> bool: ...
    def release(self) -> None: ...


class ResultPipe(Protocol):
    @property
    def fd(self) -> int:
        """Negative in the tests' fakes: nothing to wait on."""
    def read(self) -> list[bytes]: ...


class Slot(Protocol):
    """A worker slot, as the workforce drives its lives. Read-only here: the pool writes it."""

    @property
    def index(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def started_at(self) -> float: ...
    @property
    def board(self) -> Board: ...
    @property
    def ring(self) -> SlotRing: ...
    @property
    def bell(self) -> Bell | None: ...
    @property
    def process(self) -> Process | None: ...
    @property
    def alive(self) -> bool: ...
    @property
    def pid(self) -> int | None: ...


class Handle(Slot, Protocol):
    """A worker slot, as the other rooms see it too: its results, its lock, its ring's fill."""

    @property
    def ring(self) -> SizedRing: ...
    @property
    def lock(self) -> TimedLock: ...
    @property
    def results(self) -> ResultPipe | None: ...


S = TypeVar("S", bound=Slot)
H = TypeVar("H", bound=Handle)


class Pool(Protocol[S]):
    """The worker pool, as the workforce has it start, kill and reap workers."""

    @property
    def handles(self) -> Sequence[S]:
        """One per slot; grows (add_slot), never shrinks: an index is a slot."""
    @property
    def max_slots(self) -> int: ...

    def add_slot(self) -> S: ...
    def spawn_worker(self, h: S, code: PluginCode, /) -> None: ...
    def dead(self) -> list[S]: ...
    def forget(self, h: S, /) -> int | None: ...
    def kill(self, h: S, sig: int, /) -> None: ...
    def watch_descendants(self) -> None: ...
    def code_held(self, generation: int, /) -> bool: ...
    def reap_orphans(self) -> None: ...
    def reclaim_dead_runs(self) -> None: ...
    def stop_all(self, timeout_s: float, /) -> None:
        """Stop every worker; what they still report meanwhile is read and dropped."""


class LoopPool(Pool[S], Protocol[S]):
    """... and as the loop waits on its workers (a result, or a death)."""

    def result_fds(self) -> list[int]: ...
    def sentinels(self) -> list[Any]: ...
    def segment_paths(self) -> list[Path]: ...
