"""Worker slots (runtime/supervisor/workers/pool.py): the pool starts with workers.processes rings in
shared memory and adds one when a resize or a reload needs it, up to its limit, with a clear
error when shm_dir has no room; every ring goes when the run ends (invariant 7)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime.transport.shm as shm
from runtime.errors import SharedMemoryError
from runtime.supervisor.workers.pool import WorkerPool
from runtime.transport.shm import SegmentSet


@pytest.fixture
def shm_dir(tmp_path: Path) -> Iterator[Path]:
    d = Path("/dev/shm") / f"rm-slots-{tmp_path.name}"
    d.mkdir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pool(shm_dir: Path, processes: int, max_slots: int) -> tuple[WorkerPool, SegmentSet]:
    segments = SegmentSet(shm_dir)
    return WorkerPool(segments, processes, 64 * 1024, "spawn", lambda *a: None,  # type: ignore[arg-type,return-value]
                      max_slots=max_slots), segments


def rings(shm_dir: Path) -> list[str]:
    return sorted(p.name.rsplit("-", 1)[1] for p in shm_dir.iterdir())


def test_slots_are_added_when_needed_up_to_the_limit_and_all_go_at_the_end(shm_dir: Path) -> None:
    p, segments = pool(shm_dir, 2, max_slots=3)
    assert rings(shm_dir) == ["w0", "w1"], "only workers.processes rings at start"
    h = p.add_slot()
    assert h.index == 2 and rings(shm_dir) == ["w0", "w1", "w2"] and p.handles[2] is h
    with pytest.raises(SharedMemoryError, match="no worker slot left"):
        p.add_slot()
    p.close()
    segments.unlink_all()
    assert rings(shm_dir) == []


def test_no_room_for_another_ring_is_one_clear_error_and_nothing_half_made(
        shm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p, segments = pool(shm_dir, 1, max_slots=4)

    class Usage:
        free = 1024

    def small(_path: Any) -> Usage:
        return Usage()
    monkeypatch.setattr(shm.shutil, "disk_usage", small)
    with pytest.raises(SharedMemoryError) as info:
        p.add_slot()
    assert "cannot add worker slot 1" in str(info.value) and "enlarge /dev/shm" in str(info.value)
    assert rings(shm_dir) == ["w0"] and len(p.handles) == 1
    p.close()
    segments.unlink_all()
