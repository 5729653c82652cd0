from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from runtime.transport.shm import PREFIX, SegmentSet, reclaim_stale


def test_segments_are_private_and_unlinked(tmp_path: Path) -> None:
    segs = SegmentSet(tmp_path)
    seg = segs.create("w0", 4096)
    assert os.stat(seg.path).st_mode & 0o777 == 0o600
    segs.unlink_all()
    assert not list(tmp_path.iterdir())


def test_reclaim_only_segments_of_dead_supervisors(tmp_path: Path) -> None:
    mine = SegmentSet(tmp_path)
    mine.create("w0", 4096)
    # a segment created by a process that has exited since
    code = ("import sys; from runtime.transport.shm import SegmentSet; "
            "s = SegmentSet(sys.argv[1]); s.create('w0', 4096)")
    subprocess.run([sys.executable, "-c", code, str(tmp_path)], check=True)
    assert len(list(tmp_path.glob(f"{PREFIX}*"))) == 2
    reclaimed = reclaim_stale(tmp_path)
    assert len(reclaimed) == 1
    assert [p.name for p in tmp_path.iterdir()] == [f"{mine.prefix}w0"]
    mine.unlink_all()


def test_a_killed_supervisor_not_yet_reaped_is_dead_and_its_segments_are_reclaimed(tmp_path: Path) -> None:
    """Issue 40: a supervisor SIGKILLed is a zombie until its parent waits for it; a daemon
    started beside it in that window took its segments for a live one's and left them."""
    code = ("import os, sys, signal; from runtime.transport.shm import SegmentSet; "
            "s = SegmentSet(sys.argv[1]); s.create('w0', 4096); print('made', flush=True); "
            "os.kill(os.getpid(), signal.SIGKILL)")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"made\n"
        deadline = time.monotonic() + 10
        while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:  # dead, not reaped
            assert time.monotonic() < deadline, "the child did not die"
            time.sleep(0.01)
        assert [p.name.split("-")[1] for p in tmp_path.iterdir()] == [str(child.pid)]
        assert len(reclaim_stale(tmp_path)) == 1 and not list(tmp_path.iterdir())
    finally:
        child.wait(10)


def test_a_killed_test_session_leaves_nothing_for_the_next() -> None:
    """The test sessions' own directories (tests/helpers.py): one whose session died is
    removed by the next; a live session's, this one's, stays."""
    from helpers import SHM_DIR, SOCK_DIR, sweep_dead_sessions

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    left = [SHM_DIR.parent / f"rmtest-{dead}", SOCK_DIR.parent / f"rmsock-{dead}"]
    for d in left:
        d.mkdir()
        (d / "ringmaster-1-w0").write_bytes(b"x")
    removed = sweep_dead_sessions()
    assert {str(d) for d in left} <= set(removed)
    assert not any(d.exists() for d in left)
    assert SHM_DIR.is_dir() and SOCK_DIR.is_dir()
