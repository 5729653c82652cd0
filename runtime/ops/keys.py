"""Single keys from the terminal, for ``ringmaster top``: ``q`` leaves it, like top(1) and
less(1). Runs in: the operator command's process.

While the view runs, the terminal is in cbreak mode (a key arrives without Enter and is not
echoed over the view); the mode it had is put back on every way out, Ctrl-C included. On
stdin that is not a terminal (a pipe, /dev/null), no key is read: ``wait`` only sleeps.
"""

from __future__ import annotations

import os
import select
import sys
import termios
import time
import tty
from types import TracebackType
from typing import IO, Any

QUIT_KEYS = frozenset("qQ")


class Keys:
    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdin
        self._fd: int | None = None
        self._saved: list[Any] | None = None

    def __enter__(self) -> Keys:
        try:
            fd = self.stream.fileno()
            if os.isatty(fd):
                self._saved = termios.tcgetattr(fd)
                tty.setcbreak(fd, termios.TCSANOW)
                self._fd = fd
        except (OSError, ValueError, AttributeError, termios.error):
            self._fd = None  # no terminal to read keys from: wait() sleeps
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._fd is not None and self._saved is not None:
            # TCSADRAIN: what the view wrote goes out before the shell's mode comes back
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)
        self._fd = None

    def wait(self, timeout_s: float) -> str | None:
        """Wait up to ``timeout_s`` for a key; the key, or None when none came (or there is no
        terminal to read from)."""
        if self._fd is None:
            time.sleep(timeout_s)
            return None
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if not ready:
            return None
        data = os.read(self._fd, 32)
        if not data:  # the terminal went away: nothing more will come
            time.sleep(timeout_s)
            return None
        return data.decode(errors="replace")[:1]
