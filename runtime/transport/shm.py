"""Shared-memory segments whose lifetime the runtime owns explicitly.

We do not use ``multiprocessing.shared_memory``: on Python 3.11 every attach registers the
segment with a resource tracker that may unlink it while another process still uses it,
or warn about "leaks" at exit (cpython#82300). Instead each segment is a file under
``/dev/shm`` created with O_EXCL and mode 0600, named

    ringmaster-<supervisor pid>-<supervisor start time, 10 ms units>-<run token>-<what>

so that a later start can tell a segment whose supervisor is gone (SIGKILL, OOM) from one
that belongs to a live supervisor, and reclaim it (invariant 7).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import secrets
import shutil
from pathlib import Path

import psutil

from runtime.errors import SharedMemoryError

log = logging.getLogger(__name__)
PREFIX = "ringmaster-"


class Segment:
    """One mapped segment. Runs in: supervisor (create) and worker (attach)."""

    def __init__(self, path: Path, size: int, *, create: bool) -> None:
        self.path = path
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as exc:
            raise SharedMemoryError(f"cannot open shared memory {str(path)!r}: {exc}") from None
        try:
            if create:
                # INVARIANT: allocate now so a full /dev/shm fails here with ENOSPC
                # instead of a SIGBUS later, when a worker touches an unbacked page.
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    os.unlink(path)
                    raise SharedMemoryError(
                        f"cannot allocate {size} bytes of shared memory in {path.parent}: "
                        f"{exc.strerror}; free space there or lower workers.ring_bytes"
                    ) from None
            else:
                size = os.fstat(fd).st_size
            self.size = size
            self._mmap = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        """Unmap (the file stays). Views derived from ``buf`` must be released first."""
        try:
            self.buf.release()
            self._mmap.close()
        except (BufferError, ValueError):
            pass  # a view is still alive somewhere; the mapping goes with the process

    def unlink(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def _start_stamp(pid: int) -> int:
    return int(psutil.Process(pid).create_time() * 100)


class SegmentSet:
    """All segments of one supervisor run; unlinked together on every exit path."""

    def __init__(self, shm_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(shm_dir)
        pid = os.getpid()
        self.prefix = f"{PREFIX}{pid}-{_start_stamp(pid)}-{secrets.token_hex(3)}-"
        self._segments: dict[str, Segment] = {}

    def create(self, what: str, size: int) -> Segment:
        seg = Segment(self.dir / f"{self.prefix}{what}", size, create=True)
        self._segments[what] = seg
        return seg

    def drop(self, what: str) -> None:
        seg = self._segments.pop(what, None)
        if seg is not None:
            seg.unlink()
            seg.close()

    def unlink_all(self) -> None:
        for what in list(self._segments):
            self.drop(what)

    def __contains__(self, what: str) -> bool:
        return what in self._segments

    def paths(self) -> list[Path]:
        """Where each segment of the set is, for a last resort that unlinks them without
        Python (runtime/ops/backstop.py)."""
        return [seg.path for seg in self._segments.values()]


def segment_bytes(size: int) -> int:
    """What a segment of ``size`` bytes takes in a tmpfs: whole pages."""
    return -(-size // mmap.PAGESIZE) * mmap.PAGESIZE


def free_bytes(shm_dir: str | os.PathLike[str]) -> int:
    """What an unprivileged process may still allocate in ``shm_dir`` (OSError if unreadable)."""
    st = os.statvfs(shm_dir)
    return st.f_bavail * st.f_frsize


def check_space(shm_dir: str | os.PathLike[str], needed_bytes: int) -> None:
    """Fail with a clear message rather than a bus error when /dev/shm is too small."""
    path = Path(shm_dir)
    if not path.is_dir():
        raise SharedMemoryError(f"supervisor.shm_dir {str(path)!r} is not a directory")
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise SharedMemoryError(
            f"{path} has {free // 2**20} MiB free but the rings need {needed_bytes // 2**20} MiB: "
            "lower workers.ring_bytes or workers.processes, or enlarge /dev/shm "
            "(docker: --shm-size)"
        )


def reclaim_stale(shm_dir: str | os.PathLike[str]) -> list[str]:
    """Unlink segments of ours whose supervisor is no longer alive. Runs in: supervisor start."""
    reclaimed: list[str] = []
    uid = os.getuid()
    for entry in Path(shm_dir).glob(f"{PREFIX}*"):
        try:
            if entry.stat().st_uid != uid:
                continue
            pid_text, stamp_text = entry.name[len(PREFIX):].split("-")[:2]
            pid, stamp = int(pid_text), int(stamp_text)
        except (OSError, ValueError):
            continue
        if _owner_alive(pid, stamp):
            continue
        try:
            entry.unlink()
            reclaimed.append(entry.name)
        except FileNotFoundError:
            pass
    if reclaimed:
        log.warning("reclaimed shared memory left by a dead supervisor",
                    extra={"segments": len(reclaimed)})
    return reclaimed


def _owner_alive(pid: int, stamp: int) -> bool:
    """Whether the supervisor that named a segment still runs. A zombie does not: a supervisor
    SIGKILLed is one until its parent reaps it (a test harness, a shell script, anything but
    an init system may wait a while), and a daemon started beside it in that window took its
    segments for a live supervisor's and left them for good (issue 40)."""
    try:
        proc = psutil.Process(pid)
        return abs(int(proc.create_time() * 100) - stamp) <= 1 and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False
