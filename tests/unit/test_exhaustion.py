"""A worker that runs out of a per-process resource (issue 17.8): the worker's fault, never
the records'. The batch is reported not done (EXHAUSTED), the worker leaves and is replaced
at once, and its batches run again uncounted – unless it ran out in its very first batch,
which then counts as a crash; and a worker is recycled before it runs out, at 80 % of its
RLIMIT_NOFILE."""

from __future__ import annotations

import errno
import sqlite3
from typing import Any

import pytest
from fakes import TP0, applied, assign, make, pending

from runtime.errors import WorkerExhausted
from runtime.execution.run import RetryPolicy, exhausted, run_batch
from runtime.plugin import Plugin, Record
from runtime.supervisor.workers import workforce as workforce_module
from runtime.supervisor.workers.workforce import State
from runtime.transport.board import BOARD_BYTES, Board
from runtime.transport.frames import DONE, EXHAUSTED, FRESH, WORN, BatchFrame, Columns, Result
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec


def _wrapped_emfile() -> BaseException:
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as exc:
            raise sqlite3.OperationalError("unable to open database file") from exc
    except sqlite3.OperationalError as wrapped:
        return wrapped


def _in_handler_enfile() -> BaseException:
    try:
        try:
            raise OSError(errno.ENFILE, "Too many open files in system")
        except OSError:
            raise RuntimeError("while handling it, something else failed")  # noqa: B904
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(("exc", "what"), [
    (OSError(errno.EMFILE, "Too many open files"),
     "file descriptors (OSError: [Errno 24] Too many open files)"),
    (_wrapped_emfile(), "file descriptors"),
    (_in_handler_enfile(), "the system's file table"),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), "memory"),
    (MemoryError(), "memory (MemoryError)"),
    (BlockingIOError(errno.EAGAIN, "try again"), None),
    (FileNotFoundError(errno.ENOENT, "no such file"), None),
    (ValueError("poison"), None),
])
def test_what_counts_as_running_out(exc: BaseException, what: str | None) -> None:
    got = exhausted(exc)
    assert (got is None) if what is None else (got is not None and got.startswith(what)), got


def _records(n: int) -> list[Record]:
    return [Record("in", 0, i, None, b"v", None, (1, 0)) for i in range(n)]


def test_a_plugin_out_of_descriptors_fails_no_record_and_is_not_retried() -> None:
    calls: list[int] = []

    def process(batch: Any) -> None:
        calls.append(len(batch))
        raise _wrapped_emfile()

    with pytest.raises(WorkerExhausted, match="file descriptors"):
        run_batch(Plugin("p", process, None, None), _records(8), RetryPolicy(3, 0, 0), sleep=lambda s: None)
    assert calls == [8], "no retry, no bisection: in this process every record would fail alike"


def _runner(process: Any, batches_done: int) -> BatchRunner:
    spec = WorkerSpec(0, 1, "/nonexistent", "/nonexistent", "p", {}, "out", "dlq", {}, 2, 0.0, 0.0, 1)
    board = Board(memoryview(bytearray(BOARD_BYTES)))
    board.reset()
    for i in range(batches_done):
        board.begin(i + 1, 0)
        board.end(1)
    return BatchRunner(Plugin("p", process, None, None), spec, board, object())  # type: ignore[arg-type]


@pytest.mark.parametrize(("batches_done", "cause"), [(0, FRESH), (3, WORN)])
def test_the_worker_reports_the_batch_not_done_and_whether_it_was_fresh(batches_done: int,
                                                                        cause: str) -> None:
    def process(batch: Any) -> None:
        raise MemoryError()

    frame = BatchFrame(7, 0, 1, "in", 0, Columns(0, None, [None], [b"v"], None, 0, [0]))
    result = _runner(process, batches_done).run(frame)
    assert (result.kind, result.batch_id, result.cause) == (EXHAUSTED, 7, cause)
    assert result.detail == "memory (MemoryError)" and result.dead_letters == 0


# ---------------------------------------------------------------------------- the supervisor
class _Process:
    def __init__(self, code: int) -> None:
        self.exitcode = code
        self.pid = 4242

    def join(self, timeout: float = 0) -> None:
        pass

    def close(self) -> None:
        pass


def _dies(pool: Any, h: Any, code: int = 0) -> None:
    """The worker process ends: the pool's reaping, as the real one does it."""
    h.process = _Process(code)
    h.alive = False
    pool.dead = lambda: [h] if h.process is not None else []

    def forget(handle: Any) -> int:
        handle.process = None
        pool.dead = lambda: []
        return code

    pool.forget = forget


def _batch_in_flight(sup: Any, batch_id: int) -> Any:
    """A batch of records 0..9 of TP0 written to worker 0's ring."""
    from test_supervisor_flow import out

    return out(sup, TP0, batch_id, 0, 9)


