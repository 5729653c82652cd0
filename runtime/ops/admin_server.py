"""The admin endpoint: one small HTTP server for monitoring systems and `ringmaster status`/`top`.

    GET /metrics   Prometheus exposition (runtime/ops/metrics.py)
    GET /healthz   liveness: 503 only when the supervisor's loop or a worker is stuck beyond
                   its bound, or a fatal error stops the daemon – never for lag, a broker
                   outage, an operator pause or a rebalance (a liveness probe that fails on
                   those turns every rebalance storm into a restart loop: arroyo's file
                   health check did)
    GET /readyz    readiness: workers started and the group joined
    GET /status    the status snapshot as JSON (the same document as the status file)

Every path answers GET and HEAD; any other method gets 405 with ``Allow: GET, HEAD``.

Off unless ``[admin] listen`` is set. A bare port or ``localhost`` binds loopback; another
address needs ``admin.allow_remote = true``, because nothing here authenticates: /status
shows topics, pids and partitions to anyone who can reach the port.

Runs in: one daemon thread of the supervisor (or the Spark driver), which shares the
supervisor's GIL, so every request must cost next to nothing and no client may hold
anything (issue 17.4: ~990 idle connections ran the supervisor out of file descriptors,
and four pollers cut its throughput from 51k to 20k records/s). Hence:

* one thread and a selector, never a thread per connection; sockets non-blocking;
* at most ``admin.max_connections`` open: at the cap, a new connection evicts the one
  that has waited longest for its request (an idle keep-alive, a slow or silent client),
  or, if every one is busy answering, is told 503 and closed at once. A request already
  there when its connection is accepted is answered right away; requests on open
  connections are read before new connections are accepted, and fewer than the cap are
  accepted per round: a health probe is answered even inside a flood of new connections;
* a client has ``admin.request_timeout_s`` to send its request and as long to read the
  answer (slowloris), and its request head may not exceed 8 KiB (431);
* answers are bytes rendered once per status snapshot (/status, and /metrics but for its
  two live gauges): polling clients never make the snapshot be rendered again;
* out of file descriptors (EMFILE), it stops accepting for a moment instead of spinning.

It only reads: published snapshots (replaced whole, never mutated) and functions that read
plain values.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from runtime.config import parse_listen
from runtime.errors import AdminListenFailed, ConfigError
from runtime.ops.metrics import RuntimeMetrics
from runtime.ops.status import StatusSnapshot

log = logging.getLogger("ringmaster.admin")

PATHS = ("/metrics", "/healthz", "/readyz", "/status")
ALLOW = "GET, HEAD"
MAX_HEAD_BYTES = 8192  # request line and headers
_MAX_REQUESTS_PER_CONNECTION = 1000
_ACCEPT_PAUSE_S = 0.5  # out of file descriptors: stop accepting this long
_JSON = "application/json"
_RESOURCE_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(frozen=True)
class Health:
    ok: bool
    reasons: list[str]


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    deadline: float  # the request must be in, or the answer out, by then
    since: float  # waiting for a request since (eviction picks the longest waiting)
    inbuf: bytearray = field(default_factory=bytearray)
    out: memoryview | None = None  # answer bytes not yet sent
    close_after: bool = False
    served: int = 0
    writing: bool = False  # registered for EVENT_WRITE (an answer did not go out at once)


class AdminServer:
    def __init__(self, listen: str, allow_remote: bool, metrics: RuntimeMetrics,
                 snapshot: Callable[[], StatusSnapshot | None], health: Callable[[], Health],
                 ready: Callable[[], bool], *, max_connections: int = 64, request_timeout_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        host, port = parse_listen(listen, allow_remote)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            self._listener = socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            # In use (a previous run's socket in TIME_WAIT is no problem: create_server sets
            # SO_REUSEADDR), or an address not on this host (yet: an interface that comes up
            # after the daemon at boot), may pass by itself: restartable, exit 13. Anything else
            # (EACCES below port 1024) is the configuration's: exit 2.
            if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
                raise AdminListenFailed(f"admin.listen: cannot listen on {host}:{port}: {exc.strerror} "
                                        "(another process holds it? `ss -ltnp` says which; the "
                                        "daemon exits 13 and systemd restarts it)") from None
            raise ConfigError(f"admin.listen: cannot listen on {host}:{port}: {exc.strerror}") from None
        self._listener.setblocking(False)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._metrics = metrics
        self._snapshot = snapshot
        self._health = health
        self._ready = ready
        self.max_connections = max_connections
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self._conns: dict[socket.socket, _Conn] = {}
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, self._wake_r)
        self._accept_paused_until: float | None = None
        self._status: tuple[StatusSnapshot | None, bytes] | None = None  # /status bytes per snapshot
        self._closing = False
        self._last_warning = float("-inf")
        self.refused = 0  # connections turned away at the cap, for tests and logs
        self.evicted = 0
        self._thread = threading.Thread(target=self._serve, name="ringmaster-admin", daemon=True)

    def start(self) -> AdminServer:
        self._thread.start()
        log.info("admin endpoint listening", extra={"url": f"http://{self.address}/",
                                                    "max_connections": self.max_connections})
        return self

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(5)
        for conn in list(self._conns.values()):
            self._drop(conn)
        for s in (self._listener, self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                s.close()
        self._sel.close()

    @property
    def connections(self) -> int:
        return len(self._conns)

    # ------------------------------------------------------------------ the loop
    def _serve(self) -> None:
        while not self._closing:
            try:
                self._tick()
            except Exception:  # a bug here must not end the endpoint (or the daemon) silently
                self._warn("admin endpoint error; carrying on", exc_info=True)
                time.sleep(0.1)

    def _tick(self) -> None:
        now = self.clock()
        waits = [c.deadline for c in self._conns.values()]
        if self._accept_paused_until is not None:
            waits.append(self._accept_paused_until)
        timeout = max(0.0, min(waits) - now) if waits else 1.0
        events = self._sel.select(min(timeout, 1.0))
        # RACE: requests first, new connections last: a connection's request read in this
        # round is answered before a new connection could evict it.
        events.sort(key=lambda event: event[0].data is None)
        for key, mask in events:
            if key.data is None:
                self._accept()
            elif key.data is self._wake_r:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(64)
            else:
                conn: _Conn = key.data
                try:
                    if mask & selectors.EVENT_READ:
                        self._read(conn)
                    if mask & selectors.EVENT_WRITE and conn.sock in self._conns:
                        self._flush(conn)
                    self._serve_buffered(conn)
                except OSError:
                    self._drop(conn)
        self._expire(self.clock())

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if now >= c.deadline]:
            self._drop(conn)  # too slow to send its request, or to read its answer
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._sel.register(self._listener, selectors.EVENT_READ, None)

    # ------------------------------------------------------------------ connections
    def _accept(self) -> None:
        # At most cap - 1 a round, the rest next round after reads: a connection accepted in
        # this round cannot be evicted by the others of this round before its request is read.
        for _ in range(max(1, self.max_connections - 1)):
            if self._closing:
                return
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRNOS:
                    # INVARIANT: never spin on a listener that stays readable while the process
                    # has no descriptor to give: stop accepting for a moment, free one.
                    self._warn("admin endpoint: no file descriptor for a new connection; pausing "
                               "accepts", extra={"error": str(exc), "connections": len(self._conns)})
                    self._evict()
                    self._sel.unregister(self._listener)
                    self._accept_paused_until = self.clock() + _ACCEPT_PAUSE_S
                return
            sock.setblocking(False)
            now = self.clock()
            if len(self._conns) >= self.max_connections and not self._evict():
                self._refuse(sock)
                continue
            conn = _Conn(sock, now + self.request_timeout_s, now)
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)
            try:  # the request is often there already: answer it before anything can evict it
                self._read(conn)
                self._serve_buffered(conn)
            except OSError:
                self._drop(conn)

    def _evict(self) -> bool:
        """Close the connection that has waited longest for its request; False if every one
        is busy answering."""
        waiting = [c for c in self._conns.values() if c.out is None]
        if not waiting:
            return False
        self._drop(min(waiting, key=lambda c: c.since))
        self.evicted += 1
        return True

    def _refuse(self, sock: socket.socket) -> None:
        self.refused += 1
        self._warn("admin endpoint: connection cap reached; refusing", extra={"max_connections":
                                                                             self.max_connections})
        with contextlib.suppress(OSError):
            sock.send(self._response(503, b'{"error": "busy"}', _JSON, close=True))
        with contextlib.suppress(OSError):
            sock.close()

    def _drop(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # ------------------------------------------------------------------ reading
    def _read(self, conn: _Conn) -> None:
        # INVARIANT: the buffer stays bounded: reading stops past one request head's worth
        # (the selector reports the rest again), and while an answer is being written the
        # connection is not read at all (registered for writing only).
        # Every socket call lets go of the GIL the supervisor shares and takes it back: one
        # recv() per request when it fits, not another to learn that nothing more is there.
        while len(conn.inbuf) <= MAX_HEAD_BYTES:
            try:
                data = conn.sock.recv(4096)
            except BlockingIOError:
                return
            if not data:
                self._drop(conn)  # the client went away
                return
            conn.inbuf += data
            if len(data) < 4096:
                return  # drained (level-triggered: more would be reported again)

    def _serve_buffered(self, conn: _Conn) -> None:
        """Answer the requests in the buffer (pipelined ones too), one at a time, while each
        answer goes out at once. A loop, not recursion: a buffer may hold hundreds."""
        while conn.sock in self._conns and conn.out is None and self._next_request(conn):
            pass

    def _next_request(self, conn: _Conn) -> bool:
        """Answer the request at the head of the buffer; False if it is not all there yet."""
        buf = conn.inbuf
        end = buf.find(b"\r\n\r\n")
        if end < 0 or end > MAX_HEAD_BYTES:
            if len(buf) > MAX_HEAD_BYTES:
                conn.inbuf = bytearray()
                self._answer(conn, 431, b'{"error": "request head larger than 8 KiB"}', _JSON, close=True)
                return True
            return False
        head = bytes(buf[:end]).decode("latin-1")
        del buf[:end + 4]
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            self._answer(conn, 400, b'{"error": "bad request"}', _JSON, close=True)
            return True
        method, target, version = parts
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self._answer(conn, 400, b'{"error": "bad header"}', _JSON, close=True)
                return True
            headers[name.strip().lower()] = value.strip()
        connection = headers.get("connection", "").lower()
        keep = "keep-alive" in connection if version == "HTTP/1.0" else "close" not in connection
        has_body = headers.get("content-length", "0") not in ("", "0") or "transfer-encoding" in headers
        # A body is never read: the connection closes after the answer instead.
        close = not keep or has_body or conn.served + 1 >= _MAX_REQUESTS_PER_CONNECTION
        if method not in ("GET", "HEAD"):
            self._answer(conn, 405, b'{"error": "method not allowed", "allow": ["GET", "HEAD"]}', _JSON,
                         close=True, extra=(("Allow", ALLOW),))
            return True
        code, body, content_type = self._route(target.split("?", 1)[0])
        self._answer(conn, code, body, content_type, close=close, head_only=method == "HEAD")
        return True

    def _route(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            return 200, self._metrics.exposition(), CONTENT_TYPE_LATEST
        if path == "/healthz":
            h = self._health()
            return 200 if h.ok else 503, json.dumps({"ok": h.ok, "reasons": h.reasons}).encode(), _JSON
        if path == "/readyz":
            ok = self._ready()
            return 200 if ok else 503, json.dumps({"ready": ok}).encode(), _JSON
        if path == "/status":
            snap = self._snapshot()
            if self._status is None or self._status[0] is not snap:
                self._status = (snap, json.dumps(snap.to_dict() if snap is not None else {}).encode())
            return 200 if snap is not None else 503, self._status[1], _JSON
        return 404, json.dumps({"error": "not found", "paths": list(PATHS)}).encode(), _JSON

    # ------------------------------------------------------------------ writing
    def _answer(self, conn: _Conn, code: int, body: bytes, content_type: str, *, close: bool,
                head_only: bool = False, extra: tuple[tuple[str, str], ...] = ()) -> None:
        data = self._response(code, body, content_type, close=close, extra=extra)
        if head_only:
            data = data[:len(data) - len(body)]
        conn.served += 1
        conn.close_after = close
        conn.out = memoryview(data)
        conn.deadline = self.clock() + self.request_timeout_s
        self._flush(conn)

    @staticmethod
    def _response(code: int, body: bytes, content_type: str, *, close: bool,
                  extra: tuple[tuple[str, str], ...] = ()) -> bytes:
        head = [f"HTTP/1.1 {code} {HTTPStatus(code).phrase}", f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}", "Cache-Control: no-store",
                f"Connection: {'close' if close else 'keep-alive'}",
                *(f"{k}: {v}" for k, v in extra)]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

    def _flush(self, conn: _Conn) -> None:
        while conn.out is not None and len(conn.out):
            try:
                sent = conn.sock.send(conn.out)
            except BlockingIOError:
                if not conn.writing:
                    conn.writing = True
                    self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
                return
            conn.out = conn.out[sent:]
        conn.out = None
        if conn.close_after:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._drop(conn)
            return
        now = self.clock()
        conn.deadline, conn.since = now + self.request_timeout_s, now
        if conn.writing:
            conn.writing = False
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    # ------------------------------------------------------------------ logs
    def _warn(self, message: str, **kwargs: Any) -> None:
        """At most one warning a minute: a flood of clients must not flood the log too."""
        now = self.clock()
        if now - self._last_warning >= 60:
            self._last_warning = now
            log.warning(message, **kwargs)
