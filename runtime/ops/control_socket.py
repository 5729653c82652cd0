"""The control socket: how ``ringmaster reload`` and ``ringmaster scale`` reach a running
daemon, and learn how it went.

    CLI ──connect, one JSON line──▶ socket ──accepted and read without blocking, once per tick──▶ loop
        ◀───────────── one JSON line, when the operation is done or failed ◀──────────────────────┘

A Unix domain socket, mode 0600, at ``supervisor.control_socket``; by default
``<dir>/<group_id>.sock`` in a directory only its user may enter (tmux's habit), so the daemon
and the CLI find it from the config alone: ``$XDG_RUNTIME_DIR/ringmaster`` when the session
has a runtime directory private to this user (no other user can create it first), else
``/tmp/ringmaster-<uid>``. That one another local user could create first: the daemon then
refuses it with exit 4 (:class:`ControlDirUnusable`, restarted by a service manager) and says
to remove it or set ``XDG_RUNTIME_DIR`` or ``supervisor.control_socket``.

**Several daemons of one group on one host**, started with the same config, each get a
socket: the first the path above, the next ones ``<group_id>.<pid>.sock`` beside it (the
choice is made under an ``flock`` of the directory, so two daemons starting together cannot
both take, or both remove, one path). The CLI sends its command to every socket of the group
it finds there (:func:`find_daemons`) and says which daemon answered what.

Only the daemon's user (or root) may connect: the socket's mode, and the peer's credentials
checked on every connection. The CLI checks its peer too (``SO_PEERCRED``): it talks only to
a daemon of its own user or root (root also to the owner of the socket's directory), never
to whatever another user left listening on the path. Not the admin HTTP endpoint: it has no
authentication and may listen on the network. Not only signals: they coalesce, carry no
argument (``scale --processes 7``) and tell the sender nothing of the outcome (SIGHUP,
SIGTTIN and SIGTTOU still work, as in gunicorn).

Runs in: the supervisor (:class:`ControlServer`, polled by its loop) and the CLI
(:func:`send_command`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import socket
import stat
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.config import Settings
from runtime.errors import CommandTimeout, ConfigError, ControlDirUnusable, DaemonUnreachable

log = logging.getLogger("ringmaster.control_socket")

_MAX_REQUEST_BYTES = 64 * 1024
_READ_TIMEOUT_S = 5.0  # a client that has not sent its request by then is dropped
_REPLY_TIMEOUT_S = 0.5  # a reply is a few hundred bytes: the kernel buffer takes it at once
_DEFAULT_ROOT = Path("/tmp")
_NAME_MAX = 60
_SUN_PATH_MAX = 108


def control_socket_path(settings: Settings) -> Path | None:
    """Where the daemon of these settings listens; None when the socket is turned off
    (``supervisor.control_socket = ""``)."""
    configured = settings.supervisor.control_socket
    if configured is not None:
        return Path(configured) if configured else None
    group = settings.kafka.group_id
    name = re.sub(r"[^A-Za-z0-9._-]", "_", group)
    if len(name) > _NAME_MAX:  # sun_path holds 107 bytes: keep a recognisable head, and a hash
        name = f"{name[:40]}-{hashlib.sha256(group.encode()).hexdigest()[:12]}"
    return default_dir() / f"{name}.sock"


def default_dir() -> Path:
    """The directory of the default path, for a daemon started in this environment."""
    return default_dirs()[0]


def default_dirs() -> list[Path]:
    """Where a daemon of this user may have put its default socket, most private first: the
    session's runtime directory (only when it is this user's and private, as pam_systemd makes
    it), then ``/tmp/ringmaster-<uid>``. The CLI looks in each: its environment may differ from
    the daemon's (a service has no session)."""
    out = []
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(xdg):
        with contextlib.suppress(OSError):
            st = os.stat(xdg)
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
                out.append(Path(xdg) / "ringmaster")
    out.append(_DEFAULT_ROOT / f"ringmaster-{os.getuid()}")
    return out


def sibling(base: Path, pid: int) -> Path:
    """The socket of a daemon that found ``base`` taken by a live daemon of its group."""
    if base.suffix == ".sock":
        return base.with_name(f"{base.stem}.{pid}.sock")
    return base.with_name(f"{base.name}.{pid}")


def _sibling_pid(base: Path, name: str) -> int | None:
    stem, suffix = (base.stem, ".sock") if base.suffix == ".sock" else (base.name, "")
    m = re.fullmatch(re.escape(stem) + r"\.([0-9]{1,10})" + re.escape(suffix), name)
    return int(m.group(1)) if m else None


def candidates(base: Path) -> list[Path]:
    """``base`` and its pid-named siblings that exist as sockets, ``base`` first, then by pid."""
    found: list[tuple[int, Path]] = []
    try:
        names = os.listdir(base.parent)
    except OSError:
        return []
    for name in names:
        rank = 0 if name == base.name else _sibling_pid(base, name)
        if rank is None:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISSOCK(os.lstat(base.parent / name).st_mode):
                found.append((rank, base.parent / name))
    return [p for _, p in sorted(found)]


