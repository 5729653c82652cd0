"""Words of a shared-memory table that another process reads in the order they were written.

A ring's writer stores a frame's bytes, then publishes its new position; the reader must never
see the position before the bytes (and the writer must never see the reader's position move
before the reader is done with the bytes it releases). A worker's board stores a phase's
time, then the phase. Python has no ordered loads or stores, and a memoryview store is a
plain one:

* x86-64 orders plain stores and loads this way by itself (TSO: no store is seen before an
  earlier store, no load is satisfied before an earlier load), so plain accesses are enough;
* arm64 and other weakly ordered CPUs do not, so the C speedups' ``load_acquire`` /
  ``store_release`` (``__atomic`` with acquire / release ordering) are used wherever they were
  built, whatever the CPU; and without them the daemon refuses to start there
  (:func:`ordering_problem`), rather than run on an order it cannot prove.

Runs in: supervisor and workers.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable

from runtime.transport import speedups

# platform.machine() of the CPUs whose plain 8-byte loads and stores are ordered as above
# (and single-copy atomic when aligned): x86-64 under its Linux, BSD and Windows names.
STRONGLY_ORDERED = frozenset({"x86_64", "amd64", "AMD64"})

Load = Callable[[int], int]
Store = Callable[[int, int], None]


def ordered_access(words: memoryview) -> tuple[Load, Store]:
    """(load_acquire(index), store_release(index, value)) over ``words``, a memoryview cast to
    8-byte items ('q' or 'Q', values below 2**63). The C versions when built, else the view's
    own plain item access (ordered only where :func:`ordering_problem` says nothing)."""
    native = speedups.native
    if native is None:
        return words.__getitem__, words.__setitem__
    return (functools.partial(native.load_acquire, words),
            functools.partial(native.store_release, words))


def ordering_problem(machine: str | None = None) -> str | None:
    """None when shared memory is safe here; else the one line that says why not and the fix.
    ``machine``: platform.machine(), given by tests."""
    machine = platform.machine() if machine is None else machine
    if speedups.native is not None or machine in STRONGLY_ORDERED:
        return None
    return (f"this CPU ({machine or 'unknown'}) does not order memory as x86-64 does, and the C "
            f"speedups that order the shared-memory rings here are off ({speedups.native_status}); "
            "install a built wheel or reinstall with a C compiler and Python headers "
            "(and unset RINGMASTER_NO_SPEEDUPS)")
