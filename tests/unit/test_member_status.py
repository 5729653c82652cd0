"""runtime/ops/member_status.py: the status record a member publishes for the console (what it
carries, rendered once per publication), published every interval and at the stop at once,
never blocking or stopping the loop; and the control topic's commands (runtime/ops/
control_records.py, control.py, topic_commands.py): acted on only when read while following,
for the members named, answered in the record."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from test_control import pause, state
from test_status_file import snapshot

from runtime.errors import DeliveryFailed, InvalidControlRecord
from runtime.ops.control_records import Command, CommandKind, parse_command
from runtime.ops.member_status import Extra, StatusPublisher, render
from runtime.ops.status import Stopped
from runtime.ops.topic_commands import Requests


class Sender:
    def __init__(self, full: bool = False) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.full = full
        self.flushed = False

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None, headers: Any = None,
                on_delivery: Any = None, queue_wait_s: float = 30.0, partition: int | None = None) -> None:
        assert queue_wait_s == 0.0, "the loop never waits for the producer's queue"
        if self.full:
            raise DeliveryFailed("the producer's local queue stayed full for 0 s")
        self.sent.append((topic, key, value))

    def poll(self, timeout_s: float = 0.0) -> None:
        assert timeout_s == 0

    def flush(self, timeout_s: float) -> int:
        self.flushed = True
        return 0


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def extra() -> Extra:
    return Extra("exactly-once", "consumer", 7, [{"id": "c1", "state": "done"}])


def test_the_record_carries_what_the_console_shows() -> None:
    doc = json.loads(render(snapshot(stopped=None), "host-a:99", 5.0, extra(), 0.25))
    assert doc["format"] == 1 and doc["member"] == "host-a:99" and doc["host"] == "host-a"
    assert doc["pid"] == 99
    assert doc["guarantee"] == "exactly-once" and doc["group_type"] == "consumer"
    assert doc["control_read_to"] == 7 and doc["commands"] == [{"id": "c1", "state": "done"}]
    assert doc["publish_cpu_s"] == 0.25 and doc["interval_s"] == 5.0 and doc["stopped"] is None
    [p] = doc["partitions"]
    assert (p["topic"], p["partition"], p["lag"], p["paused"], p["reasons"]) == ("in", 0, 15, True,
                                                                                  ["flow", "operator"])
    [w] = doc["workers"]
    assert (w["index"], w["pid"], w["rss"], w["restarts"], w["alive"]) == (1, 1234, 50 * 2**20, 1, True)
    assert "revocations" not in doc and "librdkafka" not in doc, "only what an operator looks at"


def test_published_every_interval_and_the_final_record_at_once() -> None:
    sender, clock = Sender(), Clock()
    pub = StatusPublisher("_ringmaster.status.g", sender, 5.0, extra, "h:1", clock)
    live = snapshot(stopped=None)
    pub.offer(live)
    clock.t += 1
    pub.offer(live)  # within the interval: not sent
    assert len(sender.sent) == 1
    clock.t += 5
    pub.offer(live)
    pub.offer(replace(live, stopped=Stopped(0, "SIGTERM received")))  # the last word goes at once
    assert [k for _, k, _ in sender.sent] == [b"h:1"] * 3
    assert json.loads(sender.sent[-1][2] or b"")["stopped"]["reason"] == "SIGTERM received"
    assert pub.cpu_s > 0
    pub.close()
    assert sender.flushed


def test_a_full_producer_queue_drops_the_record_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    pub = StatusPublisher("t", Sender(full=True), 1.0, extra, "h:1", Clock())
    pub.offer(snapshot(stopped=None))
    assert pub.failed == 1 and pub.published == 0
    assert "cannot publish the status record" in caplog.text


# ---------------------------------------------------------------------- commands
def test_command_records_are_read_strictly() -> None:
    c = Command("c-1", CommandKind.SCALE, processes=4, by="op", at_ms=1, members=("h:1",))
    assert parse_command(*c.record()) == c
    assert parse_command(b"command:c-1", None) is None  # a tombstone: done with
    for key, value in [(b"command:bad id", b'{"command": "reload"}'),
                       (b"command:x", b'{"command": "restart"}'),
                       (b"command:x", b'{"command": "scale"}'),
                       (b"command:x", b'{"command": "scale", "processes": 2, "change": 1}'),
                       (b"command:x", b'{"command": "scale", "processes": 0}'),
                       (b"command:x", b"not json")]:
        with pytest.raises(InvalidControlRecord):
            parse_command(key, value)


def test_a_command_read_at_start_is_not_acted_on_one_read_while_following_is() -> None:
    old = Command("old", CommandKind.RELOAD).record()
    s, reader = state([pause(), old])
    assert s.take_commands() == [], "written for the members running then"
    assert s.read_to == 2
    new = Command("new", CommandKind.SCALE, change=1).record()
    reader.arrive(new)
    s.poll()
    assert [c.id for c in s.take_commands()] == ["new"] and s.take_commands() == []
    assert s.read_to == 3
    assert s.invalid_keys() == [], "a command is no invalid pause: resume leaves it alone"


def test_requests_hand_on_the_commands_for_this_member_and_keep_their_answers() -> None:
    s, reader = state([])
    requests = Requests(None, s, "h:1", wall=lambda: 5.0)
    reader.arrive(Command("mine", CommandKind.RELOAD, members=("h:1",)).record(),
                  Command("theirs", CommandKind.RELOAD, members=("h:2",)).record(),
                  Command("all", CommandKind.SCALE, processes=3).record())
    s.poll()
    got = requests.poll()
    assert [r.body for r in got] == [{"command": "reload"}, {"command": "scale", "processes": 3}]
    assert [a["state"] for a in requests.answers()] == ["running", "running"]
    got[0].reply({"ok": True, "message": "reloaded"})
    got[1].reply({"ok": False, "message": "above workers.max_processes"})
    assert [(a["id"], a["state"], a["message"]) for a in requests.answers()] == [
        ("mine", "done", "reloaded"), ("all", "failed", "above workers.max_processes")]




def test_a_status_topic_the_cluster_refuses_is_a_warning_not_a_stop(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from fakes import settings

    from runtime.errors import KafkaError
    from runtime.supervisor.daemon import run as daemon

    def refused(_settings: object) -> None:
        raise KafkaError("cannot create the status topic '_ringmaster.status.g': TOPIC_AUTHORIZATION_FAILED")

    monkeypatch.setattr(daemon, "ensure_status_topic", refused)
    s = settings()
    assert daemon._status_publisher(s, None, Requests(None, None, "h:1")) is None
    [line] = [r for r in caplog.records if "no status records for the console" in r.getMessage()]
    assert "TOPIC_AUTHORIZATION_FAILED" in line.error  # type: ignore[attr-defined]
    off = s.model_copy(update={"control": s.control.model_copy(update={"status_interval_s": 0.0})})
    assert daemon._status_publisher(off, None, Requests(None, None, "h:1")) is None
