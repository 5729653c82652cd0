"""The console's pages and posts (runtime/console/app.py) through Starlette's test client, with
the group's state filled by hand and the actions faked (the browser test drives the real ones):
who may see and act (a token with --allow-remote, CSRF on every POST, --read-only), nothing from
a record rendered as HTML, and the state's judgement of members (gone after a bound, stopped)."""

from __future__ import annotations

import base64
import json
import re
import time
from typing import Any

import pytest
from fakes import settings

pytest.importorskip("starlette")
from starlette.testclient import TestClient

from runtime.console import actions, app
from runtime.console.security import CSRF_COOKIE, Guard
from runtime.console.server import serve
from runtime.console.state import Action, GroupState, gone_after
from runtime.errors import ConfigError
from runtime.redrive.letters import read_letter

TOKEN = "s3cret-token-of-the-console"
EVIL = "<script>alert(1)</script>"


class Mono:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def status(pid: int, **kw: Any) -> bytes:
    doc = {"format": 1, "member": f"h:{pid}", "host": "h", "pid": pid, "taken_at": time.time(),
           "started_at": 1.0, "interval_s": 1.0, "ready": True, "stopped": None, "guarantee": "at-least-once",
           "group_type": "consumer", "plugin": "p", "plugin_version": "v1", "generation": 1, "rate": 3.0,
           "lag": 2, "restarts": 0, "paused": 0, "supervisor_rss": 2**20, "batches": 1, "records": 5,
           "partitions": [{"topic": EVIL, "partition": pid, "lag": 2, "rate": 3.0, "records": 5,
                           "dead_letters": 0, "committed": 3, "high": 5, "worker": 0, "paused": False,
                           "reasons": [], "oldest_s": None}],
           "workers": [{"index": 0, "pid": 7, "alive": True, "busy_s": 0.5, "rss": 2**20, "restarts": 0}],
           "control_read_to": 10, "commands": [], **kw}
    return json.dumps(doc).encode()


@pytest.fixture
def group() -> app.Group:
    s = settings(dead_letter={"topic": "dl"})
    s = s.model_copy(update={"kafka": s.kafka.model_copy(update={"topics": ["in"]})})
    state = GroupState("g", mono=Mono())
    state.take_status(b"h:1", status(1), live=True)
    headers = [("ringmaster.error.type", EVIL.encode()), ("ringmaster.source.topic", b"in"),
               ("ringmaster.source.partition", b"0"), ("ringmaster.source.offset", b"4"),
               ("ringmaster.error.traceback", b"Traceback: <b>bold</b>")]
    state.take_letter(read_letter(0, 9, b"k", EVIL.encode(), headers, (1, 1_700_000_000_000)))
    return app.Group(s, state)


def client(group: app.Group, token: str | None = None, read_only: bool = False) -> TestClient:
    return TestClient(app.build({"g": group}, Guard(token, read_only)), base_url="http://127.0.0.1:8080")


def csrf_of(c: TestClient) -> str:
    c.get("/g/g")
    return c.cookies[CSRF_COOKIE]


def test_nothing_from_a_record_is_rendered_as_html(group: app.Group) -> None:
    c = client(group)
    for path in ("/g/g", "/g/g/letters", "/g/g/letters/0/9", "/g/g/letters/0/9?view=hex", "/g/g/plots"):
        page = c.get(path).text
        assert EVIL not in page and "<b>bold</b>" not in page, path
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in c.get("/g/g/letters/0/9").text
    assert "default-src 'self'" in c.get("/g/g").headers["content-security-policy"]


def test_every_asset_is_served_by_the_console_itself(group: app.Group) -> None:
    c = client(group)
    for path in ("/g/g", "/g/g/letters", "/g/g/plots"):
        page = c.get(path).text
        for url in re.findall(r'(?:src|href)="([^"]+)"', page):
            assert url.startswith(("/", "?")), f"{path} refers to {url}: nothing may come from elsewhere"
    assert c.get("/static/console.js").status_code == 200 and c.get("/static/console.css").status_code == 200


