"""The console's pages and form posts (Starlette). Runs in: the console process, under uvicorn;
pages read each group's GroupState, actions run in a worker thread (they block on the broker).

    GET  /                             the groups (one group: its page)
    GET  /g/<group>                    members, partitions, operations, the last actions
    GET  /g/<group>/plots              records/s, lag, worker busy share, batch time, dead letters
    GET  /g/<group>/letters            the dead-letter explorer (filters: error type, source
                                       topic and partition, since)
    GET  /g/<group>/letters/<p>/<o>    one letter in full: headers, value as text, JSON or hex
    POST /g/<group>/letters/plan       a pick of letters → the plan (redrive --dry-run)
    POST /g/<group>/letters/redrive    the plan confirmed → the redrive → its result
    POST /g/<group>/pause, /resume     a partition, a topic, or the group (the control topic)
    POST /g/<group>/command            reload, or scale to N (the control topic, every member)
    GET  /g/<group>/actions/<id>       an action and every member's acknowledgement
    GET  /login, POST /login           the token, once, for a session cookie (--allow-remote)
    GET  /healthz                      the console itself answers (no token needed, says nothing)
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from runtime.config import Settings
from runtime.console import actions, charts, plots
from runtime.console.followers import Followers
from runtime.console.preview import preview
from runtime.console.security import CSRF_COOKIE, CSRF_FIELD, SESSION_COOKIE, Guard, new_csrf
from runtime.console.state import GroupState, gone_after
from runtime.errors import RingmasterError
from runtime.ops.control import who
from runtime.ops.control_records import CommandKind, describe_scope
from runtime.redrive.report import Summary

HERE = Path(__file__).parent
PAGE_LETTERS = 200  # letters listed per page of the explorer
# Scripts and everything else from the console itself only (charts' colours are inline styles);
# nothing frames its pages; forms post only to it.
CSP = "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'"


@dataclass
class Group:
    settings: Settings
    state: GroupState
    followers: Followers | None = None


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    env.filters["human"] = charts.human
    env.filters["ago"] = _ago
    env.filters["mib"] = lambda b: "–" if b is None else f"{b / 2**20:,.0f} MiB"
    env.filters["when"] = _when
    env.filters["describe_scope"] = describe_scope
    env.filters["snippet"] = lambda b: "" if b is None else b[:80].decode("utf-8", "replace")
    return env


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _when(t: float | None) -> str:
    if t is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def build(groups: dict[str, Group], guard: Guard) -> Starlette:
    templates = Jinja2Templates(env=_env())

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        csrf = request.cookies.get(CSRF_COOKIE) or new_csrf()
        response = templates.TemplateResponse(request, name, {
            "groups": groups, "read_only": guard.read_only, "csrf": csrf, "csrf_field": CSRF_FIELD,
            "needs_token": guard.token is not None, "now": time.time(), **context}, status_code=status)
        if CSRF_COOKIE not in request.cookies:
            response.set_cookie(CSRF_COOKIE, csrf, httponly=True, samesite="strict")
        response.headers["Cache-Control"] = "no-store"
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response

    def group_of(request: Request) -> Group:
        name = request.path_params["group"]
        if name not in groups:
            raise _NotFound(f"no group {name!r} here")
        return groups[name]

    async def form_of(request: Request) -> dict[str, list[str]]:
        """The POST's fields, after the CSRF check (urlencoded: no multipart parser needed)."""
        if guard.read_only:
            raise _Refused("the console runs --read-only: no actions")
        body = (await request.body()).decode("utf-8", "replace")
        fields = urllib.parse.parse_qs(body, keep_blank_values=True)
        given = (fields.get(CSRF_FIELD) or [""])[0]
        headers = request.headers
        if not guard.csrf_ok(given, request.cookies, headers.get("origin"), headers.get("host")):
            raise _Refused("the form's CSRF token does not match this browser's (reload the page and try "
                           "again)")
        return fields

    async def index(request: Request) -> Response:
        if len(groups) == 1:
            return RedirectResponse(f"/g/{urllib.parse.quote(next(iter(groups)))}", 303)
        return page(request, "index.html")

    async def overview(request: Request) -> Response:
        g = group_of(request)
        return page(request, "group.html", group=g, tab="overview", members=g.state.member_rows(),
                    partitions=g.state.partition_rows(), pauses=g.state.pauses, actions=list(g.state.actions),
                    acks={a.id: g.state.acks(a) for a in g.state.actions}, gone_after=gone_after)

    async def plots_page(request: Request) -> Response:
        g = group_of(request)
        history = g.state.history()
        per, group_rate = plots.rates(history)
        now = time.time()
        figures = [
            charts.line_chart("records/s, the group", group_rate, "records/s"),
            charts.line_chart("records/s per partition", per, "records/s"),
            charts.line_chart("lag per partition", plots.lags(history), "records"),
            charts.line_chart("worker busy share", {k: [(t, 100 * v) for t, v in s]
                                                    for k, s in plots.busy_share(history).items()}, "% busy"),
            charts.line_chart("batch time (mean, in its worker)", plots.batch_ms(history), "ms"),
            charts.bar_chart("dead letters per minute, by error type",
                             plots.dead_letters_per_minute(g.state.letters_newest_first(), now),
                             "letters/min", 60.0),
        ]
        return page(request, "plots.html", group=g, tab="plots", figures=figures)

    async def letters_page(request: Request) -> Response:
        g = group_of(request)
        q = request.query_params
        letters = g.state.letters_newest_first()
        types = sorted({x.error_type for x in letters})
        sources = sorted({x.source.topic for x in letters if x.source is not None})
        wanted_type, wanted_topic = q.get("type", ""), q.get("topic", "")
        wanted_part, since = q.get("partition", ""), q.get("since", "")
        since_s = {"": None, "5m": 300, "1h": 3600, "1d": 86400}.get(since)
        now_ms = time.time() * 1000
        shown = [x for x in letters
                 if (not wanted_type or x.error_type == wanted_type)
                 and (not wanted_topic or (x.source is not None and x.source.topic == wanted_topic))
                 and (not wanted_part or (x.source is not None and str(x.source.partition) == wanted_part))
                 and (since_s is None or (x.when_ms or 0) >= now_ms - since_s * 1000)]
        return page(request, "letters.html", group=g, tab="letters", letters=shown[:PAGE_LETTERS],
                    matching=len(shown), total=len(letters), types=types, sources=sources,
                    q={"type": wanted_type, "topic": wanted_topic, "partition": wanted_part, "since": since},
                    redriven=dict(g.state.redriven), seen=g.state.letters_seen)

    async def letter_page(request: Request) -> Response:
        g = group_of(request)
        try:
            p, o = int(request.path_params["partition"]), int(request.path_params["offset"])
        except ValueError:
            raise _NotFound("a letter is /letters/<partition>/<offset>") from None
        letter = g.state.letter(p, o)
        if letter is None:
            raise _NotFound(f"no letter at partition {p} offset {o} among the {len(g.state.letters)} "
                            "newest this console holds")
        view = request.query_params.get("view", "")
        return page(request, "letter.html", group=g, tab="letters", letter=letter,
                    value=preview(letter.value, view), key=preview(letter.key, "text"),
                    redriven=g.state.redriven.get((p, o)))

    def picks_of(fields: dict[str, list[str]]) -> list[tuple[int, int]]:
        picks = []
        for v in fields.get("pick", []):
            p, _, o = v.partition(":")
            if not (p.isdigit() and o.isdigit()):
                raise _Refused(f"{v!r} is not a letter (partition:offset)")
            picks.append((int(p), int(o)))
        return picks

    async def plan(request: Request) -> Response:
        g = group_of(request)
        fields = await form_of(request)
        picks = picks_of(fields)
        summary: Summary = await run_in_threadpool(actions.redrive_plan, g.settings, picks)
        return page(request, "plan.html", group=g, tab="letters", summary=summary, picks=picks,
                    already=[k for k in picks if k in g.state.redriven])

    async def redrive(request: Request) -> Response:
        g = group_of(request)
        picks = picks_of(await form_of(request))
        action, summary = await run_in_threadpool(actions.redrive, g.settings, g.state, picks, _by(request))
        return page(request, "redriven.html", group=g, tab="letters", summary=summary, action=action)

    def scope_of(fields: dict[str, list[str]]) -> tuple[str | None, int | None]:
        topic = (fields.get("topic") or [""])[0] or None
        part = (fields.get("partition") or [""])[0]
        if part and not part.lstrip("-").isdigit():
            raise _Refused(f"partition {part!r} is not a number")
        return topic, int(part) if part else None

    async def pause(request: Request) -> Response:
        g = group_of(request)
        fields = await form_of(request)
        topic, part = scope_of(fields)
        reason = (fields.get("reason") or [""])[0] or "paused from ringmaster console"
        action = await run_in_threadpool(actions.pause, g.settings, g.state, topic, part, reason,
                                         _by(request))
        return _see(g, action.id)

    async def resume(request: Request) -> Response:
        g = group_of(request)
        topic, part = scope_of(await form_of(request))
        action = await run_in_threadpool(actions.resume, g.settings, g.state, topic, part, _by(request))
        return _see(g, action.id)

    async def command(request: Request) -> Response:
        g = group_of(request)
        fields = await form_of(request)
        what = (fields.get("command") or [""])[0]
        if what == "reload":
            action = await run_in_threadpool(actions.command, g.settings, g.state, CommandKind.RELOAD,
                                             _by(request))
        elif what == "scale":
            n = (fields.get("processes") or [""])[0].strip()
            if not n.lstrip("+-").isdigit():
                raise _Refused(f"scale: {n!r} is not N, +N or -N")
            processes, change = (None, int(n)) if n[0] in "+-" else (int(n), 0)
            action = await run_in_threadpool(actions.command, g.settings, g.state, CommandKind.SCALE,
                                             _by(request), processes, change)
        else:
            raise _Refused(f"unknown command {what!r}: reload or scale")
        return _see(g, action.id)

    async def action_page(request: Request) -> Response:
        g = group_of(request)
        action = next((a for a in g.state.actions if a.id == request.path_params["id"]), None)
        if action is None:
            raise _NotFound("no such action (the console keeps its last 50)")
        return page(request, "action.html", group=g, tab="overview", action=action, acks=g.state.acks(action))

    async def login(request: Request) -> Response:
        if request.method == "POST":
            body = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
            if guard.token_matches((body.get("token") or [""])[0]):
                response = RedirectResponse("/", 303)
                response.set_cookie(SESSION_COOKIE, guard.session_value(), httponly=True, samesite="strict")
                return response
            return page(request, "login.html", 401, wrong=True)
        return page(request, "login.html", wrong=False)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, _NotFound):
            return page(request, "error.html", 404, message=str(exc))
        if isinstance(exc, _Refused):
            return page(request, "error.html", 403, message=str(exc))
        if isinstance(exc, RingmasterError):  # an option out of bounds, the cluster refusing: as the CLI says
            return page(request, "error.html", 400, message=str(exc))
        raise exc

    async def guard_every_page(request: Request,
                               call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.url.path in ("/login", "/healthz", "/static/console.css") or guard.allowed(
                request.headers, request.cookies):
            return await call_next(request)
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return RedirectResponse("/login", 303)
        return PlainTextResponse("a token is required (Authorization: Bearer, basic auth, or /login)", 401,
                                 headers={"WWW-Authenticate": 'Basic realm="ringmaster console"'})

    routes = [
        Route("/", index), Route("/healthz", healthz),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/g/{group}", overview), Route("/g/{group}/plots", plots_page),
        Route("/g/{group}/letters", letters_page),
        Route("/g/{group}/letters/plan", plan, methods=["POST"]),
        Route("/g/{group}/letters/redrive", redrive, methods=["POST"]),
        Route("/g/{group}/letters/{partition}/{offset}", letter_page),
        Route("/g/{group}/pause", pause, methods=["POST"]),
        Route("/g/{group}/resume", resume, methods=["POST"]),
        Route("/g/{group}/command", command, methods=["POST"]),
        Route("/g/{group}/actions/{id}", action_page),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard_every_page)],
                     exception_handlers={_NotFound: on_error, _Refused: on_error, RingmasterError: on_error})


class _NotFound(Exception):
    pass


class _Refused(Exception):
    pass


def _by(request: Request) -> str:
    """Who acted, for the control record's ``by``: this host's user, through the console, and from where."""
    client = request.client.host if request.client else "?"
    return f"{who()} (console, from {client})"


def _see(g: Group, action_id: str) -> Response:
    return RedirectResponse(f"/g/{urllib.parse.quote(g.settings.kafka.group_id)}/actions/{action_id}", 303)

