"""sd_notify without a dependency: READY=1, STOPPING=1, WATCHDOG=1 and STATUS= for a
``Type=notify`` unit. Does nothing when not started by systemd (no NOTIFY_SOCKET)."""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self) -> None:
        addr = os.environ.get("NOTIFY_SOCKET")
        self._addr = ("\0" + addr[1:]) if addr and addr.startswith("@") else addr
        usec = os.environ.get("WATCHDOG_USEC")
        self.watchdog_interval_s = int(usec) / 2e6 if usec and usec.isdigit() else None

    def notify(self, *lines: str) -> None:
        if not self._addr:
            return
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto("\n".join(lines).encode(), self._addr)
        except OSError:
            pass  # systemd gone: nothing useful to do
