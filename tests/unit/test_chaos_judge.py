"""The chaos suite's judge (tests/chaos/judge.py) on made-up runs: a run that injected less
than it was to, duplicated more than its faults explain, or left shared memory behind fails;
one that did what it says passes. (The judge is what makes a chaos run able to fail.)"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.judge import REQUIRED, Fault, Run, allowed_duplicates, in_flight, problems

T0 = 1_000.0


def handled(per_partition: int, partitions: int = 2, every_s: float = 0.01) -> dict[tuple[int, int], float]:
    """Each partition's records handled one after another from T0."""
    return {(p, o): T0 + o * every_s for p in range(partitions) for o in range(per_partition)}


def run(mode: str = "partition", **kw: Any) -> Run:
    base: dict[str, Any] = dict(
        mode=mode, partitions=2, workers=2, batch_max_records=10, max_uncommitted_records=300,
        faults=[Fault(k, {0: 0, 1: 0}, T0) for k in REQUIRED], duplicates=0, handled=handled(1000),
        killed_segments=3)
    base.update(kw)
    return Run(**base)


def test_a_run_that_injected_every_fault_and_kept_within_its_bounds_passes() -> None:
    assert problems(run()) == []


@pytest.mark.parametrize("kind", REQUIRED)
def test_a_run_that_left_out_a_kind_of_fault_fails(kind: str) -> None:
    r = run(faults=[Fault(k, {0: 0, 1: 0}, T0) for k in REQUIRED if k != kind])
    assert any(kind in p for p in problems(r))


def test_a_run_that_injected_nothing_fails() -> None:
    assert problems(run(faults=[]))


def test_records_in_flight_are_those_handled_above_the_commit_by_the_time_the_fault_was_over() -> None:
    h = handled(1000)
    # Committed 100 and 250 right after it; by T0 + 3 s offsets up to 300 were handled.
    f = Fault("supervisor_join", {0: 100, 1: 250}, T0 + 3.0)
    assert in_flight(f, h) == (301 - 100) + (301 - 250)
    assert in_flight(Fault("supervisor_join", {0: -1001, 1: 1000}, T0 + 3.0), h) == 301, \
        "nothing committed yet: everything handled is in flight"


def test_a_killed_supervisor_answers_for_its_workers_last_second_too() -> None:
    h = handled(1000)
    f = Fault("supervisor_sigkill", {0: 100, 1: 100}, T0 + 3.0, grace_s=1.0)
    assert in_flight(f, h) == 2 * (401 - 100), "up to T0 + 4 s"


def test_a_worker_kill_is_allowed_its_batch_only() -> None:
    f = Fault("worker_sigkill", {0: 0, 1: 0}, T0 + 3.0)
    assert in_flight(f, handled(1000)) == 0


def test_partition_ordering_allows_what_was_in_flight_not_the_topic() -> None:
    h = handled(1000)
    faults = [Fault("worker_sigkill", {0: 50, 1: 50}, T0),
              Fault("supervisor_sigkill", {0: 90, 1: 90}, T0, grace_s=1.0),
              Fault("supervisor_join", {0: 100, 1: 100}, T0 + 1.0),
              Fault("supervisor_leave", {0: 100, 1: 100}, T0 + 1.0)]
    r = run(faults=faults, handled=h)
    # worker kill: its batch; killed supervisor: 90 to 100 (T0 + 1 s) of each partition and a
    # batch per worker; join and leave: offset 100 of each partition and a batch each.
    expected = 10 + (2 * 11 + 2 * 10) + (2 + 10) + (2 + 10)
    assert allowed_duplicates(r) == expected < 2000
    assert problems(run(faults=faults, handled=h, duplicates=expected)) == []
    too_many = problems(run(faults=faults, handled=h, duplicates=expected + 1))
    assert too_many and "duplicates" in too_many[0]


def test_lanes_are_held_to_the_run_ahead_bound_as_well() -> None:
    h = handled(5000, every_s=0.0001)  # everything handled at once: all of it in flight
    faults = [Fault(k, {0: 0, 1: 0}, T0 + 1.0) for k in REQUIRED]
    r = run("key", faults=faults, handled=h)
    handovers = 1 + 3  # the start, a kill, a join, a leave
    assert allowed_duplicates(r) == handovers * 2 * (300 + 2 * 10)


def test_shared_memory_left_by_a_supervisor_that_stopped_fails() -> None:
    assert any("left by supervisors" in p for p in problems(run(leaked_segments=["ringmaster-1-2-x-ring0"])))


def test_a_killed_supervisors_segments_must_be_reclaimed_by_the_next_start() -> None:
    assert any("not reclaimed" in p for p in problems(run(unreclaimed_segments=["ringmaster-1-2-x-epochs"])))


def test_a_kill_that_left_nothing_to_reclaim_tested_nothing() -> None:
    assert any("reclaiming was not tested" in p for p in problems(run(killed_segments=0)))
