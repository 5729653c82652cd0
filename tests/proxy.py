"""A loopback TCP proxy that a test can cut (close every connection, refuse new ones) and
restore: the broker "goes away and comes back" without losing its in-memory state.

It also reads the Kafka protocol's framing (a 4-byte size, then the request, whose first
two bytes are the API key) from client to broker, so that a test can make the broker
refuse one kind of request while everything else goes on: ``block(PRODUCE, "stall")``
swallows Produce requests (the broker seems unreachable to producers only: consumers
still fetch and commit), ``block(PRODUCE, "reset")`` drops the connection that sent one
(the broker refuses it)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading

PRODUCE = 0  # Kafka API keys: Produce requests,
OFFSET_COMMIT = 8  # OffsetCommit requests,
OFFSET_FETCH = 9  # OffsetFetch requests (a group's committed offsets)


class Proxy:
    def __init__(self, listen_port: int, target_port: int) -> None:
        """``listen_port`` 0: the kernel picks one at start (``listen_port`` then says which),
        kept across cuts. A port asked of free_port() and bound later can be taken meanwhile by
        a parallel row's client (EADDRINUSE: the fault matrix's dead-letter-unreachable row)."""
        self.listen_port, self.target_port = listen_port, target_port
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._blocked: dict[int, str] = {}  # api key -> "stall" | "reset"
        self.swallowed = 0

    def block(self, api_key: int, how: str = "stall") -> None:
        assert how in ("stall", "reset")
        self._blocked[api_key] = how

    def unblock(self, api_key: int) -> None:
        self._blocked.pop(api_key, None)

    def start(self) -> Proxy:
        self.restore()
        return self

    def restore(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.listen_port))
            self.listen_port = s.getsockname()[1]
            s.listen(64)
            self._listener = s
        t = threading.Thread(target=self._accept, args=(s,), daemon=True)
        t.start()
        self._threads.append(t)

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def close(self) -> None:
        self._stop.set()
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), 5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        """a: the client, b: the broker."""
        sel = selectors.DefaultSelector()
        pending = b""  # client bytes not yet forwarded: an incomplete request
        try:
            # A cut() between the accept and here has closed them already (fd -1: ValueError).
            sel.register(a, selectors.EVENT_READ, b)
            sel.register(b, selectors.EVENT_READ, a)
            while not self._stop.is_set():
                for key, _ in sel.select(0.5):
                    data = key.fileobj.recv(65536)  # type: ignore[union-attr]
                    if not data:
                        return
                    if key.fileobj is not a:
                        key.data.sendall(data)
                        continue
                    pending += data
                    while len(pending) >= 6:
                        size = int.from_bytes(pending[:4], "big")
                        if len(pending) < 4 + size:
                            break
                        request, pending = pending[:4 + size], pending[4 + size:]
                        how = self._blocked.get(int.from_bytes(request[4:6], "big", signed=True))
                        if how == "reset":
                            return
                        if how == "stall":
                            self.swallowed += 1
                            continue
                        b.sendall(request)
        except (OSError, ValueError):
            return
        finally:
            sel.close()
            for s in (a, b):
                with contextlib.suppress(OSError):
                    s.close()