def test_a_post_without_the_pages_csrf_token_is_refused(group: app.Group,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[Any] = []

    def pause(*args: Any) -> Action:
        done.append(args)
        action = Action("a1", "pause", "in[0]", "me", 1.0, [11], ["h:1"])
        group.state.add_action(action)
        return action

    monkeypatch.setattr(actions, "pause", pause)
    c = client(group)
    token = csrf_of(c)
    assert c.post("/g/g/pause", data={"topic": "in", "partition": "0"}).status_code == 403
    assert c.post("/g/g/pause", data={"csrf": "another", "topic": "in", "partition": "0"}).status_code == 403
    assert c.post("/g/g/pause", data={"csrf": token, "topic": "in", "partition": "0"},
                  headers={"origin": "http://evil.example"}).status_code == 403
    assert done == []
    r = c.post("/g/g/pause", data={"csrf": token, "topic": "in", "partition": "0"}, follow_redirects=False,
               headers={"origin": "http://127.0.0.1:8080"})
    assert r.status_code == 303 and r.headers["location"] == "/g/g/actions/a1"
    assert len(done) == 1 and done[0][2:5] == ("in", 0, "paused from ringmaster console")
    assert 'class="pill waiting">waiting' in c.get("/g/g/actions/a1").text, "h:1 has read up to offset 10"
    group.state.take_status(b"h:1", status(1, control_read_to=12), live=True)
    assert 'class="pill seen">seen' in c.get("/g/g/actions/a1").text, "h:1 has read past offset 11"


def test_with_a_token_every_page_and_action_asks_for_it(group: app.Group,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[Any] = []
    monkeypatch.setattr(actions, "pause", lambda *a: done.append(a))
    c = client(group, TOKEN)
    r = c.get("/g/g", headers={"accept": "text/html"}, follow_redirects=False)
    assert r.headers["location"] == "/login"
    assert c.get("/g/g/letters/0/9").status_code == 401
    assert c.get("/static/console.js").status_code == 401
    c.cookies.set(CSRF_COOKIE, "x")
    assert c.post("/g/g/pause", data={"csrf": "x", "topic": "in"}).status_code == 401
    assert done == [], "refused before anything was written"
    assert c.get("/g/g", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert c.get("/g/g", headers={"authorization": f"Basic {basic}"}).status_code == 200
    assert c.get("/g/g", headers={"authorization": "Bearer not-it"}).status_code == 401
    assert c.post("/login", data={"token": "not-it"}).status_code == 401
    assert c.post("/login", data={"token": TOKEN}, follow_redirects=False).status_code == 303
    assert c.get("/g/g").status_code == 200, "the session cookie the login set"


def test_read_only_shows_no_action_and_refuses_every_post(group: app.Group) -> None:
    c = client(group, read_only=True)
    page = c.get("/g/g").text
    assert "button" not in page.split('id="partitions"')[1].split("</table>")[0]
    token = csrf_of(c)
    for path in ("/g/g/pause", "/g/g/resume", "/g/g/command", "/g/g/letters/plan", "/g/g/letters/redrive"):
        assert c.post(path, data={"csrf": token}).status_code == 403, path


def test_a_bad_action_gets_a_clear_error(group: app.Group) -> None:
    c = client(group)
    token = csrf_of(c)
    r = c.post("/g/g/command", data={"csrf": token, "command": "scale", "processes": "many"})
    assert r.status_code == 403 and "&#39;many&#39; is not N, +N or -N" in r.text
    r = c.post("/g/g/pause", data={"csrf": token, "topic": "other"})
    assert r.status_code == 400 and "is not one of the group" in r.text


def test_remote_listening_needs_a_token() -> None:
    s = settings()
    with pytest.raises(ConfigError, match="--allow-remote needs a token"):
        serve([s], "0.0.0.0:8080", True, None, False)
    with pytest.raises(ConfigError, match="not loopback; add --allow-remote"):
        serve([s], "0.0.0.0:8080", False, TOKEN, False)


def test_a_member_silent_past_its_bound_is_gone_and_one_that_said_it_stopped_is_stopped() -> None:
    mono = Mono()
    state = GroupState("g", mono=mono)
    state.take_status(b"h:1", status(1), live=True)
    state.take_status(b"h:2", status(2), live=True)
    assert [r[1] for r in state.member_rows()] == ["running", "running"]
    mono.t += gone_after(1.0) + 0.1
    stopped = {"code": 0, "reason": "SIGTERM received", "at": 1.0}
    state.take_status(b"h:2", status(2, stopped=stopped), live=True)
    assert {m.id: st for m, st, _ in state.member_rows()} == {"h:1": "gone", "h:2": "stopped"}
    assert state.live_members() == [] and state.partition_rows() == []


def test_history_read_back_at_start_is_placed_by_its_own_time() -> None:
    mono = Mono()
    state = GroupState("g", mono=mono)
    state.take_status(b"h:1", status(1, taken_at=time.time() - 3600), live=False)
    assert state.member_rows()[0][1] == "gone", "an hour-old last word is not a live member"
