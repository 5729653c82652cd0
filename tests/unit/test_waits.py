"""How long a turn of the loop waits, and for what (runtime/supervisor/daemon/waits.py)."""

from __future__ import annotations

from runtime.supervisor.daemon.waits import Wait, Waits
from runtime.supervisor.scheduling.capacity import Capacity

HUNGRY = Capacity((2, 2), frozenset({1}), frozenset({1}), True)  # worker 1 idle, batches wait for 0
FULL = Capacity((2, 2), frozenset(), frozenset(), True)  # both rings full, batches waiting


def test_batches_waiting_for_busy_workers_wait_for_a_result() -> None:
    waits = Waits(batch_max_wait_ms=20)
    waits.fetched(300, wanted=2000)  # the client had no more
    assert waits.plan(FULL, open_records=True, fetching=True) == Wait(0.02, 0.0)
    assert waits.plan(HUNGRY, open_records=True, fetching=True) == Wait(0.001, 0.0)


def test_a_hungry_worker_never_waits_while_the_client_may_hold_records() -> None:
    """A consume() that returned all it was asked for may have left records in the client's
    queue: with a worker hungry, the loop takes them now instead of waiting for a result
    (issue 41: 1 ms waits on ~295 of 304 turns at ~10 µs a record, workers' rings empty)."""
    waits = Waits(batch_max_wait_ms=20)
    waits.fetched(2000, wanted=2000)
    assert waits.plan(HUNGRY, open_records=True, fetching=True) == Wait(None, 0.0)
    assert waits.plan(FULL, open_records=True, fetching=True) == Wait(0.02, 0.0), "no one hungry: as before"
    waits.fetched(0, wanted=0)  # asked for nothing (the backlog budget is full): nothing to take
    assert waits.plan(HUNGRY, open_records=True, fetching=True).workers_s == 0.002, "a wait, doubled"


IDLE = Capacity((2, 2), frozenset({0, 1}), frozenset({0, 1}), False)  # nothing in either ring


def test_a_quiet_daemon_waits_longer_for_records_and_never_for_a_result() -> None:
    """Nothing under way (Supervisor.quiet): the client's wait ends at the first record, so
    a longer one costs a record nothing and spares the idle turns (waits.py)."""
    waits = Waits(batch_max_wait_ms=20)
    waits.fetched(0, wanted=2000)
    assert waits.plan(IDLE, open_records=False, fetching=True, quiet=False) == Wait(None, 0.02)
    assert waits.plan(IDLE, open_records=False, fetching=True, quiet=True) == Wait(None, 0.1)
    assert waits.plan(IDLE, open_records=False, fetching=False, quiet=True) == Wait(0.1, 0.0), "all paused"
    assert waits.plan(IDLE, open_records=True, fetching=True, quiet=True) == \
        waits.plan(IDLE, open_records=True, fetching=True, quiet=False), "records to cut: never the long wait"