def find_daemons(settings: Settings) -> tuple[list[Path], Path | None]:
    """(the sockets of this group's daemons on this host, in every directory a daemon of this
    config may have used; the path a lone daemon would use, for messages). Runs in: the CLI."""
    base = control_socket_path(settings)
    if base is None:
        return [], None
    if settings.supervisor.control_socket:
        return candidates(base), base
    found: list[Path] = []
    for d in default_dirs():
        found += candidates(d / base.name)
    return found, base


@dataclass(eq=False)
class Request:
    """One command from a client, waiting for its reply (the connection stays open meanwhile)."""

    body: dict[str, Any]
    conn: socket.socket | None

    def reply(self, body: dict[str, Any]) -> None:
        """Send the one reply and close. A client that went away (its timeout) is no error."""
        conn, self.conn = self.conn, None
        if conn is None:
            return
        try:
            conn.settimeout(_REPLY_TIMEOUT_S)
            conn.sendall(json.dumps(body).encode() + b"\n")
        except OSError:
            log.debug("control client went away before its reply", exc_info=True)
        finally:
            conn.close()

    @property
    def answered(self) -> bool:
        return self.conn is None


@dataclass(eq=False)
class _Reading:
    conn: socket.socket
    deadline: float
    data: bytearray = field(default_factory=bytearray)


class ControlServer:
    """The daemon's end. ``poll()`` never blocks: it accepts what is waiting, reads what has
    arrived, and returns the requests that are complete."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic, *,
                 beside: bool = False) -> None:
        """``beside``: take the pid-named sibling even if ``path`` is free (a member of
        ``ringmaster run --members`` other than the first: the first takes ``path``, whichever
        of them starts listening first)."""
        self.path = path
        self._clock = clock
        self._reading: list[_Reading] = []
        if path.parent in default_dirs():
            _private_dir(path.parent)
        elif not path.parent.is_dir():
            raise ConfigError(f"supervisor.control_socket: directory {str(path.parent)!r} does not exist")
        with _dir_locked(path.parent):
            _clear_stale_siblings(path)
            if beside or _in_use(path):
                path = self.path = sibling(path, os.getpid())
                if len(os.fsencode(str(path))) >= _SUN_PATH_MAX:
                    raise ConfigError(f"supervisor.control_socket: {str(path)!r} is too long for a socket "
                                      "address; give this daemon a shorter supervisor.control_socket")
                if _in_use(path):  # our pid, in another pid namespace sharing the directory
                    raise ConfigError(f"supervisor.control_socket: {str(path)!r} is in use by another "
                                      "running daemon; give this one a supervisor.control_socket of its own")
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            # INVARIANT: the socket is never reachable with a wider mode than 0600, not even
            # between bind() and a chmod (the loop's thread is the only one running here).
            old_mask = os.umask(0o177)
            try:
                self._sock.bind(str(path))
            except OSError as exc:
                self._sock.close()
                raise ConfigError(f"supervisor.control_socket: cannot listen on {str(path)!r}: "
                                  f"{exc.strerror}") from None
            finally:
                os.umask(old_mask)
            self._sock.listen(16)  # before the lock goes: a daemon probing next sees it live
        self._inode = os.stat(path).st_ino
        self._sock.setblocking(False)
        log.info("control socket listening", extra={"path": str(path)})

    def fileno(self) -> int:
        return self._sock.fileno()

    def poll(self) -> list[Request]:
        """Requests complete now. Runs in: the loop, once per tick."""
        while True:
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # out of descriptors, ...: try again next tick
                log.warning("control socket: accept failed", extra={"error": str(exc)})
                break
            conn.setblocking(False)
            if not _peer_allowed(conn):
                Request({}, conn).reply({"ok": False, "message": "permission denied: only the daemon's "
                                                                 "user or root may send commands"})
                continue
            self._reading.append(_Reading(conn, self._clock() + _READ_TIMEOUT_S))
        done: list[Request] = []
        now = self._clock()
        for r in list(self._reading):
            finished, problem = self._read(r)
            if not finished and now < r.deadline:
                continue
            self._reading.remove(r)
            if not finished:
                problem = f"no complete request within {_READ_TIMEOUT_S:g} s"
            if problem is not None:
                Request({}, r.conn).reply({"ok": False, "message": problem})
                continue
            if not r.data:  # connected and closed without a word: another daemon's probe (_in_use)
                r.conn.close()
                continue
            done.append(Request(_parse(bytes(r.data)), r.conn))
        return done

    @staticmethod
    def _read(r: _Reading) -> tuple[bool, str | None]:
        """(the request is complete, what is wrong with it)."""
        while True:
            try:
                chunk = r.conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                return False, None
            except OSError as exc:
                return True, f"cannot read the request: {exc.strerror}"
            if not chunk:
                return True, None  # the client closed its side: that is the whole request
            r.data += chunk
            if len(r.data) > _MAX_REQUEST_BYTES:
                return True, f"request larger than {_MAX_REQUEST_BYTES} bytes"
            if b"\n" in chunk:
                return True, None

    def close(self) -> None:
        """Stop listening and remove the socket (invariant 7: nothing left behind), unless
        another daemon has replaced it meanwhile."""
        for r in self._reading:
            r.conn.close()
        self._reading.clear()
        self._sock.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)


def _parse(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data.split(b"\n", 1)[0] or b"null")
    except ValueError:
        body = None
    return body if isinstance(body, dict) else {"command": None}


def _peer_allowed(conn: socket.socket) -> bool:
    """The socket's mode already keeps others out; the peer's uid says so again (a socket
    made group-writable by hand, a path given in a shared directory)."""
    try:
        _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError:
        return False
    return uid in (os.getuid(), 0)


def _private_dir(path: Path) -> None:
    """The default directory: this user's only (created 0700), as tmux checks /tmp/tmux-<uid>.
    Another local user can create ``/tmp/ringmaster-<uid>`` first: that is a fault of the host
    (exit 4, restarted), not of the config, and the line says how to get out of it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        owner = f"owned by uid {st.st_uid}" if st.st_uid != os.getuid() else f"mode {mode:o}"
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a directory"
        raise ControlDirUnusable(
            f"control socket directory {str(path)!r} is {what} {owner}, not private to this user (uid "
            f"{os.getuid()}, mode 0700): another user may have created it; remove it, or run with "
            "XDG_RUNTIME_DIR set, or set supervisor.control_socket")


