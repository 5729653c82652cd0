"""Coverage-guided fuzzing of one target of tests/fuzz/targets.py with atheris (libFuzzer).

    python -m tests.fuzz.run TARGET CORPUS_DIR [libFuzzer flags, e.g. -max_total_time=60]

Python code is instrumented (atheris.instrument_imports); the C extension too when
RINGMASTER_FUZZ_SPEEDUPS names a build of it made with ``clang -fsanitize=fuzzer-no-link``
(scripts/fuzz makes one when clang is there, and preloads atheris's libFuzzer, whose
symbols that build needs): it is loaded in place of the installed one.
Runs in: a developer's shell (scripts/fuzz), never in the default test run.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import atheris


def _load_instrumented_extension() -> None:
    path = os.environ.get("RINGMASTER_FUZZ_SPEEDUPS")
    if not path:
        return
    spec = importlib.util.spec_from_file_location("runtime.transport._speedups", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["runtime.transport._speedups"] = module


def main() -> None:
    target_name = sys.argv.pop(1)
    _load_instrumented_extension()
    with atheris.instrument_imports(include=["runtime", "tests.fuzz.targets"]):
        from tests.fuzz.targets import TARGETS
    # libFuzzer's -merge runs argv[0] again as a program: scripts/fuzz names a wrapper that
    # does (this file, run as a module, cannot be one).
    sys.argv[0] = os.environ.get("RINGMASTER_FUZZ_SELF", sys.argv[0])
    atheris.Setup(sys.argv, TARGETS[target_name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
