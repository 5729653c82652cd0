"""Each part of a partition's state has one writer (runtime/supervisor/partition/partition.py): this
test reads every module of the supervisor and fails when one assigns, deletes or mutates
(append, pop, item assignment, ...) a field of a part that another room owns. An object's
writes to its own attributes (``self.x = ...``) are its own business and are not counted."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from runtime.supervisor.partition.partition import Fence, IntakeState, PauseState, Stats

ROOT = Path(__file__).resolve().parents[2]
OWNERS = {
    Fence: "runtime/supervisor/datapath/assignment.py",
    IntakeState: "runtime/supervisor/datapath/intake.py",
    PauseState: "runtime/supervisor/datapath/flowcontrol.py",
    Stats: "runtime/supervisor/datapath/results.py",
}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove",
            "discard", "add", "appendleft", "extendleft", "popleft", "sort", "reverse"}


def owned_fields() -> dict[str, str]:
    owner_of: dict[str, str] = {}
    for cls, module in OWNERS.items():
        for f in dataclasses.fields(cls):
            assert f.name not in owner_of, f"{f.name} is a field of two parts: the check needs unique names"
            owner_of[f.name] = module
    return owner_of


def writes(tree: ast.AST, fields: set[str]) -> list[tuple[int, str]]:
    """(line, field) of every store, delete or in-place mutation of an attribute in fields."""
    found = []

    def own(node: ast.Attribute) -> bool:
        return isinstance(node.value, ast.Name) and node.value.id == "self"

    def target(node: ast.AST) -> None:
        if isinstance(node, ast.Attribute) and node.attr in fields and not own(node):
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr in fields and not own(node.value):
            found.append((node.lineno, node.value.attr))
        elif isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                target(elt)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            target(node.target)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                target(t)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute) \
                and node.func.value.attr in fields and not own(node.func.value):
            found.append((node.lineno, node.func.value.attr))
    return found


def test_no_module_writes_a_part_another_room_owns() -> None:
    owner_of = owned_fields()
    violations = []
    for path in sorted((ROOT / "runtime" / "supervisor").rglob("*.py")):
        module = str(path.relative_to(ROOT))
        for line, name in writes(ast.parse(path.read_text()), set(owner_of)):
            if owner_of[name] != module:
                violations.append(f"{module}:{line} writes {name} (owned by {owner_of[name]})")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("code", [
    "p.fence.epoch = 3", "p.intake.open_msgs.append(m)", "p.pause.holds[r] = h", "del p.pause.holds[r]",
    "p.stats.outputs += 1", "p.intake.next_offset, x = 1, 2", "s.lane_records.setdefault(1, 0)",
])
def test_the_check_sees_every_kind_of_write(code: str) -> None:
    assert writes(ast.parse(code), set(owned_fields())), f"not seen: {code}"


def test_the_supervisor_class_stays_a_story_under_250_lines() -> None:
    # The loop reads like a story only while the rooms keep their own work: a Supervisor
    # that grows past this has taken a room's job back (docs/design.md, "Rooms").
    tree = ast.parse((ROOT / "runtime/supervisor/daemon/loop.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Supervisor"]
    assert cls.end_lineno is not None
    assert cls.end_lineno - cls.lineno + 1 < 250


def test_no_room_but_intake_empties_what_intake_set_aside() -> None:
    # The supervisor used to clear intake.too_large itself; intake hands it over instead.
    for path in (ROOT / "runtime").rglob("*.py"):
        if path.name != "intake.py":
            assert "too_large.clear" not in path.read_text(), path
