"""Every alert rule has a runbook_url, and it points at a section of docs/runbook.md that
exists; every section there is for a rule that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rules() -> dict[str, str | None]:
    """alert name -> its runbook_url (None when it has none), read block by block."""
    text = (ROOT / "config" / "prometheus-alerts.yml").read_text()
    blocks = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    out: dict[str, str | None] = {}
    for block in blocks:
        name = block.split("\n", 1)[0].strip()
        url = re.search(r'^\s+runbook_url: "([^"]+)"\s*$', block, re.M)
        out[name] = url.group(1) if url else None
    return out


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to -."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", page.read_text(), re.M):
        out.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return out


def test_every_alert_has_a_runbook_url_to_a_section_that_exists() -> None:
    rules = _rules()
    assert len(rules) >= 10, rules
    for name, url in rules.items():
        assert url is not None, f"{name} has no runbook_url"
        path, _, anchor = url.partition("#")
        page = ROOT / path
        assert page.is_file(), f"{name}: {path} does not exist"
        assert anchor == name.lower(), f"{name}: its runbook_url names another section ({anchor})"
        assert anchor in _anchors(page), f"{name}: no section #{anchor} in {path}"


def test_every_runbook_section_is_for_an_alert_that_exists() -> None:
    rules = {name.lower() for name in _rules()}
    sections = {a for a in _anchors(ROOT / "docs" / "runbook.md") if a.startswith("ringmaster")}
    assert sections == rules, (sections - rules, rules - sections)


def test_the_runbooks_metric_names_are_exported() -> None:
    """The runbook names metrics to look at: each is one /metrics has."""
    from test_admin_metrics import scrape, snapshot

    from runtime.ops.metrics import RuntimeMetrics

    metrics = RuntimeMetrics(snapshot, loop_age=lambda: 0.5, group="g")
    exported = {re.sub(r"_(bucket|count|sum)$", "", n) for n in scrape(metrics)}
    named = set(re.findall(r"`((?:ringmaster|kafka)_[a-z_]+)`", (ROOT / "docs" / "runbook.md").read_text()))
    assert named and named <= exported, named - exported
