"""A record's bytes as an operator reads them: text, JSON (pretty-printed) or hex, never HTML
(the templates escape what this returns). Pure. Runs in: the console's web server."""

from __future__ import annotations

import json
from dataclasses import dataclass

MAX_SHOWN = 64 * 1024  # bytes of a value shown; the rest is counted


@dataclass(frozen=True)
class Preview:
    view: str  # "text", "json", "hex" or "none"
    text: str
    size: int
    cut: bool  # only the first MAX_SHOWN bytes are shown
    views: tuple[str, ...]  # the views this value has


def preview(data: bytes | None, view: str = "") -> Preview:
    """``view``: asked for, or "" for the best one (JSON if it parses, text if it is UTF-8, else hex)."""
    if data is None:
        return Preview("none", "(null)", 0, False, ())
    shown, cut = data[:MAX_SHOWN], len(data) > MAX_SHOWN
    views = ["hex"]
    text: str | None
    try:
        text = shown.decode("utf-8")
        views.insert(0, "text")
    except UnicodeDecodeError:
        text = None
    pretty = None
    if text is not None and not cut:
        try:
            pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            views.insert(0, "json")
        except ValueError:
            pass
    if view not in views:
        view = views[0]
    if view == "json" and pretty is not None:
        return Preview("json", pretty, len(data), cut, tuple(views))
    if view == "text" and text is not None:
        return Preview("text", text, len(data), cut, tuple(views))
    return Preview("hex", _hexdump(shown), len(data), cut, tuple(views))


def _hexdump(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 16):
        chunk = data[i:i + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{i:08x}  {hexes:<47}  {text}")
    return "\n".join(lines)
