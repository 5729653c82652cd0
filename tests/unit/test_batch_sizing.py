"""How many records a batch holds (runtime/supervisor/datapath/intake.py, ``batch_size``):
about batch_target_ms of plugin work, up to 4 × that when the partition has a backlog, never
more than batch_max_records. And how many records key ordering gathers before a cut
(``Intake._gather``): a batch for each key bucket, under a backlog, while no worker is short
of work."""

from __future__ import annotations

from typing import Any

from fakes import partition

from runtime.config import WorkerSettings
from runtime.supervisor.datapath.intake import BatchIds, Cut, Intake, Shape, Sizing, batch_size
from runtime.supervisor.partition.partition import Partition
from runtime.supervisor.scheduling.capacity import Capacity

TP = ("t", 0)


def _intake(**workers: Any) -> tuple[Intake, Partition]:
    w = WorkerSettings.model_validate({"plugin": "p", **workers})
    p = partition(TP, w.batch_max_records)
    buckets = 16 if w.ordering == "key" else 0
    sizing = Sizing(w.batch_max_records, w.batch_target_ms, 1 << 20, 8 << 20)
    intake = Intake(Shape(w, sizing, False, buckets), None, {TP: p}, BatchIds(), lambda: 0.0)  # type: ignore[arg-type]
    p.learn_bytes(100.0)
    p.learn_cost(busy_ms=10.0, records=100)  # 100 µs a record: 10 ms is 100 records
    p.sized(batch_size(sizing, p))
    return intake, p


def busy(hungry: bool = False) -> Capacity:
    """No worker has room; ``hungry``: one has next to nothing to do all the same."""
    return Capacity((), frozenset(), frozenset({0}) if hungry else frozenset(), False)


def test_a_batch_holds_about_batch_target_ms_of_work() -> None:
    intake, p = _intake()
    assert p.intake.batch_records == 100
    assert batch_size(intake.sizing, p, backlog=False) == 100


def test_a_partition_with_a_backlog_is_cut_in_batches_of_four_times_the_target() -> None:
    intake, p = _intake()
    assert not intake._backlog(p)
    p.set_behind(24 * 100)  # the log holds 24 batches not fetched yet
    assert intake._backlog(p)
    assert batch_size(intake.sizing, p, backlog=True) == 400
    p.intake.behind, p.intake.open_msgs = 0, [object()] * 2400  # or they were fetched and not cut
    assert intake._backlog(p)


def test_a_backlog_never_makes_a_batch_larger_than_batch_max_records() -> None:
    intake, p = _intake(batch_max_records=250)
    assert batch_size(intake.sizing, p, backlog=True) == 250


def test_no_target_no_stretch() -> None:
    intake, p = _intake(batch_target_ms=0)
    assert batch_size(intake.sizing, p, backlog=True) == batch_size(intake.sizing, p, backlog=False) == 500


def _key_backlog(**workers: Any) -> tuple[Intake, Partition, list[int]]:
    """Key ordering, 16 buckets seen, a long backlog in the log; ``cuts`` records the size of
    each cut instead of packing it. The clock stands at 0."""
    intake, p = _intake(ordering="key", **workers)
    p.intake.lane_records = {b: 1 for b in range(16)}
    p.set_behind(100_000)
    cuts: list[int] = []

    def cut(part: Partition, now: float, out: Cut) -> None:
        cuts.append(len(part.take_open()))
    intake._cut = cut  # type: ignore[method-assign]
    return intake, p, cuts


def test_key_ordering_gathers_a_full_batch_for_each_bucket_while_no_worker_is_short_of_work() -> None:
    intake, p, cuts = _key_backlog()
    assert intake._gather(p) == 16 * 400  # 16 buckets × the backlog's 400-record batches
    p.intake.open_msgs, p.intake.open_since = [object()] * 1000, -0.1  # older than batch_max_wait_ms
    intake.cut(busy(), drained=True)
    assert cuts == []  # their turn is far off: no cut until the gathering is done
    p.intake.open_msgs += [object()] * (16 * 400 - 1000)
    intake.cut(busy(), drained=True)
    assert cuts == [16 * 400]


