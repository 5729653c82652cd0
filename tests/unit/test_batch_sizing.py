"""How many records a batch holds (runtime/supervisor/datapath/intake.py, ``Intake._size``):
about batch_target_ms of plugin work, up to 4 × that when the partition has a backlog, never
more than batch_max_records."""

from __future__ import annotations

from typing import Any

from runtime.config import WorkerSettings
from runtime.supervisor.datapath.intake import Intake
from runtime.supervisor.datapath.partitions import Partition, new_partition

TP = ("t", 0)


def _intake(**workers: Any) -> tuple[Intake, Partition]:
    w = WorkerSettings.model_validate({"plugin": "p", **workers})
    p = new_partition(TP, 0, 1, w.batch_max_records, 0.0)
    intake = Intake(w, False, None, {TP: p}, 0, 8 << 20, 1 << 20, lambda: 1, lambda: 0.0)  # type: ignore[arg-type]
    p.intake.bytes_per_record = 100.0
    intake.learn_cost(p, busy_ms=10.0, records=100)  # 100 µs a record: 10 ms is 100 records
    return intake, p


def test_a_batch_holds_about_batch_target_ms_of_work() -> None:
    intake, p = _intake()
    assert p.intake.batch_records == 100
    assert intake._size(p, backlog=False) == 100


def test_a_partition_with_a_backlog_is_cut_in_batches_of_four_times_the_target() -> None:
    intake, p = _intake()
    assert not intake._backlog(p)
    p.intake.behind = 24 * 100  # the log holds 24 batches not fetched yet
    assert intake._backlog(p)
    assert intake._size(p, backlog=True) == 400
    p.intake.behind, p.intake.open_msgs = 0, [object()] * 2400  # or they were fetched and not cut
    assert intake._backlog(p)


def test_a_backlog_never_makes_a_batch_larger_than_batch_max_records() -> None:
    intake, p = _intake(batch_max_records=250)
    assert intake._size(p, backlog=True) == 250


def test_no_target_no_stretch() -> None:
    intake, p = _intake(batch_target_ms=0)
    assert intake._size(p, backlog=True) == intake._size(p, backlog=False) == 500
