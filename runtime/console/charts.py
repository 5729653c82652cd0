"""Line and stacked-bar charts as SVG, made on the server: no script, no charting library, no
CDN. Every label is escaped (a topic name or an error type comes from the cluster). Pure.
Runs in: the console's web server.

A series is a list of ``(t, value)`` with ``t`` in wall-clock seconds; gaps (a member that was
gone) are gaps in the line, not a line drawn across them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from markupsafe import Markup, escape

Series = Sequence[tuple[float, float]]

# Colour-blind-safe (Okabe-Ito), then two greys for the rest.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#999999", "#666666")
MAX_SERIES = 8  # more are summed into "others" (lines: the largest kept)
_W, _H = 560, 190
_L, _R, _T, _B = 52, 8, 10, 22  # margins: axis labels left, time labels below


def _nice(top: float) -> float:
    """A round upper bound for an axis: 1, 2, 2.5 or 5 times a power of ten."""
    if top <= 0 or not math.isfinite(top):
        return 1.0
    exp = 10.0 ** math.floor(math.log10(top))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        if top <= m * exp:
            return m * exp
    return 10.0 * exp


def human(v: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= size:
            return f"{v / size:.3g}{unit}"
    return f"{v:.3g}" if v else "0"


def _clock(t: float, span_s: float) -> str:
    return time.strftime("%H:%M" if span_s >= 600 else "%H:%M:%S", time.localtime(t))


def _frame(y_top: float, t0: float, t1: float) -> list[str]:
    parts = []
    for i in range(5):
        y = _T + (_H - _T - _B) * i / 4
        parts.append(f'<line x1="{_L}" x2="{_W - _R}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        label = escape(human(y_top * (4 - i) / 4))
        parts.append(f'<text x="{_L - 4}" y="{y + 4:.1f}" class="ylab">{label}</text>')
    for i in range(4):
        t = t0 + (t1 - t0) * i / 3
        x = _L + (_W - _L - _R) * i / 3
        anchor = ("start", "middle", "middle", "end")[i]
        parts.append(f'<text x="{x:.1f}" y="{_H - 6}" class="xlab" text-anchor="{anchor}">'
                     f'{escape(_clock(t, t1 - t0))}</text>')
    return parts


def _legend(names: Sequence[str]) -> Markup:
    items = "".join(f'<span class="key"><i style="background:{_colour(i, n)}"></i>{escape(n)}</span>'
                    for i, n in enumerate(names))
    return Markup(f'<div class="legend">{items}</div>')


def _empty(title: str, why: str) -> Markup:
    return Markup(f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
                  f'<p class="nodata">{escape(why)}</p></figure>')


def line_chart(title: str, series: Mapping[str, Series], unit: str, gap_s: float = 30.0) -> Markup:
    """Lines over time; the MAX_SERIES series with the largest last values are drawn."""
    series = {k: sorted(v) for k, v in series.items() if v}
    if not series:
        return _empty(title, "no data yet")
    names = sorted(series, key=lambda k: (-series[k][-1][1], k))[:MAX_SERIES]
    t0 = min(series[n][0][0] for n in names)
    t1 = max(series[n][-1][0] for n in names)
    if t1 - t0 < 1:
        t0 -= 30
    top = _nice(max(v for n in names for _, v in series[n]))
    parts = _frame(top, t0, t1)

    def xy(t: float, v: float) -> str:
        x = _L + (_W - _L - _R) * (t - t0) / (t1 - t0)
        y = _T + (_H - _T - _B) * (1 - v / top)
        return f"{x:.1f},{y:.1f}"

    for i, n in enumerate(names):
        colour = PALETTE[i % len(PALETTE)]
        run: list[str] = []
        last_t = None
        for t, v in series[n]:
            if last_t is not None and t - last_t > gap_s and run:
                parts.append(_polyline(run, colour))
                run = []
            run.append(xy(t, v))
            last_t = t
        parts.append(_polyline(run, colour))
    more = len(series) - len(names)
    shown = names + ([f"(+{more} more)"] if more > 0 else [])
    return _figure(title, unit, parts, shown)


def _colour(i: int, name: str) -> str:
    return PALETTE[-1] if name == "others" else PALETTE[i % len(PALETTE)]


def _figure(title: str, unit: str, parts: list[str], names: Sequence[str]) -> Markup:
    svg = f'<svg viewBox="0 0 {_W} {_H}" role="img" aria-label="{escape(title)}">' + "".join(parts) + "</svg>"
    caption = f"{escape(title)} <small>{escape(unit)}</small>"
    return Markup(f'<figure class="chart"><figcaption>{caption}</figcaption>{svg}{_legend(names)}</figure>')


def _polyline(points: list[str], colour: str) -> str:
    if len(points) == 1:
        x, y = points[0].split(",")
        return f'<circle cx="{x}" cy="{y}" r="2" fill="{colour}"/>'
    return f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" stroke-width="1.6"/>'


def bar_chart(title: str, buckets: Sequence[tuple[float, Mapping[str, int]]], unit: str,
              width_s: float) -> Markup:
    """Stacked bars, one per bucket (``t`` its start, ``width_s`` wide), a colour per label."""
    if not buckets:
        return _empty(title, "none in the last hour")
    totals: dict[str, int] = {}
    for _, counts in buckets:
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + n
    names = sorted(totals, key=lambda k: (-totals[k], k))
    kept = names[:MAX_SERIES - 1] if len(names) > MAX_SERIES else names
    t0 = buckets[0][0]
    t1 = max(buckets[-1][0] + width_s, t0 + 10 * width_s)
    top = _nice(max(sum(c.values()) for _, c in buckets))
    parts = _frame(top, t0, t1)
    bar_w = max(2.0, (_W - _L - _R) * width_s / (t1 - t0) - 2)
    for t, counts in buckets:
        x = _L + (_W - _L - _R) * (t - t0) / (t1 - t0)
        y = float(_H - _B)
        stack = [(k, counts.get(k, 0)) for k in kept]
        stack.append(("others", sum(n for k, n in counts.items() if k not in kept)))
        for i, (label, n) in enumerate(stack):
            if not n:
                continue
            h = (_H - _T - _B) * n / top
            y -= h
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{_colour(i, label)}"><title>{escape(label)}: {n}</title></rect>')
    shown = kept + (["others"] if len(names) > len(kept) else [])
    return _figure(title, unit, parts, shown)
