"""This daemon's slot among the live daemons of its group on this host: the lowest number that
no live daemon of the group holds, held for the daemon's life.

Why: under exactly-once each worker slot has a transactional id (runtime/kafka/transactions.py).
For a daemon that replaces one that died (SIGKILL, OOM, a crash loop under systemd) to fence the
transactions the dead one left open, at once rather than after ``transaction.timeout.ms``, its
ids must be the dead one's; and two live daemons of the group must never share one, or each
would fence the other's producers in turn. Host name and slot give both: a replacement takes
the slot its predecessor held (the lowest free one), a second live daemon the next.

How: a slot is an abstract Unix socket named after the group and the number, bound for the
daemon's life. The kernel lets go of it when the process dies, however it dies, and leaves no
file behind (a lock file would outlive a SIGKILL and need reclaiming). Abstract names belong to
a network namespace: daemons of one host share it; a container with a network namespace of its
own is a host of its own, with a host name of its own.

Runs in: supervisor (at start, before any worker).
"""

from __future__ import annotations

import contextlib
import hashlib
import socket

from runtime.errors import RingmasterError

# More daemons of one group on one host than anyone runs; a bound so that a bug cannot loop.
MAX_SLOTS = 1024


def _name(group: str, index: int) -> bytes:
    # A group name may be 249 characters and an abstract name at most 107 bytes: a digest.
    digest = hashlib.blake2b(group.encode(), digest_size=12).hexdigest()
    return f"\0ringmaster-member-{digest}-{index}".encode()


class MemberSlot:
    """A claimed slot: ``index`` is this daemon's number on this host for its group."""

    def __init__(self, index: int, sock: socket.socket) -> None:
        self.index = index
        self._sock = sock

    def release(self) -> None:
        """Let go of the slot (at exit; a process that dies lets go of it anyway)."""
        with contextlib.suppress(OSError):
            self._sock.close()


def claim(group: str, limit: int = MAX_SLOTS) -> MemberSlot:
    """The lowest slot of ``group`` no live process on this host holds, held until released or
    until this process dies."""
    for index in range(limit):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inherited by workers
        try:
            sock.bind(_name(group, index))
        except OSError:
            sock.close()
            continue
        return MemberSlot(index, sock)
    raise RingmasterError(f"{limit} daemons of group {group!r} already run on this host: no slot left")


def member_name(host: str, slot: int) -> str:
    """What names this daemon in its transactional ids: the host and its slot there."""
    return f"{host}-m{slot}"
