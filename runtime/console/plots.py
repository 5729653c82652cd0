"""The plots' series, from the members' status records and the dead letters. Pure. Runs in:
the console's web server, per page.

* records/s: each record's ``rate`` (the member's last ten seconds), per partition, and summed
  over the members for the group (each member's at the time of its record);
* lag per partition, as each member reported it;
* worker busy share: the growth of a worker's ``busy_s`` (its batches' time, plugin and
  delivery) over the time between two records of its member;
* batch time: the growth of every worker's ``busy_s`` over the batches done in between (the
  mean time of a batch in its worker);
* dead letters per minute, by error type, from the letters themselves (when they failed).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from runtime.redrive.letters import Letter

Series = list[tuple[float, float]]
Doc = Mapping[str, Any]


def _tp(p: Doc) -> str:
    return f"{p['topic']}[{p['partition']}]"


def rates(history: Mapping[str, Sequence[Doc]]) -> tuple[dict[str, Series], dict[str, Series]]:
    """(per partition, the group's) records per second."""
    per: dict[str, Series] = {}
    group: dict[float, float] = {}
    for docs in history.values():
        for d in docs:
            t = float(d["taken_at"])
            for p in d.get("partitions", []):
                if p.get("rate") is not None:
                    per.setdefault(_tp(p), []).append((t, float(p["rate"])))
            if d.get("rate") is not None:
                bucket = round(t / 5) * 5  # members' records within a few seconds are one moment
                group[bucket] = group.get(bucket, 0.0) + float(d["rate"])
    return per, {"group": sorted(group.items())}


def lags(history: Mapping[str, Sequence[Doc]]) -> dict[str, Series]:
    per: dict[str, Series] = {}
    for docs in history.values():
        for d in docs:
            for p in d.get("partitions", []):
                if p.get("lag") is not None:
                    per.setdefault(_tp(p), []).append((float(d["taken_at"]), float(p["lag"])))
    return per


def _pairs(docs: Sequence[Doc]) -> Iterable[tuple[Doc, Doc]]:
    """Successive records of one incarnation of a member (the same process start)."""
    for a, b in itertools.pairwise(docs):
        if a.get("started_at") == b.get("started_at") and float(b["taken_at"]) > float(a["taken_at"]):
            yield a, b


def busy_share(history: Mapping[str, Sequence[Doc]]) -> dict[str, Series]:
    """Per worker (``member w<index>``), the share of the time it ran batches, 0..1."""
    out: dict[str, Series] = {}
    several = len(history) > 1
    for member, docs in history.items():
        for a, b in _pairs(docs):
            dt = float(b["taken_at"]) - float(a["taken_at"])
            before = {w["index"]: (w.get("pid"), float(w.get("busy_s") or 0)) for w in a.get("workers", [])}
            for w in b.get("workers", []):
                pid, busy = before.get(w["index"], (None, None))
                if busy is None or pid != w.get("pid"):
                    continue  # a new incarnation: its busy_s counts all of them, but not over this span
                name = f"{member} w{w['index']}" if several else f"worker {w['index']}"
                share = min(1.0, max(0.0, (float(w.get("busy_s") or 0) - busy) / dt))
                out.setdefault(name, []).append((float(b["taken_at"]), share))
    return out


def batch_ms(history: Mapping[str, Sequence[Doc]]) -> dict[str, Series]:
    """Per member, the mean time of the batches done between two of its records, in ms."""
    out: dict[str, Series] = {}
    for member, docs in history.items():
        for a, b in _pairs(docs):
            batches = int(b.get("batches") or 0) - int(a.get("batches") or 0)
            busy = sum(float(w.get("busy_s") or 0) for w in b.get("workers", [])) - \
                sum(float(w.get("busy_s") or 0) for w in a.get("workers", []))
            if batches > 0 and busy >= 0:
                out.setdefault(member, []).append((float(b["taken_at"]), 1000 * busy / batches))
    return out


def dead_letters_per_minute(letters: Iterable[Letter], now: float,
                            window_s: float = 3600.0) -> list[tuple[float, dict[str, int]]]:
    by_minute: dict[float, Counter[str]] = {}
    for letter in letters:
        when = letter.when_ms
        if when is None or when / 1000 < now - window_s:
            continue
        minute = (when // 60_000) * 60.0
        by_minute.setdefault(minute, Counter())[letter.error_type] += 1
    return [(t, dict(c)) for t, c in sorted(by_minute.items())]
