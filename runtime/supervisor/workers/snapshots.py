"""A copy of the plugin's source per code generation, so that a rollback holds.

A worker imports the plugin when it starts. Were it to import the files on disk, a worker
started after a rolled-back reload (a crash, recycling after ``max_batches`` or
``max_rss_mb``, ``scale``) would run the code that just failed. So the first time a
generation's worker starts, the plugin's source as it is then is copied into a directory
private to this daemon, and every worker of that generation imports from the copy (first on
its ``sys.path``): a generation is the code it was started with, until a reload starts
another one. Without a reload, editing the files changes nothing either.

What is copied: the plugin's own top-level module, found on ``sys.path`` without importing
it – the whole package directory (data files too, ``__pycache__`` left out) or the single
``.py`` file. Not its dependencies (other packages are imported from where they are), not
what a single-file module reads beside itself. No copy (the files on disk are imported, and
the log and the rollback message say so): an extension module, a namespace package, a module
with no file, more than ``MAX_BYTES`` of source.

Runs in: the supervisor (the pool asks, at each start). The directory is removed at exit;
one a SIGKILLed daemon left is removed by the next daemon of this user (its pid is gone).
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("ringmaster.snapshots")

MAX_BYTES = 64 * 2**20
_PREFIX = "ringmaster-plugin-"


@dataclass(frozen=True)
class Snapshot:
    """Where a generation's workers import the plugin from (``path`` None: the files on
    disk, for the reason in ``why_not``)."""

    path: str | None
    why_not: str | None = None


class PluginSources:
    def __init__(self, root: Path | None = None) -> None:
        self._root_parent = root or Path(tempfile.gettempdir())
        self._dir: Path | None = None
        self._taken: dict[int, Snapshot] = {}

    def for_generation(self, generation: int, plugin: str) -> Snapshot:
        """The generation's copy, taken now if this is its first worker. Never raises: a copy
        that cannot be made is logged once, and the generation imports the files on disk."""
        if generation not in self._taken:
            self._taken[generation] = self._take(generation, plugin)
        return self._taken[generation]

    def held(self, generation: int) -> bool:
        """Whether workers of ``generation`` started from now on run the code it started with."""
        snap = self._taken.get(generation)
        return snap is not None and snap.path is not None

    def _take(self, generation: int, plugin: str) -> Snapshot:
        top = plugin.partition(".")[0]
        problem: str | None = None
        try:
            spec = importlib.machinery.PathFinder.find_spec(top)
        except (ImportError, ValueError, OSError) as exc:
            spec, problem = None, f"cannot look for it: {exc}"
        else:
            problem = f"module {top!r} not found on sys.path" if spec is None else None
        snap = self._copy(generation, top, spec) if spec is not None else Snapshot(None, problem)
        if snap.path is None:
            log.warning("no copy of the plugin's source: workers started later import the files on disk, "
                        "even after a rolled-back reload", extra={"plugin": plugin, "why": snap.why_not,
                                                                   "generation": generation})
        else:
            log.info("plugin source copied", extra={"plugin": plugin, "generation": generation,
                                                    "path": snap.path})
        return snap

    def _copy(self, generation: int, top: str, spec: importlib.machinery.ModuleSpec) -> Snapshot:
        origin = spec.origin
        locations = list(spec.submodule_search_locations or [])
        if locations and (origin is None or Path(origin).name != "__init__.py"):
            return Snapshot(None, "a namespace package (no __init__.py)")
        if origin is None or not origin.endswith(".py"):
            return Snapshot(None, f"not Python source ({origin or 'no file'})")
        source = Path(origin).parent if locations else Path(origin)
        size = _size(source)
        if size > MAX_BYTES:
            return Snapshot(None, f"{source} holds {size / 2**20:.0f} MiB, more than "
                                  f"{MAX_BYTES // 2**20} MiB")
        try:
            dest = self._directory() / f"g{generation}"
            dest.mkdir()
            if locations:
                shutil.copytree(source, dest / source.name, symlinks=False,
                                ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, dest / source.name)
        except OSError as exc:
            return Snapshot(None, f"cannot copy {source}: {exc}")
        return Snapshot(str(dest))

    def _directory(self) -> Path:
        if self._dir is None:
            _remove_abandoned(self._root_parent)
            self._dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=self._root_parent))
        return self._dir

    def close(self) -> None:
        """Remove every copy (invariant 7: nothing left behind)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
        if total > MAX_BYTES:
            break
    return total


def _remove_abandoned(parent: Path) -> None:
    """Copies left by daemons of this user that were killed (their pid is gone)."""
    with contextlib.suppress(OSError):
        for entry in parent.iterdir():
            m = re.fullmatch(re.escape(_PREFIX) + r"([0-9]+)-\w+", entry.name)
            if m is None or _alive(int(m.group(1))):
                continue
            with contextlib.suppress(OSError):
                if entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid():
                    shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
