"""Looking at a daemon from another terminal: ``ringmaster status`` (one snapshot) and
``ringmaster top`` (live). Reads the admin endpoint's /status when ``[admin] listen`` is set,
else the status file: the same JSON document either way.

A status file outlives its daemon, so a reading says whether the daemon that wrote it is
still running: its last snapshot says it stopped (code, reason, when), or its pid is gone
or belongs to another process now (the snapshot carries the process's start time).

Numbers are never cut: a narrow terminal folds only the text columns (why a partition is
paused, a worker's last exit), and a terminal too narrow even for that gets lines longer
than itself (it wraps them); anything else (a pipe, a file, cron, CI logs, ``kubectl exec``
without ``-t``) gets every row on one line.

Runs in: the CLI process, never the daemon.
"""

from __future__ import annotations

import io
import json
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from runtime.config import Settings, parse_listen
from runtime.errors import RingmasterError

Snapshot = dict[str, Any]

NOT_RUNNING_EXIT = 3  # `ringmaster status`: the daemon is not running (LSB's "program is not running")


class NoDaemon(RingmasterError):
    """Nothing to read: no admin endpoint answers and no status file is there."""


class NothingToRead(NoDaemon):
    """The config names neither an admin endpoint nor a status file: there never will be
    anything to read with it."""


@dataclass(frozen=True)
class Reading:
    """A snapshot, where it came from, and whether the daemon that wrote it still runs."""

    snapshot: Snapshot
    source: str
    running: bool
    state: str  # "ready", "starting", "stopping (...)", "stopped at ... (...)", "not running: ..."


def status_url(settings: Settings) -> str | None:
    if not settings.admin.listen:
        return None
    host, port = parse_listen(settings.admin.listen, allow_remote=True)  # the daemon's own reading
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # listening on every address: loopback is one of them
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/status"


