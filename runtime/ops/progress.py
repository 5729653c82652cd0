"""Live progress and the end-of-run summary (rich). Runs in: supervisor, fed with status
snapshots at ``supervisor.status_interval_s``; never decides anything."""

from __future__ import annotations

import os
import termios
import time
from collections.abc import Callable
from typing import IO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from runtime.ops.status import StatusSnapshot

_SHOW_CURSOR = "\x1b[?25h"


def in_foreground(stream: IO[str]) -> bool:
    """Whether this process may draw on ``stream``'s terminal: it is in the terminal's
    foreground process group. False for a daemon started with ``&`` or sent to the background
    (Ctrl-Z, ``bg``): drawing then would redraw over the shell and what the user types. True
    when ``stream`` is no terminal of ours (a file, a pipe, someone else's tty): nothing to
    draw over there."""
    try:
        return os.tcgetpgrp(stream.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return True


def _tostop(stream: IO[str]) -> bool:
    """Whether the terminal stops background writers (``stty tostop``): it would then send
    SIGTTOU, which the supervisor reads as "one worker fewer" (signals.py)."""
    try:
        return bool(termios.tcgetattr(stream.fileno())[3] & termios.TOSTOP)
    except (OSError, ValueError, AttributeError, termios.error):
        return True  # unknown: do not write


class ProgressDisplay:
    """The live view of ``ringmaster run`` on its terminal, drawn only while the process is in
    the terminal's foreground (``foreground``, injected for tests): in the background it writes
    nothing, and it starts a fresh view below the shell's lines when brought back (``fg``).
    Where stderr is no terminal (a pipe, a file, a CI log: ``--progress`` asked for it) it
    writes one plain line every ``LINE_EVERY_S`` instead: a view cannot be redrawn there."""

    LINE_EVERY_S = 10.0

    def __init__(self, total: int | None = None, console: Console | None = None,
                 foreground: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.console = console or Console(stderr=True)
        self.total = total
        self.foreground = foreground or (lambda: in_foreground(self.console.file))
        self.clock = clock
        self._live = self._new_live()
        self._started = False
        self._line_at: float | None = None

    def _new_live(self) -> Live:
        return Live(console=self.console, auto_refresh=False, transient=False)

    def update(self, snap: StatusSnapshot) -> None:
        if not self.console.is_terminal:
            now = self.clock()
            if self._line_at is None or now - self._line_at >= self.LINE_EVERY_S or snap.stopped is not None:
                self._line_at = now
                self.console.print(self.line(snap), markup=False, highlight=False, soft_wrap=True)
            return
        if not self.foreground():
            self._leave_quietly()
            return
        if not self._started:
            self._live.start()
            self._started = True
        self._live.update(self.render(snap), refresh=True)

    def _leave_quietly(self) -> None:
        """Stop the view without drawing its last frame over what the shell now shows; only the
        cursor, hidden while the view ran, is shown again, where the terminal lets a background
        process write without stopping it."""
        if not self._started:
            return
        self.console.quiet = True
        try:
            self._live.stop()
        finally:
            self.console.quiet = False
        self._started = False
        self._live = self._new_live()  # the next view starts afresh, below what is there then
        if self.console.is_terminal and not _tostop(self.console.file):
            self.console.file.write(_SHOW_CURSOR)
            self.console.file.flush()

    def close(self) -> None:
        if not self._started:
            return
        if not self.foreground():
            self._leave_quietly()
            return
        self._live.stop()
        self._started = False
        if not self.console.is_terminal:
            self.console.line()

    def line(self, snap: StatusSnapshot) -> str:
        """The progress in one plain line (where no view can be drawn)."""
        done = f"{snap.records:,}" + (f" of {self.total:,}" if self.total else "")
        alive = sum(w.alive for w in snap.workers)
        return (f"progress: {done} records done ({snap.recent_rate or snap.rate:,.0f}/s), lag {snap.lag:,}, "
                f"{snap.outputs:,} outputs, {snap.dead_letters:,} dead letters, {alive} workers, "
                f"{snap.elapsed_s:,.0f} s")

    def render(self, snap: StatusSnapshot) -> Group:
        head = Table.grid(padding=(0, 2))
        done = f"{snap.records:,}" + (f" / {self.total:,}" if self.total else "")
        head.add_row("records done", done, "rate", f"{snap.rate:,.0f}/s", "lag", f"{snap.lag:,}")
        head.add_row("outputs", f"{snap.outputs:,}", "dead letters", f"{snap.dead_letters:,}",
                     "paused partitions", f"{snap.paused}/{len(snap.partitions)}")
        workers = Table(title=None, show_edge=False, box=None)
        for col in ("worker", "pid", "records", "ring", "in flight", "restarts", "rss MiB"):
            workers.add_column(col, justify="right")
        for w in snap.workers:
            workers.add_row(str(w.index), str(w.pid or "-"), f"{w.records:,}", f"{w.ring_fill:.0%}",
                            str(w.in_flight), str(w.restarts), f"{(w.rss or 0) / 2**20:.0f}")
        return Group(head, workers)


def summary_table(snap: StatusSnapshot) -> Table:
    t = Table(title="ringmaster run summary", show_header=False)
    t.add_row("records processed", f"{snap.records:,}")
    t.add_row("elapsed", f"{snap.elapsed_s:.1f} s (of which joining the group {snap.join_s:.1f} s)")
    t.add_row("throughput", f"{snap.records / max(snap.window_s, 1e-9):,.0f} records/s "
                            f"(first record consumed → all committed, {snap.window_s:.2f} s)")
    t.add_row("outputs written", f"{snap.outputs:,}")
    t.add_row("dead letters", f"{snap.dead_letters:,}")
    t.add_row("worker restarts", f"{snap.restarts}")
    total = max(snap.records, 1)
    for w in snap.workers:
        t.add_row(f"worker {w.index} share", f"{w.records:,} ({w.records / total:.1%})")
    for tp, off in snap.committed.items():
        t.add_row(f"committed {tp}", f"{off:,}")
    if not snap.committed and (snap.transactions_committed or snap.transactions_aborted):
        # Exactly-once: the supervisor commits nothing; a batch is done once the transaction that
        # carried its outputs and its offsets committed, so what is done is what is committed.
        t.add_row("transactions", f"{snap.transactions_committed:,} committed, {snap.transactions_aborted:,} "
                                  "aborted")
        for p in snap.partitions:
            if p.done_through is not None:
                t.add_row(f"committed {p.tp}", f"{p.done_through:,} (in the workers' transactions)")
    return t
