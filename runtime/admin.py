"""The admin endpoint: one small HTTP server for monitoring systems and `ringmaster status`/`top`.

    GET /metrics   Prometheus exposition (runtime/metrics.py)
    GET /healthz   liveness: 503 only when the supervisor's loop or a worker is stuck beyond
                   its bound, or a fatal error stops the daemon – never for lag, a broker
                   outage, an operator pause or a rebalance (a liveness probe that fails on
                   those turns every rebalance storm into a restart loop: arroyo's file
                   health check did)
    GET /readyz    readiness: workers started and the group joined
    GET /status    the status snapshot as JSON (the same document as the status file)

Off unless ``[admin] listen`` is set. A bare port or ``localhost`` binds loopback; another
address needs ``admin.allow_remote = true``, because nothing here authenticates: /status
shows topics, pids and partitions to anyone who can reach the port.

Runs in: a daemon thread of the supervisor (or the Spark driver). It only reads: published
snapshots (replaced whole, never mutated) and functions that read plain values.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from runtime.config import parse_listen
from runtime.errors import ConfigError
from runtime.metrics import RuntimeMetrics
from runtime.status import StatusSnapshot

log = logging.getLogger("ringmaster.admin")


@dataclass(frozen=True)
class Health:
    ok: bool
    reasons: list[str]


class AdminServer:
    def __init__(self, listen: str, allow_remote: bool, metrics: RuntimeMetrics,
                 snapshot: Callable[[], StatusSnapshot | None], health: Callable[[], Health],
                 ready: Callable[[], bool]) -> None:
        host, port = parse_listen(listen, allow_remote)
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.handle(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("admin request", extra={"request": format % args})

        try:
            self._httpd = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(f"admin.listen: cannot listen on {host}:{port}: {exc.strerror}") from None
        self._httpd.daemon_threads = True
        self.address = f"{host}:{self._httpd.server_address[1]}"
        self._metrics = metrics
        self._snapshot = snapshot
        self._health = health
        self._ready = ready
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="ringmaster-admin",
                                        daemon=True)

    def start(self) -> AdminServer:
        self._thread.start()
        log.info("admin endpoint listening", extra={"url": f"http://{self.address}/"})
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                self._send(req, 200, generate_latest(self._metrics.registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                h = self._health()
                self._json(req, 200 if h.ok else 503, {"ok": h.ok, "reasons": h.reasons})
            elif path == "/readyz":
                ok = self._ready()
                self._json(req, 200 if ok else 503, {"ready": ok})
            elif path == "/status":
                s = self._snapshot()
                self._json(req, 200 if s is not None else 503, s.to_dict() if s is not None else {})
            else:
                self._json(req, 404, {"error": "not found", "paths": ["/metrics", "/healthz", "/readyz",
                                                                       "/status"]})
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away

    @staticmethod
    def _json(req: BaseHTTPRequestHandler, code: int, body: Any) -> None:
        AdminServer._send(req, code, json.dumps(body).encode(), "application/json")

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
