"""The documentation keeps its promises about itself: every configuration key is documented
in docs/operations.md and every key documented there exists; the README stays short, keeps
the two commands of a fresh clone on its first lines and links every page; links between
pages (and their #anchors) resolve; no page points at a file that is not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runtime.config import config_keys

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = ["design.md", "operations.md", "spark.md", "performance.md", "guarantees.md", "mutation.md",
         "deploy.md"]


def documented_keys() -> dict[str, set[str]]:
    """Section -> keys, from operations.md's `### `[section]`` headings and the first column
    of the table under each."""
    out: dict[str, set[str]] = {}
    section = None
    for line in (DOCS / "operations.md").read_text().splitlines():
        heading = re.match(r"^### `\[(\w+)\]`", line)
        if heading:
            section = heading.group(1)
            out[section] = set()
        elif line.startswith("#"):
            section = None
        elif section is not None:
            row = re.match(r"^\| `(\w+)` \|", line)
            if row:
                out[section].add(row.group(1))
    return out


def test_every_configuration_key_is_documented_and_every_documented_key_exists() -> None:
    real = {section: set(keys) for section, keys in config_keys().items()}
    docs = documented_keys()
    assert set(docs) == set(real), f"sections: documented {sorted(docs)}, real {sorted(real)}"
    for section, keys in real.items():
        missing, unknown = sorted(keys - docs[section]), sorted(docs[section] - keys)
        assert not missing, f"[{section}] keys not in docs/operations.md: {missing}"
        assert not unknown, f"[{section}] documents keys that do not exist: {unknown}"


def test_the_example_config_has_every_key_too() -> None:
    text = (ROOT / "config" / "ringmaster.toml").read_text()
    for section, keys in config_keys().items():
        for key in keys:
            assert re.search(rf"^#?\s*\[?{re.escape(section)}\.{re.escape(key)}\]|^#?\s*{re.escape(key)}\s*=",
                             text, re.M), f"config/ringmaster.toml does not show {section}.{key}"


def test_the_readme_is_short_and_starts_with_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250, f"the README has {len(lines)} lines"
    head = "\n".join(lines[:8])
    assert "./scripts/demo" in head and "./scripts/test" in head


def test_the_readme_links_every_page() -> None:
    text = README.read_text()
    for page in PAGES:
        assert f"](docs/{page})" in text, f"the README does not link docs/{page}"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_\[\]]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", page.read_text(), re.M)}


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p}" for p in PAGES)])
def test_links_between_pages_resolve(page: str) -> None:
    path = ROOT / page
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{page} links {target}: no such file"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page} links {target}: no such heading in {dest.name}"


def test_no_page_points_at_a_design_file_outside_the_repository() -> None:
    for path in [README, *(DOCS / p for p in PAGES)]:
        assert "DESIGN.md" not in path.read_text(), f"{path.name} mentions DESIGN.md"


def test_the_readmes_quick_start_config_can_scale_up_without_a_restart() -> None:
    """Issue 28: the five-minute config could not `ringmaster scale` up (max_processes)."""
    import tomllib

    text = (ROOT / "README.md").read_text()
    body = text.split("`hello.toml`, its config:", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    workers = tomllib.loads(body)["workers"]
    assert workers.get("max_processes", 0) > workers["processes"]