@contextlib.contextmanager
def _dir_locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on the directory: one daemon at a time looks at, removes and
    binds the sockets in it."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # a directory we may enter and write but not read: no lock, as before
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def clear_stale(base: Path) -> None:
    """Remove the sockets of this group's daemons at ``base`` and beside it whose daemon is
    gone (``ringmaster run --members``, once its members have exited: a killed one leaves its
    socket). A live daemon's socket is left alone."""
    if not base.parent.is_dir():
        return
    with _dir_locked(base.parent):
        _clear_stale_siblings(base)
        with contextlib.suppress(ConfigError):
            _in_use(base)


def _clear_stale_siblings(base: Path) -> None:
    """Pid-named sockets of daemons of this group that were killed: removed, as the base is."""
    for p in candidates(base):
        if p != base:
            with contextlib.suppress(ConfigError):
                _in_use(p)


def _in_use(path: Path) -> bool:
    """Whether a live daemon answers on ``path``; a socket left by a daemon that was killed is
    removed (False). Called with the directory locked."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"supervisor.control_socket: {str(path)!r} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError(f"supervisor.control_socket: cannot check {str(path)!r}: "
                              f"{exc.strerror}") from None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        log.info("removed a control socket left by a daemon that is gone", extra={"path": str(path)})
        return False
    finally:
        probe.close()
    return True


def _check_peer(sock: socket.socket, path: Path) -> None:
    """The CLI talks only to a daemon of its own user or root (and, as root, to the owner of
    the socket's directory: a service's user): whatever else listens on the path may be
    another user's, waiting for our commands or lying about their outcome."""
    try:
        _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              struct.calcsize("3i")))
    except OSError as exc:
        raise DaemonUnreachable(f"cannot tell who listens on {path!s}: {exc.strerror or exc}") from None
    me = os.getuid()
    if uid in (me, 0):
        return
    if me == 0:
        with contextlib.suppress(OSError):
            if os.stat(path.parent).st_uid == uid:
                return
    raise DaemonUnreachable(f"refusing {path!s}: the process listening there runs as uid {uid}, not as "
                            f"this user (uid {me}) or root; another user may have put it there")


def send_command(path: Path, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """Send one request and wait for its reply. Runs in: the CLI. Raises DaemonUnreachable
    (nothing answers at ``path``) or CommandTimeout (no reply within ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(min(timeout_s, 5.0))
        try:
            sock.connect(str(path))
            _check_peer(sock, path)
            sock.sendall(json.dumps(request).encode() + b"\n")
        except FileNotFoundError:
            raise DaemonUnreachable(f"no daemon: {path!s} does not exist (is the daemon running, with "
                                    "this config's supervisor.control_socket?)") from None
        except ConnectionRefusedError:
            raise DaemonUnreachable(f"no daemon listens on {path!s} (left by a daemon that was killed)") \
                from None
        except PermissionError:
            raise DaemonUnreachable(f"cannot connect to {path!s}: permission denied (run as the daemon's "
                                    "user)") from None
        except OSError as exc:
            raise DaemonUnreachable(f"cannot connect to {path!s}: {exc.strerror or exc}") from None
        data = bytearray()
        while b"\n" not in data:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommandTimeout(f"no answer within {timeout_s:g} s; the daemon may still carry it out "
                                     "(ringmaster status shows how it went)")
            sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError as exc:
                raise DaemonUnreachable(f"the daemon dropped the connection: {exc.strerror or exc}") from None
            if not chunk:
                break
            data += chunk
    finally:
        sock.close()
    try:
        reply = json.loads(bytes(data).split(b"\n", 1)[0])
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise DaemonUnreachable("the daemon closed the connection without an answer (is it stopping?)")
    return reply
