"""The README's "Your own plugin in five minutes", run as written: its shell blocks and its
files, in README order, as one bash script (`set -euo pipefail`), from the repository root
with a fresh HOME. One substitution, here and nowhere else: the README's port
(README_PORT) becomes a free one, so a broker already on 9092 cannot interfere. The daemon's
shared memory goes to this session's directory through an environment override (the README
text is untouched). What the `tail`s print must be what the README shows it prints.

The same section also runs against the wheel `scripts/build` makes, installed into a fresh
virtualenv as the README's install section says (marked `package`: it needs PyPI for the
dependencies, and runs in `./scripts/test --all`, which is what CI runs): the one more
substitution is that virtualenv's activation for the clone's, and the session runs outside
the clone, so nothing of the repository can be imported by accident. The plugin's unit test
of the section then runs with that install's pytest and `runtime.testing`."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, SHM_DIR

from runtime.dev.tansu import free_port

pytestmark = [pytest.mark.integration, pytest.mark.tansu, pytest.mark.timeout(300)]

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


ACTIVATE = ". .venv/bin/activate"


def test_the_readme_section_runs_as_written(tmp_path: Path) -> None:
    text = section((ROOT / "README.md").read_text())
    script, expected = build(text, str(free_port()))
    out, err = run_session(tmp_path, script, ROOT)
    assert sorted(out.splitlines()) == sorted(expected), \
        f"printed:\n{out}\nREADME shows:\n{expected}\n{err[-2000:]}"
    assert (tmp_path / "home" / "hello" / "upper.py").exists(), "the files went where the README says"
    assert "supervisor stopped" in err, err[-2000:]


def run_session(tmp_path: Path, script: str, cwd: Path) -> tuple[str, str]:
    """Run the section's script with a fresh HOME; its stdout and stderr."""
    (tmp_path / "readme.sh").write_text(script)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RINGMASTER__", "VIRTUAL_ENV", "PYTHONPATH"))}
    env.update(HOME=str(tmp_path / "home"), RINGMASTER__SUPERVISOR__SHM_DIR=str(SHM_DIR))
    (tmp_path / "home").mkdir()
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", str(tmp_path / "readme.sh")], cwd=cwd, env=env, text=True,
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
    return out, err


@pytest.mark.package
@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_readme_section_runs_against_the_built_wheel_in_a_fresh_virtualenv(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    assert "./scripts/build" in readme and "pip install" in readme, "the README says how to install"
    built = subprocess.run([str(ROOT / "scripts" / "build"), str(tmp_path / "dist")], cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel = Path(built.stdout.split()[-1])
    assert wheel.suffix == ".whl" and wheel.exists(), built.stdout
    fresh = tmp_path / "fresh"
    base_python = getattr(sys, "_base_executable", sys.executable)  # not this virtualenv's
    subprocess.run([base_python, "-m", "venv", str(fresh)], check=True, timeout=120)
    pip = subprocess.run([str(fresh / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", f"{wheel}[demo]", "pytest"],
                         capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    outside = tmp_path / "elsewhere"  # no `runtime` in the working directory to shadow the install
    outside.mkdir()
    probe = subprocess.run(
        [str(fresh / "bin" / "python"), "-c",
         "import runtime, runtime.transport.speedups as s; print(runtime.__file__); print(s.native_status)"],
        cwd=outside, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    where, status = probe.stdout.split()
    assert Path(where).is_relative_to(fresh), f"imported from {where}, not the fresh install"
    assert status == "built", f"the wheel's C speedups: {status}"

    text = section(readme)
    assert ACTIVATE in text, "the section activates the clone's .venv: the one substitution below"
    script, expected = build(text.replace(ACTIVATE, f". {fresh}/bin/activate"), str(free_port()))
    script = script.replace("set -euo pipefail\n", f"set -euo pipefail\ncd {outside}\n", 1)
    out, err = run_session(tmp_path, script, outside)
    assert sorted(out.splitlines()) == sorted(expected), \
        f"printed:\n{out}\nREADME shows:\n{expected}\n{err[-2000:]}"
    assert "frame_packer=C" in err and "C speedups are off" not in err, err[-2000:]
    hello = tmp_path / "home" / "hello"
    unit = subprocess.run([str(fresh / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "test_upper.py"], cwd=hello, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home")})
    assert unit.returncode == 0 and "1 passed" in unit.stdout, unit.stdout + unit.stderr
