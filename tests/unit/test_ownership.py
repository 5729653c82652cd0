"""A partition's state changes in one place: its own methods (runtime/supervisor/partition/
partition.py). This test reads every other module of the supervisor and fails when one stores
into, deletes or mutates (append, pop, item assignment, ...) a field of a partition's parts
(``intake``, ``pause``, ``stats``), calls a method of its offset tracker that changes it, or
touches its private fence (``_epoch``, ``_rewinding``): directly (``p.intake.open_msgs = []``)
or through a name bound to the part (``s = p.intake; s.open_msgs = []``). An object's writes to
its own attributes (``self.x = ...``) are its own business.

And the Supervisor stays a story: a bound on its statements and methods that packing several
assignments on one line cannot dodge (docs/design.md, "Packages and rooms")."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from runtime.supervisor.partition.partition import IntakeState, PauseState, Stats

ROOT = Path(__file__).resolve().parents[2]
THE_PARTITION = "runtime/supervisor/partition/partition.py"
PARTS = {"intake": IntakeState, "pause": PauseState, "stats": Stats}
TRACKER = "tracker"
TRACKER_CHANGES = {"register", "register_span", "skip_to", "start_at_end", "complete", "split",
                   "mark_committed", "discard_unfinished", "take_intents"}
PRIVATE = {"_epoch", "_rewinding"}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove",
            "discard", "add", "appendleft", "extendleft", "popleft", "sort", "reverse"}


def _part_of(node: ast.AST, aliases: dict[str, str]) -> str | None:
    """The part ``node`` is (``p.intake``, or a name bound to one), if it is one."""
    if isinstance(node, ast.Attribute) and node.attr in (*PARTS, TRACKER) and not _own(node):
        return node.attr
    if isinstance(node, ast.Name):
        return aliases.get(node.id)
    return None


def _own(node: ast.Attribute) -> bool:
    return isinstance(node.value, ast.Name) and node.value.id == "self"


def writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) of every change to a partition's parts made in ``tree``."""
    found: list[tuple[int, str]] = []
    functions = (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
    for scope in [tree, *functions]:
        aliases: dict[str, str] = {}
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and [type(t) for t in node.targets] == [ast.Name]:
                part = _part_of(node.value, {})
                if part is not None:
                    aliases[node.targets[0].id] = part  # type: ignore[attr-defined]
        found += _changes(scope, aliases)
    return sorted(set(found))


def _changes(scope: ast.AST, aliases: dict[str, str]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def target(node: ast.AST) -> None:
        if isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute):
            part = _part_of(node.value, aliases)
            if part is not None and part != TRACKER:
                found.append((node.lineno, f"{part}.{node.attr}"))
            elif node.attr in PRIVATE and not _own(node):
                found.append((node.lineno, node.attr))
        elif isinstance(node, ast.Tuple | ast.List):
            for elt in node.elts:
                target(elt)

    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                target(t)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            target(node.target)
        elif isinstance(node, ast.Delete):
            for t in node.targets:
                target(t)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if node.func.attr in TRACKER_CHANGES and _part_of(owner, aliases) == TRACKER:
                found.append((node.lineno, f"tracker.{node.func.attr}()"))
            elif node.func.attr in MUTATORS and isinstance(owner, ast.Attribute):
                part = _part_of(owner.value, aliases)
                if part not in (None, TRACKER):
                    found.append((node.lineno, f"{part}.{owner.attr}.{node.func.attr}()"))
        elif isinstance(node, ast.Attribute) and node.attr in PRIVATE and not _own(node):
            found.append((node.lineno, node.attr))
    return found


def test_the_check_knows_every_field_of_the_parts() -> None:
    # A part's fields are what the check guards through it; a part added to Partition must be here.
    from runtime.supervisor.partition.partition import Partition
    assert set(Partition.__slots__) >= set(PARTS) | {TRACKER}
    assert all(dataclasses.fields(cls) for cls in PARTS.values())


def test_no_module_but_the_partition_changes_a_partitions_state() -> None:
    violations = []
    for path in sorted((ROOT / "runtime" / "supervisor").rglob("*.py")):
        module = str(path.relative_to(ROOT))
        if module == THE_PARTITION:
            continue
        for line, what in writes(ast.parse(path.read_text())):
            violations.append(f"{module}:{line} changes {what} (only {THE_PARTITION} may)")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("code", [
    "p.intake.open_msgs = []", "p.intake.open_msgs.append(m)", "p.pause.holds[r] = h", "del p.pause.holds[r]",
    "p.stats.outputs += 1", "p.intake.next_offset, x = 1, 2", "p.intake.lane_records.setdefault(1, 0)",
    "p.tracker.complete(3)", "p._epoch = 4", "x = p._rewinding",
    "def f(p):\n    s = p.intake\n    s.open_msgs = []",
    "def f(p):\n    s = p.pause\n    s.holds.clear()",
    "def f(p):\n    t = p.tracker\n    t.mark_committed(None)",
])
def test_the_check_sees_every_kind_of_change(code: str) -> None:
    assert writes(ast.parse(code)), f"not seen: {code}"


@pytest.mark.parametrize("code", [
    "self.intake = x", "p.hold(r, d)", "n = p.intake.open_msgs", "s = p.intake\nif s.open_msgs: pass",
    "t.outputs += 1", "p.tracker.committable",
])
def test_the_check_lets_reading_and_asking_be(code: str) -> None:
    assert not writes(ast.parse(code)), code


# The Supervisor's bound. Measured when the loop became named steps (issue 42): 213 statements,
# 25 methods; a Supervisor that grows past this has taken a room's job back.
MAX_STATEMENTS = 220
MAX_METHODS = 26


def statements(node: ast.AST) -> int:
    """Statements, an assignment of a tuple of values counting once per value (``a, b = 1, 2``
    is two), docstrings not counted: a bound that packing lines cannot dodge."""
    n = 0
    for x in ast.walk(node):
        if not isinstance(x, ast.stmt) or isinstance(x, ast.FunctionDef | ast.ClassDef):
            continue
        if isinstance(x, ast.Expr) and isinstance(x.value, ast.Constant) and isinstance(x.value.value, str):
            continue
        n += len(x.value.elts) if isinstance(x, ast.Assign) and isinstance(x.value, ast.Tuple) else 1
    return n


def _supervisor() -> ast.ClassDef:
    tree = ast.parse((ROOT / "runtime/supervisor/daemon/loop.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Supervisor"]
    return cls


def test_the_supervisor_class_stays_a_story() -> None:
    cls = _supervisor()
    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    assert statements(cls) <= MAX_STATEMENTS, f"{statements(cls)} statements: a room's job came back"
    assert len(methods) <= MAX_METHODS, f"{len(methods)} methods: a room's job came back"


def test_the_supervisor_packs_no_assignments() -> None:
    # Several values assigned in one statement (``a, b = x, y``) read as one step where there
    # are several; unpacking what one call returns (``new, over = f()``) is one.
    packed = [n.lineno for n in ast.walk(_supervisor())
              if isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple)]
    assert packed == [], f"runtime/supervisor/daemon/loop.py packs assignments on lines {packed}"


def test_the_statement_count_sees_packed_lines() -> None:
    assert statements(ast.parse("a, b, c = 1, 2, 3")) == 3
    assert statements(ast.parse("a = 1\nb = 2\nc = 3")) == 3
    assert statements(ast.parse('def f():\n    """doc"""\n    return 1')) == 1
