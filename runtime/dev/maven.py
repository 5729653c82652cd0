"""Java artifacts from Maven Central, resolved with Maven once and cached on disk.

Apache Kafka's jars for the development broker (runtime/dev/kafkabroker.py) and the jars of
Spark's own Kafka source (runtime/spark/builtin_source.py) both come from here. Each set lives
in a directory of its own under :func:`cache_root`; what is in ``libs/`` there is complete
(see :func:`resolve`). Starts processes: ``mvn``.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import ArtifactMissing, RingmasterError


@dataclass(frozen=True)
class Artifact:
    group: str
    artifact: str
    version: str
    scope: str = "compile"


# Spark's parent POM names a Google mirror of Central as a repository, which cannot be reached
# from everywhere (and Maven then fails the whole resolution): the same id here, which wins
# over a dependency's, points at Central itself.
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka-ringmaster</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <repositories>
    <repository>
      <id>gcs-maven-central-mirror</id>
      <url>https://repo.maven.apache.org/maven2</url>
    </repository>
  </repositories>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

_DEPENDENCY = """    <dependency>
      <groupId>{a.group}</groupId>
      <artifactId>{a.artifact}</artifactId>
      <version>{a.version}</version>
      <scope>{a.scope}</scope>
    </dependency>"""


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/kafka-ringmaster`` (``~/.cache/kafka-ringmaster`` without it)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kafka-ringmaster"


def resolved(home: Path, marker: str) -> bool:
    """Whether ``home/libs`` holds a complete resolution (``marker`` is one of its jars)."""
    return (home / "libs" / marker).is_file()


def resolve(home: Path, artifacts: Sequence[Artifact], marker: str, what: str) -> Path:
    """``home/libs``: the artifacts and their runtime dependencies, resolved with Maven the
    first time (``marker``, one of the jars, says a resolution is complete).

    A lock serialises concurrent first runs (two test sessions, a test run and a CLI); the
    jars go in under a temporary name and are renamed into place whole, so an interrupted
    download is never taken for a complete one. Raises :class:`ArtifactMissing` when Central
    has no such artifact, RingmasterError for any other failure; ``what`` names the set."""
    libs = home / "libs"
    if resolved(home, marker):
        return libs
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if resolved(home, marker):
            return libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise RingmasterError(f"resolving {what} needs Maven and 'mvn' is not on PATH "
                                  "(Debian/Ubuntu: apt-get install maven)")
        deps = "\n".join(_DEPENDENCY.format(a=a) for a in artifacts)
        (home / "pom.xml").write_text(_POM.format(name=home.name, dependencies=deps))
        partial = home / "libs.partial"
        shutil.rmtree(partial, ignore_errors=True)
        done = subprocess.run(
            [mvn, "-B", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
             f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if done.returncode != 0:
            errors = [ln for ln in done.stdout.splitlines() if "ERROR" in ln] or done.stdout.splitlines()
            first = (errors or ["exit " + str(done.returncode)])[0].strip()
            # Maven says it both ways: the first time, and when it remembers an earlier miss.
            missing = "Could not find artifact" in first or "was not found in" in first
            error = ArtifactMissing if missing else RingmasterError
            raise error(f"resolving {what} with Maven failed: {first}")
        shutil.rmtree(libs, ignore_errors=True)
        partial.rename(libs)
        return libs
