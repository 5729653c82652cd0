"""A copy of the plugin's source per code generation (runtime/supervisor/workers/snapshots.py): taken
once, at a generation's first worker, from what is on disk then; later edits change nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.supervisor.workers import snapshots
from runtime.supervisor.workers.snapshots import PluginSources


@pytest.fixture
def on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    monkeypatch.syspath_prepend(str(src))
    return src


def test_a_single_module_is_copied_once_per_generation_and_later_edits_do_not_reach_it(
        on_path: Path, tmp_path: Path) -> None:
    (on_path / "snapmod.py").write_text("V = 1\n")
    sources = PluginSources(tmp_path)
    try:
        first = sources.for_generation(1, "snapmod")
        assert first.path is not None and sources.held(1)
        (on_path / "snapmod.py").write_text("V = 2\n")
        assert sources.for_generation(1, "snapmod") == first, "taken once"
        assert (Path(first.path) / "snapmod.py").read_text() == "V = 1\n"
        second = sources.for_generation(2, "snapmod")
        assert second.path is not None and (Path(second.path) / "snapmod.py").read_text() == "V = 2\n"
    finally:
        sources.close()
    assert not list(tmp_path.glob("ringmaster-plugin-*")), "removed at exit"


def test_a_package_is_copied_whole_with_its_data_but_not_its_bytecode(on_path: Path, tmp_path: Path) -> None:
    pkg = on_path / "snappkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "model.bin").write_bytes(b"weights")
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "x.pyc").write_bytes(b"stale")
    sources = PluginSources(tmp_path)
    try:
        snap = sources.for_generation(1, "snappkg.sub")
        assert snap.path is not None
        copied = Path(snap.path) / "snappkg"
        assert (copied / "sub" / "model.bin").read_bytes() == b"weights"
        assert not (copied / "__pycache__").exists()
    finally:
        sources.close()


def test_what_cannot_be_copied_says_why_and_is_imported_from_disk(
        on_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (on_path / "nsonly").mkdir()  # a namespace package
    (on_path / "bigmod.py").write_text("x = 1\n")
    monkeypatch.setattr(snapshots, "MAX_BYTES", 3)
    sources = PluginSources(tmp_path)
    try:
        assert "not found" in (sources.for_generation(1, "no_such_mod_xyz").why_not or "")
        assert "namespace package" in (sources.for_generation(2, "nsonly").why_not or "")
        assert "more than" in (sources.for_generation(3, "bigmod").why_not or "")
        assert "not Python source" in (sources.for_generation(4, "_json").why_not or "")  # built in / .so
        assert not any(sources.held(g) for g in (1, 2, 3, 4))
    finally:
        sources.close()


def test_copies_left_by_a_killed_daemon_are_removed_and_a_live_ones_kept(
        tmp_path: Path, on_path: Path) -> None:
    dead_pid = 2**22 + 12345  # above pid_max's default: no such process
    (tmp_path / f"ringmaster-plugin-{dead_pid}-abc").mkdir()
    (tmp_path / f"ringmaster-plugin-{os.getppid()}-def").mkdir()
    (on_path / "snapmod2.py").write_text("")
    sources = PluginSources(tmp_path)
    try:
        sources.for_generation(1, "snapmod2")
        names = sorted(p.name for p in tmp_path.glob("ringmaster-plugin-*"))
        assert f"ringmaster-plugin-{dead_pid}-abc" not in names
        assert f"ringmaster-plugin-{os.getppid()}-def" in names
    finally:
        sources.close()

