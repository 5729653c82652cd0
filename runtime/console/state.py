"""What the console knows of one group, built from what it reads: each member's status records
(the last one, and an hour of history for the plots), the dead letters, the group's pauses,
and the actions this console wrote with each member's acknowledgement. Runs in: the follower
threads (writing, under ``lock``) and the web server's (reading, under ``lock``).

A member is **gone** when nothing came from it for ``gone_after(interval)``: three of its own
intervals, and never less than 15 s (a member that stops writes a last record that says so:
that one is *stopped*, not gone). Liveness is judged on this console's monotonic clock, at
the time each record arrived; only records read back at start (history) are placed by their
own wall-clock time.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.ops.control_records import Pause
from runtime.redrive.letters import Letter

HISTORY_S = 3600.0  # what the plots show
MAX_SAMPLES = 2000  # per member (an hour at 2 s); older ones are dropped first
MAX_LETTERS = 5000  # the newest dead letters kept for the explorer, over every partition
MAX_ACTIONS = 50


def gone_after(interval_s: float) -> float:
    return max(3 * interval_s, 15.0)


@dataclass
class Member:
    id: str
    latest: dict[str, Any]
    heard_mono: float  # when its last record arrived (console's monotonic clock)
    history: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def state(self, now_mono: float) -> str:
        """running, starting, stopped or gone."""
        if self.latest.get("stopped"):
            return "stopped"
        if now_mono - self.heard_mono > gone_after(float(self.latest.get("interval_s") or 5.0)):
            return "gone"
        return "running" if self.latest.get("ready") else "starting"

    def silent_s(self, now_mono: float) -> float:
        return max(0.0, now_mono - self.heard_mono)


@dataclass
class Action:
    """One action this console wrote to the control topic (or a redrive it ran)."""

    id: str
    kind: str  # pause, resume, reload, scale, redrive
    what: str  # "hello[3]", "topic hello", "reload", "scale to 4", ...
    by: str
    at: float  # wall clock
    offsets: list[int]  # where the control topic holds its records (empty: not a control record)
    members: list[str]  # the members running when it was written: each should acknowledge it
    scope: str | None = None  # pause/resume: the scope key
    result: str | None = None  # redrive: its summary line


@dataclass(frozen=True)
class Ack:
    member: str
    seen: bool  # read the control topic past the action's records
    state: str  # what it says of it: "seen", "waiting", "running", "done", "failed", "gone"
    message: str = ""


class GroupState:
    def __init__(self, group: str, mono: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.group = group
        self.mono = mono
        self.wall = wall
        self.lock = threading.Lock()
        self.members: dict[str, Member] = {}
        self.letters: deque[Letter] = deque(maxlen=MAX_LETTERS)
        self.letters_seen = 0  # read since the console started (the deque keeps the newest)
        self.pauses: list[Pause] = []
        self.actions: deque[Action] = deque(maxlen=MAX_ACTIONS)
        self.problems: dict[str, str] = {}  # what cannot be read now, by topic: shown on every page
        self.redriven: dict[tuple[int, int], float] = {}  # letters this console redrove, and when

    # ------------------------------------------------------------------ writing (followers)
    def take_status(self, key: bytes | None, value: bytes | None, live: bool) -> None:
        """One status record. ``live``: it arrived now (else it is history, read back at start,
        placed by its own time)."""
        if key is None or value is None:
            return
        try:
            doc = json.loads(value)
        except ValueError:
            return
        if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("taken_at"),
                                                                                  int | float):
            return
        member = key.decode("utf-8", "replace")
        now = self.mono()
        heard = now if live else now - max(0.0, self.wall() - float(doc["taken_at"]))
        with self.lock:
            m = self.members.get(member)
            if m is None:
                m = self.members[member] = Member(member, doc, heard)
            elif float(doc["taken_at"]) < float(m.latest.get("taken_at", 0)):
                return  # older than what we have (a record of an earlier incarnation's pid: not ours)
            m.latest, m.heard_mono = doc, max(heard, m.heard_mono)
            m.history.append(doc)
            cutoff = float(doc["taken_at"]) - HISTORY_S
            while m.history and float(m.history[0]["taken_at"]) < cutoff:
                m.history.popleft()

    def take_letter(self, letter: Letter) -> None:
        with self.lock:
            self.letters.append(letter)
            self.letters_seen += 1

    def set_pauses(self, pauses: list[Pause]) -> None:
        with self.lock:
            self.pauses = pauses

    def problem(self, topic: str, text: str | None) -> None:
        with self.lock:
            if text is None:
                self.problems.pop(topic, None)
            else:
                self.problems[topic] = text

    def add_action(self, action: Action) -> None:
        with self.lock:
            self.actions.appendleft(action)

    # ------------------------------------------------------------------ reading (pages)
    def live_members(self) -> list[str]:
        now = self.mono()
        with self.lock:
            return [m.id for m in self.members.values() if m.state(now) in ("running", "starting")]

    def member_rows(self) -> list[tuple[Member, str, float]]:
        now = self.mono()
        with self.lock:
            rows = [(m, m.state(now), m.silent_s(now)) for m in self.members.values()]
        order = {"running": 0, "starting": 1, "stopped": 2, "gone": 3}
        return sorted(rows, key=lambda r: (order[r[1]], r[0].id))

    def partition_rows(self) -> list[dict[str, Any]]:
        """Every partition a running member holds, with who holds it, sorted by topic and partition."""
        rows: dict[tuple[str, int], dict[str, Any]] = {}
        for m, state, _ in self.member_rows():
            if state not in ("running", "starting"):
                continue
            for p in m.latest.get("partitions", []):
                rows[(p["topic"], p["partition"])] = {**p, "member": m.id, "host": m.latest.get("host")}
        return [rows[k] for k in sorted(rows)]

    def acks(self, action: Action) -> list[Ack]:
        """Each member's word on an action: for a control record, whether it read past it (and,
        for a command, how it went)."""
        now = self.mono()
        out = []
        with self.lock:
            for member in action.members:
                m = self.members.get(member)
                if m is None:
                    out.append(Ack(member, False, "gone", "no status record"))
                    continue
                read_to = m.latest.get("control_read_to")
                seen = bool(action.offsets) and isinstance(read_to, int) and read_to > max(action.offsets)
                answer = next((c for c in m.latest.get("commands", []) if c.get("id") == action.id), None)
                if answer is not None:
                    out.append(Ack(member, True, str(answer.get("state")), str(answer.get("message") or "")))
                elif m.state(now) in ("gone", "stopped"):
                    out.append(Ack(member, seen, m.state(now), ""))
                else:
                    out.append(Ack(member, seen, "seen" if seen else "waiting", ""))
        return out

    def history(self) -> dict[str, list[dict[str, Any]]]:
        with self.lock:
            return {m.id: list(m.history) for m in self.members.values()}

    def letters_newest_first(self) -> list[Letter]:
        with self.lock:
            return sorted(self.letters, key=lambda letter: (letter.when_ms or 0, letter.offset), reverse=True)

    def letter(self, partition: int, offset: int) -> Letter | None:
        with self.lock:
            return next((x for x in self.letters if x.partition == partition and x.offset == offset), None)
