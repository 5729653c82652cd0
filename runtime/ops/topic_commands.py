"""The operator's requests to this daemon from both places they come from: its control socket
(``ringmaster reload``/``scale`` on this host) and the group's control topic (commands
``ringmaster console`` writes for every member of the group, on every host). Runs in: the
supervisor, once per tick (runtime/supervisor/control/commands.py polls it as it polls the
socket alone).

    control socket ─────────────────────────────┐
    control topic: command:<id> ─▶ OperatorPauses.take_commands ─┴─▶ poll() ─▶ commands.py
                                                  (for this member?)      reply ─▶ answers()
                                                                  ─▶ this member's status record

A command from the topic is answered in this member's status record (runtime/ops/
member_status.py): accepted at once, then how it ended, the last ``KEPT`` of them.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.ops.control import OperatorPauses
from runtime.ops.control_records import Command
from runtime.ops.control_socket import ControlServer, Request

KEPT = 20  # answers a status record carries


class RequestSource(Protocol):
    """Where the daemon's commands come from (commands.py): a ControlServer, or this."""

    def poll(self) -> list[Request]: ...
    def close(self) -> None: ...


@dataclass(eq=False)
class TopicRequest(Request):
    """A command read from the control topic: its reply goes to the member's answers."""

    on_reply: Callable[[dict[str, Any]], None] = lambda body: None

    def reply(self, body: dict[str, Any]) -> None:
        self.on_reply(body)

    @property
    def answered(self) -> bool:
        return False


class Requests:
    """The control socket's requests and the control topic's commands for this member."""

    def __init__(self, server: ControlServer | None, pauses: OperatorPauses | None, member: str,
                 wall: Callable[[], float] = time.time) -> None:
        self.server = server
        self.pauses = pauses
        self.member = member
        self.wall = wall
        self._answers: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def poll(self) -> list[Request]:
        requests = self.server.poll() if self.server is not None else []
        if self.pauses is None:
            return requests
        for command in self.pauses.take_commands():
            if not command.for_member(self.member):
                continue
            self._note(command, "running", "accepted", None)
            requests.append(TopicRequest(command.request(), None, functools.partial(self._ended, command)))
        return requests

    def _ended(self, command: Command, reply: dict[str, Any]) -> None:
        ok = bool(reply.get("ok"))
        self._note(command, "done" if ok else "failed", str(reply.get("message")), ok)

    def _note(self, command: Command, state: str, message: str, ok: bool | None) -> None:
        self._answers[command.id] = {"id": command.id, "command": command.describe(), "state": state,
                                     "ok": ok, "message": message, "at": round(self.wall(), 3)}
        self._answers.move_to_end(command.id)
        while len(self._answers) > KEPT:
            self._answers.popitem(last=False)

    def answers(self) -> list[dict[str, Any]]:
        """The last KEPT commands from the topic and how each went (read by any thread: a copy)."""
        return [dict(a) for a in list(self._answers.values())]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
