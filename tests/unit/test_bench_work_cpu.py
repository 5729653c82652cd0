"""The work's own CPU in `./scripts/bench --naive` (scripts/benchkit/work.py, ``work_batch``
and ``work_cpu``): every consumer's process notes each batch's records and the CPU its thread
spent in the work, and the bench adds them up, so that a run's window CPU splits into the work
and what the consumer spends around it. A note lost or counted twice would move that split."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))

from benchkit import work  # noqa: E402


def test_each_process_notes_its_batches_and_the_bench_adds_every_process_up(tmp_path: Path) -> None:
    code = ("from benchkit.work import work_batch\n"
            "work_batch('cpu', 2000, [b'x'] * 30)\n"
            "work_batch('cpu', 2000, [None] * 12)\n")
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS), **{work.WORK_CPU_ENV: str(tmp_path)})
    for _ in range(2):  # two processes: a file each
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert len(list(tmp_path.glob("*.work"))) == 2
    records, cpu_s = work.work_cpu(str(tmp_path)) or (0, 0.0)
    assert records == 2 * (30 + 12)
    assert 0 < cpu_s < 60


def test_without_the_variable_nothing_is_written_and_the_results_are_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(work, "_work_cpu_dir", None)
    plain = work.work_batch("cpu", 50, [b"a", None])
    monkeypatch.setattr(work, "_work_cpu_dir", str(tmp_path))
    monkeypatch.setattr(work, "_work_cpu_fd", None)
    try:
        assert work.work_batch("cpu", 50, [b"a", None]) == plain == [work.spin(50)] * 2
    finally:
        if work._work_cpu_fd is not None:
            os.close(work._work_cpu_fd)
    assert work.work_cpu(str(tmp_path)) is not None


def test_a_directory_no_consumer_wrote_to_gives_nothing(tmp_path: Path) -> None:
    """An older checkout's plugin (``--scale-against``) does not note its work: no figure, not 0."""
    assert work.work_cpu(str(tmp_path)) is None