def read_snapshot(settings: Settings, timeout_s: float = 3.0) -> Reading:
    """The daemon's latest snapshot; NoDaemon (saying why and what to do) when there is none."""
    url = status_url(settings)
    path = settings.supervisor.status_file
    if url is None and not path:
        raise NothingToRead("nothing to read: this config sets neither [admin] listen nor "
                            "supervisor.status_file; give the config of the running daemon (it needs one "
                            "of the two)")
    problems = []
    if url is not None:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                snap = json.loads(resp.read())
            running, state = daemon_state(snap, answered=True)
            return Reading(snap, url, running, state)
        except urllib.error.HTTPError as exc:
            problems.append(f"{url} answered {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(f"{url}: {getattr(exc, 'reason', exc)}")
    if path:
        try:
            snap = json.loads(Path(path).read_text())
            age = time.time() - Path(path).stat().st_mtime
            running, state = daemon_state(snap, answered=False)
            return Reading(snap, f"{path} (written {age:.0f} s ago)", running, state)
        except FileNotFoundError:
            problems.append(f"{path} does not exist")
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
    raise NoDaemon("no running daemon found: " + "; ".join(problems) + ". Start it (ringmaster run -c "
                   "CONFIG), or give the config of the running daemon ([admin] listen and "
                   "supervisor.status_file must be the ones it uses)")


def daemon_state(snap: Snapshot, answered: bool) -> tuple[bool, str]:
    """(running, state in words). ``answered``: the daemon itself served the snapshot."""
    stopped = snap.get("stopped")
    alive = answered or _same_process(snap.get("pid"), snap.get("started_at"))
    if stopped:
        why = f"exit {stopped.get('code')}: {stopped.get('reason')}"
        if alive:
            return False, f"stopping ({why})"
        return False, f"stopped at {_when_s(stopped.get('at'))} ({why})"
    if not alive:
        return False, (f"not running: pid {snap.get('pid')} is gone without a clean stop (killed, or "
                       "crashed: see its log)")
    return True, "ready" if snap.get("ready") else "starting"


def _same_process(pid: Any, started_at: Any) -> bool:
    """Is the process that wrote the snapshot still running? Its pid alone could have been
    reused by another process since: the start time must match too."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if not started_at:
            return proc.is_running()
        return abs(proc.create_time() - float(started_at)) < 1.0
    except psutil.AccessDenied:
        return True  # it exists; we may not look at it
    except psutil.Error:
        return False


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def _rate(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str | Text]],
           text_columns: Sequence[str], name_columns: Sequence[str] = ()) -> Table:
    """A table whose number columns are as wide as their widest cell, so rich never shrinks
    them (it would cut "13,567" to "13,5…"); a header may wrap between its words ("in
    flight"). ``text_columns`` (prose) wrap between words; ``name_columns`` (a topic name with
    its partition: no words) fold, down to ``_NAME_MIN`` characters."""
    t = Table(title=title, title_justify="left", show_edge=False, box=None, pad_edge=False,
              padding=(0, 1), collapse_padding=True)
    for i, col in enumerate(columns):
        longest_word = max(len(w) for w in col.split())
        if col in text_columns:
            t.add_column(col, justify="left", overflow="fold", min_width=max(longest_word, _WORD_MIN))
        elif col in name_columns:
            widest = max([len(col), *(len(str(r[i])) for r in rows)])
            t.add_column(col, justify="left", overflow="fold", min_width=min(widest, _NAME_MIN))
        else:
            widest = max([longest_word, *(len(str(r[i])) for r in rows)])
            t.add_column(col, justify="right" if i else "left", min_width=widest)
    names = [i for i, col in enumerate(columns) if col in name_columns]
    for r in rows:
        t.add_row(*(_Name(str(c)) if i in names else c for i, c in enumerate(r)))
    return t


class _Name(Text):
    """A name without words (``orders-eu-west[11]``): as long as a word, rich would measure
    its column's minimum as the whole name and widen the view to it; it folds instead, so it
    asks for at most ``_NAME_MIN`` columns."""

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        m = super().__rich_measure__(console, options)
        return Measurement(min(m.minimum, _NAME_MIN), m.maximum)


# A prose column is never narrower than this (a narrower one would fold most words); a name
# column folds down to this.
_WORD_MIN = 10
_NAME_MIN = 10


def _grid(rows: Sequence[Sequence[str | Text]]) -> Table:
    """Label/value pairs, every cell as wide as its column's widest (never cut): short values
    only; a sentence goes on a line of its own (``_line``)."""
    grid = Table.grid(padding=(0, 2))
    for i in range(len(rows[0])):
        grid.add_column(min_width=max(len(str(r[i])) for r in rows), no_wrap=True)
    for r in rows:
        grid.add_row(*r)
    return grid


def _line(label: str, text: str, style: str = "") -> Text:
    """A labelled sentence under a table or the summary (the last reload, a worker's last
    exit): in a cell it would make its column as wide as itself; on its own line it wraps
    between words at the terminal's width, indented under its label."""
    return Text.assemble((label, "bold"), " ", (text, style))


def render(reading: Reading) -> Group:
    """The whole view: summary, partitions, workers, operator pauses."""
    snap = reading.snapshot
    recent = snap.get("recent_rate")
    rate = f"{recent:,.0f}/s" if recent is not None else f"{snap.get('rate', 0):,.0f}/s (average)"
    head_rows: list[list[str | Text]] = [
        ["group", str(snap.get("group")), "pid", str(snap.get("pid"))],
        ["records", _n(snap.get("records")), "rate", rate],
        ["lag", _n(snap.get("lag")), "outputs", _n(snap.get("outputs"))],
        ["dead letters", _n(snap.get("dead_letters")), "deferred", _n(snap.get("deferred"))],
        ["ordering", str(snap.get("ordering")), "restarts", _n(snap.get("restarts"))],
        ["rebalances", _n(snap.get("rebalances")), "workers",
         f"{len(snap.get('workers', []))} (aim {snap.get('workers_target', '-')}, "
         f"max {snap.get('workers_max', '-')})"]]
    share = snap.get("share")
    if share:  # kafka.group_type = "share"
        head_rows.append(["acquired", _n(share.get("acquired")), "accepted", _n(share.get("accepted"))])
        head_rows.append(["released", _n(share.get("released")), "lock expiries",
                          f"{_n(share.get('lock_expiries'))} (rejected {_n(share.get('rejected'))})"])
        head_rows.append(["held", _n(share.get("held")), "kept to retry", _n(share.get("kept"))])
    sentences = [_line("state:", reading.state, "" if reading.running else "bold red"),
                 _line("plugin:", f"{snap.get('plugin', '')} {snap.get('plugin_version') or ''}".strip())]
    head = _grid(head_rows)
    operations: list[Text] = sentences
    for kind in ("reload", "scale"):
        op = snap.get(kind)
        if op:
            style = "red" if op["state"] == "failed" else ""
            text = f"{op['state']} ({op['requested_by']}, {_when_ms(op['started_ms'])}): {op['message']}"
            operations.append(_line(f"last {kind}:", text, style))
    rows: list[list[str | Text]] = []
    for p in snap.get("partitions", []):
        why = ", ".join(f"{r}: {p['holds'][r]}" if r in p.get("holds", {}) else r for r in p["pause_reasons"])
        if p.get("hot_key"):
            why = (why + "; " if why else "") + f"hot {p['hot_key']}"
        worker = "-" if p.get("worker") is None else str(p["worker"])
        age = p.get("oldest_unprocessed_s")
        rows.append([p["tp"], worker, _n(p["committed"]), _n(p["high"]), _n(p["lag"]),
                     _rate(p.get("rate")), "-" if age is None else f"{age:.1f} s",
                     Text(why, style="yellow" if why else "")])
    for o in snap.get("over_capacity") or []:
        rows.append([o["tp"], "-", "-", _n(o.get("high")), "-", "-", "-",
                     Text("over capacity: not read (more partitions than supervisor.max_partitions)",
                          style="red")])
    parts = _table("partitions", ("partition", "worker", "committed", "high", "lag", "rate/s",
                                  "oldest waiting", "paused because"), rows, ("paused because",),
                   ("partition",))
    rows = []
    exits: list[Text] = []
    # A worker's plugin version differs from the daemon's during a reload only: the column is
    # shown then, and saves its width otherwise (the summary says the daemon's version).
    versions = {w.get("plugin_version") for w in snap.get("workers", [])}
    by_version = bool(versions - {snap.get("plugin_version")})
    for w in snap.get("workers", []):
        beat = "-" if w.get("heartbeat_age_s") is None else f"{w['heartbeat_age_s']:.1f} s"
        rows.append([str(w["index"]), str(w.get("pid") or "-"), w.get("state", ""),
                     *([str(w.get("plugin_version") or "-")] if by_version else []), _n(w["records"]),
                     f"{w['ring_fill']:.0%}", _n(w["in_flight"]), beat, _n(w["restarts"]),
                     f"{(w.get('rss') or 0) / 2**20:,.0f}"])
        if w.get("start_failure"):
            exits.append(_line(f"worker {w['index']} failed to start:", w["start_failure"], "red"))
        elif w.get("last_exit"):
            exits.append(_line(f"worker {w['index']} last exit:", w["last_exit"], "red"))
    workers = _table("workers", ("worker", "pid", "state", *(["version"] if by_version else []), "records",
                                 "ring", "in flight", "beat", "restarts", "rss MiB"), rows, ())
    items: list[Any] = [Text(f"ringmaster — {reading.source}", style="bold"), head, *operations, parts,
                        workers, *exits]
    pauses = snap.get("operator_pauses") or []
    if pauses:
        rows = [[p["scope"], p["reason"], p["by"], _when_ms(p["since_ms"]), _when_ms(p.get("until_ms"))]
                for p in pauses]
        items.append(_table("operator pauses (group-wide)", ("scope", "reason", "by", "since", "until"),
                            rows, ("scope", "reason", "by")))
    return Group(*items)


def fit_to_content(console: Console, view: RenderableType) -> None:
    """Make the console wide enough that no number is cut: rich shrinks any column, numbers
    included ("13,5…"), once a table's minimum does not fit. Not a terminal (rich assumes 80
    columns for a pipe): the view's natural width, one line per row. A terminal narrower
    than the view's minimum: that minimum (lines longer than the terminal wrap there)."""
    need = Console(width=100_000, file=io.StringIO()).measure(view)
    wanted = need.minimum if console.is_terminal else need.maximum
    if console.width < wanted:
        console.width = wanted


def show(console: Console, view: RenderableType) -> None:
    fit_to_content(console, view)
    console.print(view, crop=False)


def _when_ms(ms: int | None) -> str:
    return "-" if not ms else _when_s(ms / 1000)


def _when_s(s: float | None) -> str:
    return "-" if not s else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s))
