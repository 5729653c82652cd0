"""docs/guarantees.md, the map from each guarantee of the README to the tests that enforce
it: every guarantee of the README's list is there, in order, with tests, and every test
named exists (its file, its function or class, and for fault-matrix rows the row)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAP = ROOT / "docs" / "guarantees.md"
NODE = re.compile(r"^- `(?P<path>tests/[^`:]+\.py)::(?P<name>[A-Za-z_]\w*)(?:\[(?P<param>[^\]]+)\])?`")


def readme_guarantees() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. \*\*(.+?)\*\*", section, re.M)


OTHER = "section: "  # a heading that is no guarantee of the README (the cluster faults)


def mapped() -> dict[str, list[re.Match[str]]]:
    """Guarantee title (or OTHER + another section's heading) -> the test lines under it."""
    out: dict[str, list[re.Match[str]]] = {}
    title = None
    for line in MAP.read_text().splitlines():
        heading = re.match(r"^## \d+\. (.+)$", line)
        other = re.match(r"^## (?!\d+\. )(.+)$", line)
        if heading:
            title = heading.group(1).strip()
            out[title] = []
        elif other:
            title = OTHER + other.group(1).strip()
            out[title] = []
        elif title is not None and line.startswith("- `"):
            m = NODE.match(line)
            assert m, f"not a test node id: {line}"
            out[title].append(m)
    return out


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    assigned = (t for n in tree.body if isinstance(n, ast.Assign) for t in n.targets)
    names |= {t.id for t in assigned if isinstance(t, ast.Name)}
    return names


def test_every_guarantee_of_the_readme_is_mapped_in_order() -> None:
    titles = [t.rstrip(".").split(":")[0] for t in readme_guarantees()]
    assert len(titles) == 8, titles
    assert [t for t in mapped() if not t.startswith(OTHER)] == titles


def test_the_readme_points_at_the_map() -> None:
    section = (ROOT / "README.md").read_text().split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    assert "docs/guarantees.md" in section


@pytest.mark.parametrize("title", [t for t in mapped() if not t.startswith(OTHER)])
def test_each_guarantee_has_tests_and_a_unit_test_among_them(title: str) -> None:
    nodes = mapped()[title]
    assert nodes, f"{title}: no test enforces it"
    assert any(m["path"].startswith("tests/unit/") for m in nodes), f"{title}: no unit test to mutate against"


def test_every_node_id_names_a_test_that_exists() -> None:
    from tests.cluster.matrix import ROWS_BY_ID
    from tests.faults.matrix import BY_ID

    missing = []
    for title, nodes in mapped().items():
        for m in nodes:
            path = ROOT / m["path"]
            if not path.is_file():
                missing.append(f"{title}: no file {m['path']}")
            elif m["name"] not in defined_names(path):
                missing.append(f"{title}: no {m['name']} in {m['path']}")
            elif m["param"] and m["path"] == "tests/faults/test_fault_matrix.py" and m["param"] not in BY_ID:
                missing.append(f"{title}: no fault-matrix row {m['param']}")
            elif m["param"] and m["path"] == "tests/cluster/test_cluster_matrix.py" \
                    and m["param"] not in ROWS_BY_ID:
                missing.append(f"{title}: no cluster-matrix row {m['param']}")
    assert not missing, missing
