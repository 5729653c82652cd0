"""The fuzz corpus (tests/fuzz/corpus/, kept by scripts/fuzz) replayed in every run, without
atheris: each input is a case of a fuzz target (tests/fuzz/targets.py), whose oracles hold —
the C speedups return what their Python twins return or both raise, never crash; the frame
decoder returns a frame or raises FrameError, nothing else. Inputs that found bugs stay in
the corpus as their regression tests (tests/fuzz/README.md lists them)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fuzz.targets import TARGETS  # noqa: E402

CORPUS = ROOT / "tests" / "fuzz" / "corpus"
CASES = sorted((t, p) for t in TARGETS for p in (CORPUS / t).glob("*") if p.is_file())


def test_every_target_has_a_corpus() -> None:
    assert {t for t, _ in CASES} == set(TARGETS), "run scripts/fuzz and commit tests/fuzz/corpus"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_the_corpus_replays_clean(target: str) -> None:
    """One test per target (thousands of inputs run in well under a second each)."""
    inputs = [p for t, p in CASES if t == target]
    for path in inputs:
        try:
            TARGETS[target](path.read_bytes())
        except AssertionError as exc:
            raise AssertionError(f"{target} corpus input {path.name}: {exc}") from exc
