"""runtime.ops.status.StatusFile: the directory is checked at start (a config error), every write
is atomic (a reader never sees half a snapshot, nothing is left behind), and a later failure
is only a warning: the status file never stops the daemon."""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import runtime.ops.status as status_mod
from runtime.errors import ConfigError
from runtime.ops.status import (
    PartitionStatus,
    StatusFile,
    StatusSnapshot,
    Stopped,
    WindowCpu,
    WorkerStatus,
)


def snapshot(records: int = 10, **kw: Any) -> StatusSnapshot:
    part = PartitionStatus(tp="in[0]", topic="in", partition=0, worker=1, paused=True,
                           pause_reasons=["flow", "operator"], holds={"operator": "by ringmaster pause"},
                           blocked=None, committed=5, done_through=9, high=20, lag=15, pending_batches=2,
                           records=records, consumed=12, outputs=8, dead_letters=1, hot_key="k1")
    worker = WorkerStatus(index=1, pid=1234, alive=True, state="ready", cpu_s=1.5, records=records,
                          in_flight=2, ring_fill=0.25, restarts=1, rss=50 * 2**20, heartbeat_age_s=0.4,
                          last_exit="exited with status 3", start_failure=None)
    fields: dict[str, Any] = dict(
        pid=99, group="g", ordering="partition", elapsed_s=12.5, window_s=1.0, join_s=0.3,
        supervisor_cpu_s=0.7, window_cpu_s=WindowCpu(0.1, 0.9), supervisor_rss=None, records=records,
        rate=100.0, outputs=8, dead_letters=1, discarded=0, batches=3, consumed=12, deferred=0,
        restarts=1, paused=1, lag=15, partitions=[part], workers=[worker],
        revocations=[{"tp": "in[1]", "ms": 12.0}], committed={"in[0]": 5}, dead_letters_waiting=1,
        loop_age_s=0.01, ready=True, operator_pauses=[{"tp": "in[0]", "since": 1.0}],
        stopped=Stopped(0, "caught up"))
    fields.update(kw)
    return StatusSnapshot(**fields)


def test_a_snapshot_is_plain_json() -> None:
    d = snapshot().to_dict()
    again = json.loads(json.dumps(d))
    assert again == d
    assert again["partitions"][0]["holds"] == {"operator": "by ringmaster pause"}
    assert again["workers"][0]["last_exit"] == "exited with status 3"
    assert again["window_cpu_s"] == {"supervisor": 0.1, "workers": 0.9}
    assert again["stopped"]["code"] == 0 and again["stopped"]["reason"] == "caught up"
    assert again["stopped"]["at"] > 0 and again["started_at"] > 0


def test_missing_parent_directories_are_created_at_start(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "c" / "status.json"
    StatusFile(str(path))
    assert path.parent.is_dir()
    assert not path.exists(), "nothing is written before the first snapshot"


def test_no_path_means_no_status_file(tmp_path: Path) -> None:
    f = StatusFile(None)
    f.write(snapshot())  # nothing to do, nothing raised
    assert f.path is None


@pytest.mark.parametrize("depth", [0, 1], ids=["parent-is-a-file", "grandparent-is-a-file"])
def test_a_directory_that_cannot_be_created_is_a_config_error_naming_the_setting(tmp_path: Path,
                                                                                  depth: int) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file in the way")
    path = blocker / "sub" / "status.json" if depth else blocker / "status.json"
    with pytest.raises(ConfigError) as caught:
        StatusFile(str(path))
    assert "supervisor.status_file" in str(caught.value)
    assert str(path.parent) in str(caught.value)
    assert caught.value.exit_code == 2


def test_a_directory_that_is_not_writable_is_a_config_error(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "ro"
    d.mkdir()
    # As if d were read-only (root, which runs these tests here, can write anywhere).
    monkeypatch.setattr(status_mod, "os", SimpleNamespace(access=lambda p, mode: False, W_OK=os.W_OK))
    with pytest.raises(ConfigError, match=r"supervisor\.status_file: .* is not writable"):
        StatusFile(str(d / "status.json"))


def test_a_write_leaves_a_complete_snapshot_readable_by_others(tmp_path: Path) -> None:
    path = tmp_path / "status.json"
    f = StatusFile(str(path))
    f.write(snapshot(records=10))
    assert json.loads(path.read_text())["records"] == 10
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    f.write(snapshot(records=11))
    assert json.loads(path.read_text())["records"] == 11
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"], "no temporary file left"


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "status.json"
    f = StatusFile(str(path))
    f.write(snapshot(records=10))
    old = path.read_text()
    inode = path.stat().st_ino

    def dump_half_then_fail(obj: Any, fp: Any) -> None:
        text = json.dumps(obj)
        fp.write(text[: len(text) // 2])
        fp.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(status_mod, "json", SimpleNamespace(dump=dump_half_then_fail))
    with caplog.at_level(logging.WARNING, logger="ringmaster.status"):
        f.write(snapshot(records=11))  # must not raise
    assert path.read_text() == old and path.stat().st_ino == inode, "the old snapshot is intact"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"], "no temporary file left"
    assert any("cannot write the status file" in r.getMessage() for r in caplog.records)


def test_a_write_interrupted_by_any_exception_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "status.json"
    f = StatusFile(str(path))
    f.write(snapshot(records=10))

    def interrupted(obj: Any, fp: Any) -> None:
        fp.write("{")
        raise KeyboardInterrupt

    monkeypatch.setattr(status_mod, "json", SimpleNamespace(dump=interrupted))
    with pytest.raises(KeyboardInterrupt):
        f.write(snapshot(records=11))
    assert json.loads(path.read_text())["records"] == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]


def test_a_later_failure_is_one_warning_and_never_an_exception(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "run"
    path = d / "status.json"
    f = StatusFile(str(path))
    f.write(snapshot())
    path.unlink()
    d.rmdir()
    d.write_text("the directory was replaced by a file")
    with caplog.at_level(logging.WARNING, logger="ringmaster.status"):
        f.write(snapshot())
        f.write(snapshot())
        f.write(snapshot())
    warnings = [r for r in caplog.records if r.name == "ringmaster.status"]
    assert len(warnings) == 1, "one warning, not one per snapshot"
    assert warnings[0].levelno == logging.WARNING
    assert warnings[0].path == str(path)  # type: ignore[attr-defined]
    assert d.read_text() == "the directory was replaced by a file"


def test_a_directory_removed_while_running_is_created_again(tmp_path: Path) -> None:
    d = tmp_path / "run"
    path = d / "status.json"
    f = StatusFile(str(path))
    f.write(snapshot())
    path.unlink()
    d.rmdir()
    f.write(snapshot(records=3))
    assert json.loads(path.read_text())["records"] == 3


def test_the_first_failure_is_logged_even_just_after_the_host_booted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    d = tmp_path / "run"
    f = StatusFile(str(d / "status.json"))
    d.rmdir()
    d.write_text("in the way")
    monkeypatch.setattr(status_mod, "time", SimpleNamespace(monotonic=lambda: 12.0))  # 12 s since boot
    with caplog.at_level(logging.WARNING, logger="ringmaster.status"):
        f.write(snapshot())
    assert [r for r in caplog.records if r.name == "ringmaster.status"]