def test_gathering_waits_at_most_ten_batch_max_waits() -> None:
    intake, p, cuts = _key_backlog()
    p.intake.open_msgs, p.intake.open_since = [object()] * 1000, -0.21  # 10 × 20 ms ago, and more
    intake.cut(busy(), drained=True)
    assert cuts == [1000]


def test_a_hungry_worker_a_paused_partition_or_no_backlog_cuts_as_usual() -> None:
    intake, p, cuts = _key_backlog()
    p.intake.open_msgs, p.intake.open_since = [object()] * 1000, -0.1
    intake.cut(busy(hungry=True), drained=True)  # gathering would starve that worker
    assert cuts == [1000]
    p.intake.open_msgs = [object()] * 1000
    p.pause.paused = True  # over its share of the backlog budget: no more records are coming
    assert intake._gather(p) == 0
    p.pause.paused, p.intake.behind, p.intake.open_msgs = False, 0, []
    assert intake._gather(p) == 0
    partition, q = _intake()
    q.set_behind(100_000)
    assert partition._gather(q) == 0  # partition ordering: a cut is one lane's frames already


def test_at_the_end_of_a_burst_what_the_log_holds_is_cut_at_once() -> None:
    intake, p, cuts = _key_backlog()
    p.intake.behind, p.intake.open_msgs, p.intake.open_since = 0, [object()] * 3000, 0.0
    assert intake._backlog(p)  # 3,000 open records are 30 batches of work
    intake.cut(busy(), drained=True)
    assert cuts == [3000]  # nothing more is coming: no wait for 6,400


def test_gathering_is_bounded_by_the_uncommitted_records_and_a_quarter_of_a_ring() -> None:
    intake, p, _ = _key_backlog(max_uncommitted_records=4000)
    assert intake._gather(p) == 2000
    intake, p, _ = _key_backlog()
    p.intake.bytes_per_record = 1000.0  # 8 MiB / 4 / 1000 B
    assert intake._gather(p) == (8 << 20) // 4 // 1000


def test_at_the_end_of_a_backlog_the_gathered_records_are_cut_over_several_ticks() -> None:
    """When the log is fetched to its end, every partition's gathering ends in the same tick:
    cut all at once (~100,000 records, an ~80 ms turn), nothing was placed meanwhile and the
    workers ran dry (issue 41). A tick cuts about a batch a worker of them, the rest after."""
    w = WorkerSettings.model_validate({"plugin": "p", "ordering": "key"})
    sizing = Sizing(w.batch_max_records, w.batch_target_ms, 1 << 20, 8 << 20)
    parts = {("t", i): partition(("t", i), w.batch_max_records) for i in range(8)}
    intake = Intake(Shape(w, sizing, False, 16), None, parts, BatchIds(), lambda: 0.0)  # type: ignore[arg-type]
    cuts: list[int] = []
    intake._cut = lambda part, now, out: cuts.append(len(part.take_open()))  # type: ignore[method-assign]
    for p in parts.values():
        p.learn_bytes(100.0)
        p.learn_cost(busy_ms=10.0, records=100)
        p.sized(batch_size(sizing, p))
        p.intake.lane_records = {b: 1 for b in range(16)}
        p.intake.behind, p.intake.open_msgs, p.intake.open_since = 0, [object()] * 3000, 0.0
    four_workers = Capacity((3, 3, 3, 3), frozenset(), frozenset(), False)
    intake.cut(four_workers, drained=True)
    assert cuts == [3000], "4 workers × 400-record batches: one partition's 3,000 in this tick"
    ticks = 1
    while any(p.intake.open_msgs for p in parts.values()):
        intake.cut(four_workers, drained=True)
        ticks += 1
    assert cuts == [3000] * 8 and ticks == 8
