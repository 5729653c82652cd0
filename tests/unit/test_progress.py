"""The live progress display of `ringmaster run` draws only while the process is in its
terminal's foreground (issue 28: backgrounded from an interactive shell, it redrew over the
shell's prompt)."""

from __future__ import annotations

import io
import os
import pty
from typing import Any

from rich.console import Console

from runtime.ops.progress import ProgressDisplay
from runtime.ops.status import StatusSnapshot, WindowCpu


def snap(records: int) -> StatusSnapshot:
    return StatusSnapshot(pid=1, group="g", ordering="partition", elapsed_s=1, window_s=1, join_s=0,
                          supervisor_cpu_s=0, window_cpu_s=WindowCpu(0, 0), supervisor_rss=None,
                          records=records, rate=0, outputs=0, dead_letters=0, discarded=0, batches=0,
                          consumed=0, deferred=0, restarts=0, paused=0, lag=0, partitions=[], workers=[],
                          revocations=[], committed={})


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=80), out


def test_in_the_background_nothing_is_written_and_back_in_front_a_fresh_view_starts() -> None:
    console, out = terminal()
    front = [True]
    display = ProgressDisplay(console=console, foreground=lambda: front[0])
    display.update(snap(111))
    assert "111" in out.getvalue()
    front[0] = False  # Ctrl-Z, bg
    before = out.getvalue()
    display.update(snap(222))
    display.update(snap(333))
    written = out.getvalue()[len(before):]
    assert "222" not in written and "333" not in written
    assert "\x1b[1A" not in written and "\x1b[2K" not in written, "no cursor moved, no line erased"
    front[0] = True  # fg
    mark = len(out.getvalue())
    display.update(snap(444))
    again = out.getvalue()[mark:]
    assert "444" in again
    assert "\x1b[1A" not in again.split("444")[0], "the new view starts below, not over the shell"
    display.close()


def test_started_in_the_background_it_never_draws_and_closes_silently() -> None:
    console, out = terminal()
    display = ProgressDisplay(console=console, foreground=lambda: False)
    for n in range(5):
        display.update(snap(n))
    display.close()
    assert out.getvalue() == ""


def _child_reports(fn: Any) -> str:
    """Run ``fn`` in a child whose controlling terminal is a new pty; what it printed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: session leader, in the pty's foreground process group
        try:
            os.write(1, fn().encode())
        finally:
            os._exit(0)
    chunks = []
    while True:
        try:
            data = os.read(fd, 1024)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.waitpid(pid, 0)
    os.close(fd)
    return b"".join(chunks).decode()


def _foreground_then_background() -> str:
    from runtime.ops.progress import in_foreground

    tty = open(1, "w", closefd=False)  # noqa: SIM115  fd 1, the pty (sys.stdout may be pytest's capture)
    first = in_foreground(tty)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a job of its own, as a shell's `&` makes it: not the terminal's foreground
        os.setpgid(0, 0)
        os.write(w, b"1" if in_foreground(tty) else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    second = os.read(r, 1) == b"1"
    return f"<{first}/{second}>"


def test_in_foreground_reads_the_terminals_foreground_process_group() -> None:
    assert "<True/False>" in _child_reports(_foreground_then_background)


def test_a_stream_that_is_no_terminal_counts_as_foreground() -> None:
    from runtime.ops.progress import in_foreground

    assert in_foreground(io.StringIO())
