"""Mutation testing of the modules that carry the guarantees, as a habit (scripts/mutate).

Runs mutmut (``[tool.mutmut]`` in pyproject.toml says which modules, and that each mutant is
judged by the unit tests that reach the function it changes), then sums up what happened and
holds the survivors against docs/mutation.md, where each one is listed with the reason it is
acceptable. A survivor that is not listed there fails the run: kill it with a test, or list
it with its reason (``--write-docs`` writes the table, keeping the reasons already given and
marking new survivors UNEXPLAINED).

    scripts/mutate [--max-children N] [--write-docs] [--report-only] [MUTANT_GLOB ...]

Runs in: a developer's shell, before a change to those modules lands; never in the default
test run (it takes tens of minutes on two cores).
"""

from __future__ import annotations

import argparse
import ast
import collections
import datetime
import fnmatch
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "mutation.md"
MUTMUT = [sys.executable, "-m", "mutmut"]
START, END = "<!-- survivors:start -->", "<!-- survivors:end -->"
REASONS_START, REASONS_END = "<!-- reasons:start -->", "<!-- reasons:end -->"
TOTALS_START, TOTALS_END = "<!-- totals:start -->", "<!-- totals:end -->"
UNEXPLAINED = "UNEXPLAINED"
LOG_TEXT = "log text: what a log line says (its message or fields); no test reads its wording"
NOT_JUDGED = ("survived", "timeout", "suspicious", "no tests", "segfault")  # listed in the docs


@dataclass
class Mutant:
    name: str
    status: str
    diff: str = ""
    where: str = ""  # path:line of the changed line in the original source
    change: str = ""  # the changed line, before -> after


def run_mutmut(args: list[str], log: Path) -> int:
    with log.open("w") as out:
        return subprocess.call([*MUTMUT, "run", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)


def results() -> list[Mutant]:
    out = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    found = []
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and "__mutmut_" in name:
            found.append(Mutant(name, status))
    return found


def module_of(name: str) -> str:
    """runtime.supervisor.partition.offsets.xǁOffsetTrackerǁcomplete__mutmut_3 ->
    runtime.supervisor.partition.offsets"""
    return re.split(r"\.x[_ǁ]", name, maxsplit=1)[0]


def function_of(name: str) -> tuple[str | None, str]:
    """(class or None, function) a mutant changes."""
    tail = name[len(module_of(name)) + 1:].rsplit("__mutmut_", 1)[0]
    if tail.startswith("xǁ"):
        cls, func = tail[2:].split("ǁ", 1)
        return cls, func
    return None, tail[2:]


def source_of(name: str) -> Path:
    return ROOT / (module_of(name).replace(".", "/") + ".py")


def describe(m: Mutant) -> None:
    """Fill in the diff, where the changed line is and what it became (mutmut's own diff, read
    in this process: `mutmut show` per mutant costs half a second of imports)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    os.chdir(ROOT)
    m.diff = get_diff_for_mutant(m.name)
    removed = [ln[1:] for ln in m.diff.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    added = [ln[1:] for ln in m.diff.splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    m.change = f"{removed[0].strip() if removed else ''} → {added[0].strip() if added else '(removed)'}"
    line = _line_in_source(m, removed[0] if removed else "")
    path = source_of(m.name).relative_to(ROOT)
    m.where = f"{path}:{line}" if line else str(path)


def _function_node(tree: ast.Module, cls: str | None, func: str) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if owner is None:
            return None
        scope = owner.body
    functions = (n for n in scope if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == func)
    return next(functions, None)


def _line_in_source(m: Mutant, removed: str) -> int | None:
    path = source_of(m.name)
    text = path.read_text()
    node = _function_node(ast.parse(text), *function_of(m.name))
    if node is None or not removed.strip():
        return getattr(node, "lineno", None)
    lines = text.splitlines()
    for i in range(node.lineno - 1, node.end_lineno or len(lines)):  # type: ignore[attr-defined]
        if lines[i].strip() == removed.strip():
            return i + 1
    return node.lineno  # type: ignore[attr-defined, no-any-return]


def guess_reason(m: Mutant) -> str:
    """The reasons that can be told from the source alone; the rest is a person's to give."""
    if ":" not in m.where:
        return UNEXPLAINED
    path, line_text = m.where.rsplit(":", 1)
    line = int(line_text)
    tree = ast.parse((ROOT / path).read_text())
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not (node.lineno <= line <= (node.end_lineno or node.lineno)):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "log":
            return LOG_TEXT
    # A changed string may be a header name or a key other code reads: a person decides.
    return UNEXPLAINED


# ------------------------------------------------------------------------------ the docs
def documented() -> dict[str, str]:
    """Mutant name -> reason, from docs/mutation.md's survivors table (a reason given there by
    hand for one mutant)."""
    if not DOC.exists():
        return {}
    text = DOC.read_text()
    if START not in text:
        return {}
    table = text.split(START, 1)[1].split(END, 1)[0]
    reasons = {}
    for row in table.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]
        if len(cells) >= 5 and cells[0].startswith("`") and "__mutmut_" in cells[0]:
            reasons[cells[0].strip("`")] = cells[4]
    return reasons


