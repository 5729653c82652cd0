"""The optional C speedups (runtime/transport/_speedups.c) and the switch between them and Python.

Each hot path that has a C version keeps its pure-Python twin. A path starts in C when the
extension was built; the first call in each process runs both and compares the results,
and any disagreement or unexpected error switches that path to Python for good, with one
warning. A path may name ``input_faults``: errors that mean "this input is bad" (both
versions raise them alike), which pass through and change nothing. Nothing depends on the
extension: without a compiler the package installs and runs at Python speed.
``RINGMASTER_NO_SPEEDUPS=1`` forces Python everywhere.

Runs in: supervisor and workers (each process decides for itself).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any, Generic, TypeVar

log = logging.getLogger("ringmaster.speedups")


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("RINGMASTER_NO_SPEEDUPS", "") not in ("", "0"):
        return None, "disabled by RINGMASTER_NO_SPEEDUPS"
    try:
        from runtime.transport import _speedups
    except ImportError as exc:
        return None, f"not built ({exc}); reinstall with a C compiler and Python headers"
    # An extension built from an older _speedups.c (an editable install not rebuilt after a
    # pull) lacks what this code calls: Python everywhere, said as such, not an AttributeError.
    missing = [name for name in _REQUIRED if not hasattr(_speedups, name)]
    if missing:
        return None, (f"built from an older source (no {', '.join(missing)}); reinstall to rebuild "
                      "the C speedups")
    return _speedups, "built"


# What the C module of this source defines (runtime/transport/_speedups.c's method table).
_REQUIRED = ("bind", "pack_frame", "build_records", "copy_records", "load_acquire", "store_release")


native, native_status = _load()

R = TypeVar("R")


class HotPath(Generic[R]):
    """One hot path: ``call(*args)`` runs the C version while it is trusted, else Python. Both
    versions return an R."""

    def __init__(self, name: str, c_fn: Callable[..., R] | None, py_fn: Callable[..., R],
                 same: Callable[[R, R], bool] = lambda a, b: a == b,
                 why_python: str | None = None,
                 input_faults: tuple[type[BaseException], ...] = ()) -> None:
        self.name = name
        self._input_faults = input_faults
        self._c = c_fn
        self._py = py_fn
        self._same = same
        self._verified = False
        self.why_python = None if c_fn is not None else (why_python or native_status)

    def use_c(self, c_fn: Callable[..., R] | None) -> None:
        """Switch to (or away from) a C version found later: checked again on its first call."""
        self._c = c_fn
        self._verified = False
        self.why_python = None if c_fn is not None else native_status

    @property
    def in_c(self) -> bool:
        return self._c is not None

    def call(self, *args: Any) -> R:
        c_fn = self._c
        if c_fn is None:
            return self._py(*args)
        try:
            result = c_fn(*args)
        except self._input_faults:
            # The input's fault, raised alike by both versions: not a reason to distrust C,
            # and the Python version must not be run over the same input again.
            raise
        except Exception as exc:  # a bug or an unforeseen input: Python is always right
            self._fall_back(f"{type(exc).__name__}: {exc}")
            return self._py(*args)
        if not self._verified:
            # The first call in this process is checked against Python: the C version
            # relies on the types of its inputs behaving as documented, so prove it once.
            expected = self._py(*args)
            if not self._same(result, expected):
                self._fall_back("its result differs from the Python version's")
                return expected
            self._verified = True
        return result

    def _fall_back(self, why: str) -> None:
        self._c = None
        self.why_python = why
        log.warning("C speedup disabled; using the Python version", extra={"path": self.name, "why": why})


# What running without the C speedups costs, measured (scripts/bench_packing.py, 500 records of
# 256 B, medians on a loaded 2-core machine: 870 against 320 ns per record packed).
PYTHON_COST = ("each record is packed and unpacked in Python instead of C, about 2.7× the C path's "
               "cost per record packed (870 against 320 ns), which a plugin that does little per "
               "record feels in its throughput")
FIX = "install a built wheel (scripts/build) or reinstall with a C compiler and Python headers"


def python_warning(paths: list[HotPath[Any]]) -> str | None:
    """One plain line when any path runs in Python (None when all run in C): which, why, what
    it costs and the fix."""
    slow = [p for p in paths if not p.in_c]
    if not slow:
        return None
    which = ", ".join(f"{p.name} ({p.why_python})" for p in slow)
    return f"the C speedups are off for {which}: {PYTHON_COST}; {FIX}"


def describe(paths: list[HotPath[Any]]) -> str:
    """One line for logs and ``ringmaster check``."""
    return ", ".join(f"{p.name}: {'C' if p.in_c else 'Python (' + str(p.why_python) + ')'}" for p in paths)
