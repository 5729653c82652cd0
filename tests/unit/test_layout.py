"""The test tree itself: pytest's default import mode keys a test module by its
basename when its folder is not a package, so two such files with one name make
the whole run stop at collection (CI saw exactly that, exit 2 after 26 s)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _importable_name(path: Path) -> str:
    # A module inside a package is imported by its dotted path; one outside by
    # its bare name, and bare names share a single namespace.
    parts = [path.stem]
    parent = path.parent
    while (parent / "__init__.py").exists():
        parts.insert(0, parent.name)
        parent = parent.parent
    return ".".join(parts)


def test_every_test_module_has_a_name_no_other_test_module_has() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[_importable_name(path)].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"
