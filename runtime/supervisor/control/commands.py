"""The operator's commands to a running daemon: requests on the control socket
(runtime/ops/control_socket.py: ``ringmaster reload``, ``ringmaster scale``) and the signals
gunicorn's users know – SIGHUP reloads, SIGTTIN adds a worker, SIGTTOU removes one. Runs in:
supervisor, once per tick (signal handlers only enqueue; the loop hands signals here).

    control socket ─request─▶ queue (one operation at a time) ─▶ rollout.py ─done or failed─▶ reply
    control topic (console) ─┘                                                          │
    SIGHUP / SIGTTIN / SIGTTOU ─┘                                                      └──▶ log

Signals coalesce and carry no argument: a SIGHUP while a signalled reload still waits is that
same reload; SIGTTIN and SIGTTOU add up into one pending resize. A socket request is answered
when its operation is over (the client waits with its own timeout); ``status`` is answered at
once.

Request (one JSON object): ``{"command": "reload"}``, ``{"command": "scale", "processes": 7}``,
``{"command": "scale", "change": -1}``, ``{"command": "status"}``. Reply: ``{"ok": bool,
"message": str, "operation": {...}}`` (``status``: the last reload and resize instead).
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from runtime.ops.control_socket import Request
from runtime.ops.topic_commands import RequestSource
from runtime.supervisor.control.rollout import Operation, OpKind, Rollout
from runtime.supervisor.control.signals import Asked, Intent

log = logging.getLogger("ringmaster.commands")

_MAX_QUEUED = 16


@dataclass(eq=False)
class _Command:
    kind: OpKind
    requested_by: str
    processes: int | None = None  # scale: the size asked for ...
    change: int = 0  # ... or a change to the size when it starts
    request: Request | None = None  # None: a signal (nobody to answer)


class Commands:
    def __init__(self, server: RequestSource | None, rollout: Rollout) -> None:
        self.server = server
        self.rollout = rollout
        self.queue: deque[_Command] = deque()
        self._running: _Command | None = None

    def on_signal(self, asked: Asked) -> None:
        """A signal asked for a reload (SIGHUP), or one worker more or fewer (SIGTTIN, SIGTTOU)."""
        if asked.intent is Intent.RELOAD:
            if any(c.kind is OpKind.RELOAD and c.request is None for c in self.queue):
                log.info("reload already waiting; SIGHUP coalesced")
                return
            self._enqueue(_Command(OpKind.RELOAD, "SIGHUP"))
            return
        change = 1 if asked.intent is Intent.GROW else -1
        last = self.queue[-1] if self.queue else None
        if last is not None and last.kind is OpKind.SCALE and last.request is None:
            last.change += change
            last.requested_by = f"{last.requested_by}, {asked.by}"
            return
        self._enqueue(_Command(OpKind.SCALE, asked.by, change=change))

    def step(self) -> None:
        """Take new requests, move the operation in progress on, answer what is over, start the next."""
        if self.server is not None:
            for request in self.server.poll():
                self._accept(request)
        finished = self.rollout.step()
        if finished is not None:
            self._answer(finished)
        while self.queue and not self.rollout.busy:
            command = self._running = self.queue.popleft()
            if command.kind is OpKind.RELOAD:
                op = self.rollout.reload(command.requested_by)
            else:
                size = command.processes
                op = self.rollout.scale(self.rollout.target + command.change if size is None else size,
                                        command.requested_by)
            if not self.rollout.busy:
                self._answer(op)  # refused, or nothing to do: over at once

    @property
    def idle(self) -> bool:
        """No command is in progress or queued."""
        return not self.queue and not self.rollout.busy

    def close(self, why: str) -> None:
        """The daemon is stopping: whoever waits is told, and the socket goes."""
        waiting = [c for c in [self._running, *self.queue] if c is not None and c.request is not None]
        for c in waiting:
            assert c.request is not None
            c.request.reply({"ok": False, "message": f"not done: {why}"})
        self.queue.clear()
        self._running = None
        if self.server is not None:
            self.server.close()
            self.server = None

    # ------------------------------------------------------------------ requests
    def _accept(self, request: Request) -> None:
        body = request.body
        command = body.get("command")
        if command == "status":
            request.reply({"ok": True, "message": self._describe(), "status": self.describe()})
        elif command == "reload":
            self._enqueue(_Command(OpKind.RELOAD, "ringmaster reload", request=request))
        elif command == "scale":
            processes, change = body.get("processes"), body.get("change", 0)
            if not (_is_int(processes) or (processes is None and _is_int(change) and change)):
                request.reply({"ok": False, "message": "scale needs processes (a whole number) or change "
                                                       "(a whole number other than 0)"})
                return
            self._enqueue(_Command(OpKind.SCALE, "ringmaster scale", processes, change, request))
        else:
            request.reply({"ok": False, "message": f"unknown command {command!r}: expected reload, scale or "
                                                   "status"})

    def _enqueue(self, command: _Command) -> None:
        if len(self.queue) >= _MAX_QUEUED:
            message = f"{_MAX_QUEUED} commands are already waiting; try again when they are done"
            if command.request is not None:
                command.request.reply({"ok": False, "message": message})
            log.warning("command refused", extra={"command": command.kind.value, "why": message,
                                                  "requested_by": command.requested_by})
            return
        if self.rollout.busy or self.queue:
            log.info("command waits for the operation in progress", extra={
                "command": command.kind.value, "requested_by": command.requested_by})
        self.queue.append(command)

    def _answer(self, op: Operation) -> None:
        command, self._running = self._running, None
        if command is not None and command.request is not None:
            command.request.reply({"ok": op.ok, "message": op.message, "operation": asdict(op.status())})

    def describe(self) -> dict[str, Any]:
        r = self.rollout
        return {"plugin": r.code.plugin, "version": r.version, "workers": len(r.workforce.in_use()),
                "target": r.target, "max_processes": r.limit, "queued": len(self.queue),
                "in_progress": asdict(r.current.status()) if r.current else None,
                **{f"last_{kind.value}": asdict(op.status()) for kind, op in r.last.items()}}

    def _describe(self) -> str:
        r = self.rollout
        now = f"{len(r.workforce.in_use())} workers run plugin {r.code.plugin!r} version {r.version}"
        if r.current is not None:
            now += f"; {r.current.kind.value} in progress (requested by {r.current.requested_by})"
        last = r.last.get(OpKind.RELOAD)
        if last is not None and last is not r.current:
            now += f"; last reload {last.state.value}: {last.message}"
        return now


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