def test_a_worn_worker_out_of_descriptors_is_replaced_at_once_and_its_batch_runs_again_uncounted() -> None:
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    h = pool.handles[0]
    h.board.set_ready()
    sup.workforce.lives[0].state = State.READY
    b = _batch_in_flight(sup, 5)
    h.board.begin(5, b.slot)  # it was running batch 5 when it ran out
    emfile = "file descriptors (EMFILE)"
    applied(sup, h.index, Result(EXHAUSTED, 5, b.slot, b.epoch, detail=emfile, cause=WORN))
    assert sup.workforce.lives[0].state is State.RETIRING and not sup.workforce.takes_frames(0)
    _dies(pool, h)
    sup.manage_workers()
    life = sup.workforce.lives[0]
    assert life.exits == {"exhausted": 1} and life.crashes == 0
    assert "ran out of file descriptors (EMFILE)" in (life.last_exit or "")
    assert b.crashes == 0 and pending(sup, TP0) == 1, "back in its lane, uncounted"
    assert not sup.scheduler.out_on(0, b.batch_id)
    clock.now += 0.01
    sup.manage_workers()
    assert life.state is State.STARTING, "replaced at once, no back-off"
    assert sup.dead_letters is None and not sup.partitions[TP0].pause.holds, "nothing failed, nothing held"


def test_a_fresh_worker_out_of_descriptors_in_its_first_batch_counts_a_crash_of_that_batch() -> None:
    sup, consumer, _clock, pool = make()
    assign(sup, consumer, [TP0])
    h = pool.handles[0]
    h.board.set_ready()
    sup.workforce.lives[0].state = State.READY
    b = _batch_in_flight(sup, 5)
    h.board.begin(5, b.slot)
    emfile = "file descriptors (EMFILE)"
    applied(sup, h.index, Result(EXHAUSTED, 5, b.slot, b.epoch, detail=emfile, cause=FRESH))
    _dies(pool, h)
    sup.manage_workers()
    assert b.crashes == 1, "a batch that exhausts a fresh worker is at fault: isolation may follow"
    assert sup.workforce.lives[0].state is State.RESTARTING and sup.workforce.lives[0].restart_at is not None


def test_an_exhausted_worker_that_does_not_leave_is_stopped() -> None:
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    h = pool.handles[0]
    h.alive = True
    h.board.reset()
    h.board.beat()
    sup.workforce.lives[0].state = State.READY
    applied(sup, h.index, Result(EXHAUSTED, 5, 0, 1, detail="memory (MemoryError)", cause=WORN))
    clock.now += workforce_module._EXHAUSTED_EXIT_S + 1
    h.board.beat()
    sup.workforce._enforce_bounds(h, sup.workforce.lives[0], clock.now)
    assert pool.killed == [0] and "ran out of memory" in (sup.workforce.lives[0].kill or "")
    assert not sup.workforce.lives[0].kill_blames_batch, "judged as its EXHAUSTED report: not the batch's"


class _Proc:
    def __init__(self, fds: int, limit: int) -> None:
        self.fds, self.limit = fds, limit

    def num_fds(self) -> int:
        return self.fds

    def rlimit(self, which: int) -> tuple[int, int]:
        return self.limit, self.limit

    def memory_info(self) -> Any:
        raise AssertionError("max_rss_mb is off: memory is not read")


@pytest.mark.parametrize(("fds", "recycled"), [(700, False), (819, False), (820, True), (1000, True)])
def test_a_worker_near_its_descriptor_limit_is_recycled_between_batches(monkeypatch: pytest.MonkeyPatch,
                                                                        fds: int, recycled: bool) -> None:
    sup, _consumer, _clock, pool = make()
    h = pool.handles[0]
    h.alive, h.pid = True, 4242
    sup.workforce.lives[0].state = State.READY
    monkeypatch.setattr(workforce_module.psutil, "Process", lambda pid: _Proc(fds, 1024))
    sup.workforce._recycle_if_needed(sup.scheduler.counts(), watch=True)
    assert (sup.workforce.stops_due() == [0]) is recycled and sup.workforce.takes_frames(0) is not recycled
    sup.manage_workers()  # the loop hands the STOP frame due to the scheduler, which writes it
    assert (sup.workforce.lives[0].state is State.RETIRING) is recycled
    assert (h.ring.frames != []) is recycled, "a STOP frame behind the work in its ring"


def test_a_done_batch_is_still_done() -> None:
    frame = BatchFrame(1, 0, 1, "in", 0, Columns(0, None, [None], [b"v"], None, 0, [0]))
    assert _runner(lambda batch: None, 0).run(frame).kind == DONE


def test_a_supervisor_out_of_descriptors_starts_the_worker_later_and_lives_on() -> None:
    """Issue 17.4's neighbour: spawning a worker needs pipes; EMFILE there must not end the
    supervisor (it was an exception out of the loop: exit 1, 'internal error')."""
    sup, _consumer, clock, pool = make()
    h = pool.handles[0]
    failures = [2]

    def spawn(handle: Any, code: Any = None) -> None:
        if failures[0]:
            failures[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        handle.incarnation += 1

    pool.spawn_worker = spawn
    life = sup.workforce.lives[0]
    life.state, life.restart_at = State.RESTARTING, clock.now
    for _ in range(3):
        sup.manage_workers()  # never raises
        clock.now += 60
    assert failures == [0] and life.state is State.STARTING and h.incarnation == 2
