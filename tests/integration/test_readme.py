"""The README's "Your own plugin in five minutes", run as written: its shell blocks and its
files, in README order, as one bash script (`set -euo pipefail`), from the repository root
with a fresh HOME. One substitution, here and nowhere else: the README's port
(README_PORT) becomes a free one, so a broker already on 9092 cannot interfere. The daemon's
shared memory goes to this session's directory through an environment override (the README
text is untouched). What the `tail`s print must be what the README shows it prints."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import ROOT, SHM_DIR

from runtime.ops.devbroker import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

README_PORT = "9092"
SECTION = "## Your own plugin in five minutes"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
FILE_NAME = re.compile(r"^`([\w.-]+)`[^`\n]*:\s*$")


def section(text: str) -> str:
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end != -1 else len(text)]


def parts(text: str) -> list[tuple[str, str | None, str]]:
    """(language, file name or None, body) of each fenced block, in order. A file's name is
    the `name` that opens the paragraph line right before its block."""
    out = []
    for m in FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").splitlines()
        named = FILE_NAME.match(before[-1]) if before else None
        out.append((m.group(1), named.group(1) if named else None, m.group(2)))
    return out


def build(text: str, port: str) -> tuple[str, list[str]]:
    """The bash script the section amounts to, and the output lines it promises."""
    # The harness's own line: a step that fails ends the session, and what it started in the
    # background goes with it (else the broker would hold the output open until the timeout).
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    expected: list[str] = []
    for lang, name, body in parts(text):
        if lang == "bash":
            script.append(body.replace(README_PORT, port))
        elif name is not None:
            assert "RINGMASTER_README_EOF" not in body
            body = body.replace(README_PORT, port)
            script.append(f"cat > {name} <<'RINGMASTER_README_EOF'\n{body}RINGMASTER_README_EOF")
        elif lang == "text":
            expected.extend(line for line in body.splitlines() if line.strip())
    return "\n".join(script) + "\n", expected


def test_the_readme_section_is_a_whole_session() -> None:
    """What the run below relies on is really in the README text (else it could pass on an
    empty section)."""
    text = section((ROOT / "README.md").read_text())
    blocks = parts(text)
    files = {name: lang for lang, name, _ in blocks if name}
    assert files.get("upper.py") == "python" and files.get("hello.toml") == "toml", files
    shell = "\n".join(body for lang, _, body in blocks if lang == "bash")
    for command in (f"ringmaster broker --port {README_PORT}", "ringmaster check", "ringmaster produce",
                    "ringmaster run", "ringmaster tail"):
        assert command in shell, f"the section no longer runs `{command}`"
    assert f"127.0.0.1:{README_PORT}" in text, "the config points at the broker the section starts"
    _, expected = build(text, "1")
    assert len(expected) >= 3, "the section shows what the commands print"


def test_the_readme_section_runs_as_written(tmp_path: Path) -> None:
    text = section((ROOT / "README.md").read_text())
    script, expected = build(text, str(free_port()))
    (tmp_path / "readme.sh").write_text(script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGMASTER__", "VIRTUAL_ENV"))}
    env.update(HOME=str(tmp_path / "home"), RINGMASTER__SUPERVISOR__SHM_DIR=str(SHM_DIR))
    (tmp_path / "home").mkdir()
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(tmp_path / "readme.sh")], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the README's session did not finish in 240 s:\n{err[-3000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):  # whatever the script left running
            os.killpg(proc.pid, signal.SIGKILL)
    took = time.monotonic() - t0
    print(f"README five-minute session: {took:.1f} s")
    assert proc.returncode == 0, f"exit {proc.returncode}\n{err[-3000:]}"
    assert sorted(out.splitlines()) == sorted(expected), \
        f"printed:\n{out}\nREADME shows:\n{expected}\n{err[-2000:]}"
    assert (tmp_path / "home" / "hello" / "upper.py").exists(), "the files went where the README says"
    assert "supervisor stopped" in err, err[-2000:]
