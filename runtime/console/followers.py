"""The threads that read a group's topics into its GroupState: the status topic (history, then
live), the dead-letter topic (the newest letters, then live) and the control topic (the pauses
in force). Assign-only readers: they join no group and commit nothing. Runs in: the console,
one thread per topic; each says what it cannot read in the state (shown on every page) and
tries again, never ending the console.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from runtime.config import Settings
from runtime.console.state import MAX_LETTERS, GroupState
from runtime.errors import RingmasterError
from runtime.kafka.topic_reader import tail
from runtime.ops.control import OperatorPauses, reader_properties
from runtime.ops.member_status import status_topic
from runtime.redrive.letters import read_letter

log = logging.getLogger("ringmaster.console")

_RETRY_S = 2.0
_CONTROL_POLL_S = 0.5
_POLL_S = 0.5  # a reader's wait for records, and for a topic not there yet
# Status records read back at start, at most: an hour of 14 members at 1 s, of 70 at 5 s (the
# state keeps an hour of each member's, MAX_SAMPLES at most).
_HISTORY_RECORDS = 50_000


class Followers:
    def __init__(self, settings: Settings, state: GroupState) -> None:
        self.settings = settings
        self.state = state
        self.props: dict[str, Any] = {**reader_properties(settings),
                                      "group.id": f"{settings.kafka.group_id}.ringmaster-console"}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> Followers:
        jobs: list[tuple[str, Callable[[], None]]] = [("status", self._status)]
        if self.settings.dead_letter.topic is not None:
            jobs.append(("letters", self._letters))
        if self.settings.control.enabled:
            jobs.append(("control", self._control))
        for name, job in jobs:
            t = threading.Thread(target=self._forever, args=(job,), daemon=True,
                                 name=f"console-{name}-{self.settings.kafka.group_id}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)

    def _forever(self, job: Callable[[], None]) -> None:
        while not self._stop.is_set():
            try:
                job()
            except RingmasterError as exc:
                self._problem(job, str(exc))
            except Exception as exc:  # a bug must not end the console silently
                log.exception("console reader failed; trying again")
                self._problem(job, f"{type(exc).__name__}: {exc}")
            self._stop.wait(_RETRY_S)

    def _problem(self, job: Callable[[], None], text: str) -> None:
        topic = {self._status: status_topic(self.settings), self._letters: self.settings.dead_letter.topic,
                 self._control: "control topic"}.get(job, "?")
        self.state.problem(str(topic), text)

    def _status(self) -> None:
        topic = status_topic(self.settings)
        # History first (placed by its own time), then what arrives (placed at its arrival).
        for item in tail(topic, self.props, self._stop.is_set, _POLL_S, last=_HISTORY_RECORDS, follow=False):
            self.state.take_status(item.key, item.value, live=False)
        self.state.problem(topic, None)
        for item in tail(topic, self.props, self._stop.is_set, _POLL_S, last=0, follow=True):
            self.state.take_status(item.key, item.value, live=True)

    def _letters(self) -> None:
        topic = self.settings.dead_letter.topic
        assert topic is not None
        for item in tail(topic, self.props, self._stop.is_set, _POLL_S, last=MAX_LETTERS, follow=True):
            self.state.take_letter(read_letter(item.partition, item.offset, item.key, item.value,
                                               item.headers, item.timestamp))
            self.state.problem(topic, None)

    def _control(self) -> None:
        pauses = OperatorPauses.for_settings(self.settings)
        try:
            pauses.load(report=False)
            self.state.problem("control topic", None)
            self.state.set_pauses(pauses.active())
            while not self._stop.wait(_CONTROL_POLL_S):
                if pauses.poll():
                    self.state.set_pauses(pauses.active())
        finally:
            pauses.close()
