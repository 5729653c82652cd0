"""The labels the benchmarks give the source trees they compare in one invocation
(scripts/benchkit/scale.py, ``_revision``): a tree unpacked inside a checkout (the device
script's AGAINST=run/old) must not carry the enclosing checkout's commit, or the old tree
and the new one read as the same revision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from benchkit.scale import _revision


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def test_a_tree_inside_a_checkout_is_named_by_its_revision_file_or_folder_not_by_the_checkout(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.txt").write_text("a\n")
    _git(repo, "add", "a.txt")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "--short=7", "HEAD")
    old = repo / "run" / "old"
    old.mkdir(parents=True)

    assert _revision(repo) == head
    assert _revision(old) == "old (not a checkout)"
    (old / "REVISION").write_text("abc1234\n")
    assert _revision(old) == "abc1234"
    (repo / "a.txt").write_text("changed\n")
    assert _revision(repo) == head + "+"
