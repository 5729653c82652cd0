"""runtime/dev/maven.py: a resolution is used only once complete, and a missing artifact is
told apart from Maven failing (the Spark Kafka source then tries the next version). Maven
itself is faked by a script on PATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.dev import maven
from runtime.errors import ArtifactMissing, RingmasterError

ART = [maven.Artifact("org.example", "thing", "1.0")]
# The fake's first lines: the directory Maven is told to copy the jars to.
OUT_DIR = 'for a in "$@"; do case "$a" in -DoutputDirectory=*) d="${a#*=}";; esac; done\n'


def fake_mvn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    script = bin_dir / "mvn"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_the_jars_are_used_once_resolved_and_not_resolved_again(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mvn(tmp_path, monkeypatch, OUT_DIR + 'mkdir -p "$d" && touch "$d/thing-1.0.jar" "$d/dep-2.jar"\n')
    home = tmp_path / "cache" / "thing-1.0"
    libs = maven.resolve(home, ART, "thing-1.0.jar", "thing")
    assert sorted(p.name for p in libs.iterdir()) == ["dep-2.jar", "thing-1.0.jar"]
    assert not (home / "libs.partial").exists()
    assert "<artifactId>thing</artifactId>" in (home / "pom.xml").read_text()
    fake_mvn(tmp_path / "again", monkeypatch, "exit 1\n")
    assert maven.resolve(home, ART, "thing-1.0.jar", "thing") == libs


@pytest.mark.parametrize(("line", "error"), [
    ("[ERROR] Failed: Could not find artifact org.example:thing:jar:1.0 in central", ArtifactMissing),
    ("[ERROR] Failed: org.example:thing:jar:1.0 was not found in https://repo during a previous attempt",
     ArtifactMissing),
    ("[ERROR] Failed: Unknown host repo.maven.apache.org", RingmasterError),
])
def test_a_failure_says_why_and_leaves_nothing_taken_for_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, error: type[Exception]) -> None:
    fake_mvn(tmp_path, monkeypatch,
             OUT_DIR + f'mkdir -p "$d" && touch "$d/thing-1.0.jar"\necho "{line}"\nexit 1\n')
    home = tmp_path / "cache" / "thing-1.0"
    with pytest.raises(error, match="resolving thing with Maven failed") as caught:
        maven.resolve(home, ART, "thing-1.0.jar", "thing")
    assert (type(caught.value) is ArtifactMissing) == (error is ArtifactMissing)
    assert not maven.resolved(home, "thing-1.0.jar"), "a failed run's jars are never used"
