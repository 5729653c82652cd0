"""Looking at a running daemon from another terminal: ``ringmaster status`` (one snapshot)
and ``ringmaster top`` (live). Reads the admin endpoint's /status when ``[admin] listen``
is set, else the status file: the same JSON document either way.

Runs in: the CLI process, never the daemon.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from runtime.config import Settings, parse_listen
from runtime.errors import RingmasterError

Snapshot = dict[str, Any]


class NoDaemon(RingmasterError):
    """Nothing to read: no admin endpoint answers and no status file is there."""


def status_url(settings: Settings) -> str | None:
    if not settings.admin.listen:
        return None
    host, port = parse_listen(settings.admin.listen, allow_remote=True)  # the daemon's own reading
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"  # listening on every address: loopback is one of them
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/status"


def read_snapshot(settings: Settings, timeout_s: float = 3.0) -> tuple[Snapshot, str]:
    """(snapshot, where it came from)."""
    url = status_url(settings)
    problems = []
    if url is not None:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                return json.loads(resp.read()), url
        except urllib.error.HTTPError as exc:
            problems.append(f"{url} answered {exc.code}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            problems.append(f"{url}: {getattr(exc, 'reason', exc)}")
    path = settings.supervisor.status_file
    if path:
        try:
            snap = json.loads(Path(path).read_text())
            age = time.time() - Path(path).stat().st_mtime
            return snap, f"{path} (written {age:.0f} s ago)"
        except FileNotFoundError:
            problems.append(f"{path} does not exist")
        except (OSError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
    if not problems:
        raise NoDaemon("nothing to read: set [admin] listen (or supervisor.status_file) in the config "
                       "of the running daemon")
    raise NoDaemon("no running daemon found: " + "; ".join(problems))


def _n(v: Any) -> str:
    return "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def render(snap: Snapshot, source: str, rates: dict[str, float] | None = None) -> Group:
    """The whole view: summary, partitions, workers, operator pauses."""
    head = Table.grid(padding=(0, 2))
    stopped = snap.get("stopped")
    state = f"stopping: {stopped['reason']}" if stopped else ("ready" if snap.get("ready") else "starting")
    head.add_row("group", str(snap.get("group")), "pid", str(snap.get("pid")), "state", state)
    rate = (rates or {}).get("total")
    head.add_row("records", _n(snap.get("records")),
                 "rate", f"{rate:,.0f}/s" if rate is not None else f"{snap.get('rate', 0):,.0f}/s (average)",
                 "lag", _n(snap.get("lag")))
    head.add_row("outputs", _n(snap.get("outputs")), "dead letters", _n(snap.get("dead_letters")),
                 "deferred", _n(snap.get("deferred")))
    head.add_row("ordering", str(snap.get("ordering")), "restarts", _n(snap.get("restarts")),
                 "rebalances", _n(snap.get("rebalances")))
    parts = Table(title="partitions", title_justify="left", show_edge=False)
    for col in ("partition", "worker", "committed", "high", "lag", "rate/s", "paused because"):
        parts.add_column(col, justify="left" if col in ("partition", "paused because") else "right")
    for p in snap.get("partitions", []):
        why = ", ".join(f"{r}: {p['holds'][r]}" if r in p.get("holds", {}) else r for r in p["pause_reasons"])
        if p.get("hot_key"):
            why = (why + "; " if why else "") + f"hot {p['hot_key']}"
        r = (rates or {}).get(p["tp"])
        parts.add_row(p["tp"], str(p["worker"]), _n(p["committed"]), _n(p["high"]), _n(p["lag"]),
                      "-" if r is None else f"{r:,.0f}", Text(why, style="yellow" if why else ""))
    workers = Table(title="workers", title_justify="left", show_edge=False)
    for col in ("worker", "pid", "state", "records", "ring", "in flight", "heartbeat", "restarts", "rss MiB",
                "last exit"):
        workers.add_column(col, justify="left" if col in ("state", "last exit") else "right")
    for w in snap.get("workers", []):
        beat = "-" if w.get("heartbeat_age_s") is None else f"{w['heartbeat_age_s']:.1f} s"
        last = w.get("start_failure") or w.get("last_exit") or ""
        workers.add_row(str(w["index"]), str(w.get("pid") or "-"), w.get("state", ""), _n(w["records"]),
                        f"{w['ring_fill']:.0%}", str(w["in_flight"]), beat, str(w["restarts"]),
                        f"{(w.get('rss') or 0) / 2**20:.0f}", Text(last, style="red" if last else ""))
    items: list[Any] = [Text(f"ringmaster — {source}", style="bold"), head, parts, workers]
    pauses = snap.get("operator_pauses") or []
    if pauses:
        t = Table(title="operator pauses (group-wide)", title_justify="left", show_edge=False)
        for col in ("scope", "reason", "by", "since", "until"):
            t.add_column(col)
        for p in pauses:
            t.add_row(p["scope"], p["reason"], p["by"], _when(p["since_ms"]), _when(p.get("until_ms")))
        items.append(t)
    return Group(*items)


def _when(ms: int | None) -> str:
    return "-" if not ms else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def rates_between(old: Snapshot | None, new: Snapshot, seconds: float) -> dict[str, float]:
    """Records per second between two snapshots, in total and per partition."""
    if old is None or seconds <= 0:
        return {}
    out = {"total": max(0.0, (new.get("records", 0) - old.get("records", 0)) / seconds)}
    before = {p["tp"]: p["records"] for p in old.get("partitions", [])}
    for p in new.get("partitions", []):
        if p["tp"] in before:
            out[p["tp"]] = max(0.0, (p["records"] - before[p["tp"]]) / seconds)
    return out