def reasons_by_pattern() -> list[tuple[str, str]]:
    """(pattern, reason) from docs/mutation.md's reasons table: a reason for every survivor
    of a function (a pattern of mutant names, fnmatch), kept where the code keeps it."""
    if not DOC.exists() or REASONS_START not in DOC.read_text():
        return []
    table = DOC.read_text().split(REASONS_START, 1)[1].split(REASONS_END, 1)[0]
    out = []
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|", 1)]
        if len(cells) == 2 and cells[0].startswith("`"):
            out.append((cells[0].strip("`"), cells[1].strip()))
    return out


def reason_for(m: Mutant, by_name: dict[str, str], patterns: list[tuple[str, str]]) -> str:
    own = by_name.get(m.name)
    if own and own != UNEXPLAINED and not own.startswith("see "):
        return own
    for pattern, _why in patterns:
        if fnmatch.fnmatchcase(m.name, pattern):
            return f"see `{pattern}` above"
    return guess_reason(m)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def survivors_table(judged: list[Mutant], reasons: dict[str, str]) -> str:
    rows = ["| mutant | status | where | change | why it is acceptable |", "|---|---|---|---|---|"]
    patterns = reasons_by_pattern()
    for m in sorted(judged, key=lambda m: (m.where.rsplit(":", 1)[0], _line(m), m.name)):
        reason = reason_for(m, reasons, patterns)
        rows.append(f"| `{m.name}` | {m.status} | `{m.where}` | `{_cell(m.change)}` | {_cell(reason)} |")
    return "\n".join(rows)


def _line(m: Mutant) -> int:
    tail = m.where.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def totals_table(all_mutants: list[Mutant], seconds: float | None, command: str) -> str:
    by_module: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for m in all_mutants:
        by_module[module_of(m.name)][m.status] += 1
    statuses = ["killed", "survived", "timeout", "suspicious", "no tests", "skipped", "not checked"]
    shown = [s for s in statuses if any(c[s] for c in by_module.values())]
    lines = [f"| module | mutants | {' | '.join(shown)} |", "|---|---|" + "---|" * len(shown)]
    total: collections.Counter[str] = collections.Counter()
    for module in sorted(by_module):
        c = by_module[module]
        total.update(c)
        lines.append(f"| `{module}` | {sum(c.values())} | " + " | ".join(str(c[s]) for s in shown) + " |")
    all_cells = " | ".join(f"**{total[s]}**" for s in shown)
    lines.append(f"| **all** | **{sum(total.values())}** | {all_cells} |")
    when = datetime.date.today().isoformat()
    took = f", {seconds / 60:.0f} min on {os.cpu_count()} cores" if seconds is not None else ""
    return f"Last run: {when}, `{command}`{took}.\n\n" + "\n".join(lines)


def write_docs(all_mutants: list[Mutant], judged: list[Mutant], seconds: float | None, command: str) -> None:
    text = DOC.read_text()
    reasons = documented()
    text = _between(text, TOTALS_START, TOTALS_END, totals_table(all_mutants, seconds, command))
    text = _between(text, START, END, survivors_table(judged, reasons))
    DOC.write_text(text)


def _between(text: str, start: str, end: str, body: str) -> str:
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}\n{end}{tail}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--write-docs", action="store_true", help="rewrite docs/mutation.md's tables")
    ap.add_argument("--report-only", action="store_true", help="judge the last run without running")
    ap.add_argument("globs", nargs="*", help="mutants to run (mutmut's wildcards), default all")
    a = ap.parse_args()
    command = "scripts/mutate" + (f" {' '.join(a.globs)}" if a.globs else "")
    seconds = None
    if not a.report_only:
        (ROOT / "mutants").mkdir(exist_ok=True)
        log = ROOT / "mutants" / "run.log"
        started = time.monotonic()
        code = run_mutmut(["--max-children", str(a.max_children), *a.globs], log)
        seconds = time.monotonic() - started
        if code != 0:
            print(f"mutmut run failed (exit {code}); its output: {log}", file=sys.stderr)
            print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), file=sys.stderr)
            return code
    every = results()
    judged = [m for m in every if m.status in NOT_JUDGED]
    for m in judged:
        describe(m)
    counts = collections.Counter(m.status for m in every)
    took = f" in {seconds / 60:.1f} min" if seconds is not None else ""
    print(f"{len(every)} mutants{took}: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
    print(totals_table(every, seconds, command))
    if a.write_docs:
        write_docs(every, judged, seconds, command)
        print(f"wrote {DOC.relative_to(ROOT)}")
    reasons, patterns = documented(), reasons_by_pattern()
    unexplained = [m for m in judged if reason_for(m, reasons, patterns) == UNEXPLAINED]
    for m in unexplained:
        print(f"\n--- {m.status}, not explained in docs/mutation.md: {m.name} ({m.where})\n{m.diff}")
    if unexplained:
        print(f"\n{len(unexplained)} mutant(s) not killed and not explained: kill each with a test, or give "
              "the reason it is acceptable in docs/mutation.md (scripts/mutate --write-docs --report-only)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
