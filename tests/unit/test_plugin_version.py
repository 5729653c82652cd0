"""The plugin's version (runtime/plugin.py plugin_version): what status, /metrics and the
ringmaster.plugin.version header show; and the header on what a worker writes."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.execution.deadletter_format import dead_letter_headers
from runtime.plugin import VERSION_HEADER, plugin_version
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec


@pytest.fixture
def importable(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in set(sys.modules) - before:
        del sys.modules[name]


def load(name: str) -> str:
    importlib.invalidate_caches()
    for mod in [m for m in sys.modules if m == name or m.startswith(name.split(".")[0] + ".")
                or m == name.split(".")[0]]:
        del sys.modules[mod]
    importlib.import_module(name)
    return plugin_version(name)


def test_a_declared_version_wins(importable: Path) -> None:
    (importable / "pv_declared.py").write_text('__version__ = "2.4.1"\ndef process(b): return None\n')
    assert load("pv_declared") == "2.4.1"


def test_without_one_the_source_is_hashed_and_any_change_is_a_new_version(importable: Path) -> None:
    f = importable / "pv_hashed.py"
    f.write_text("def process(b): return None\n")
    first = load("pv_hashed")
    assert len(first) == 12 and int(first, 16) >= 0
    assert load("pv_hashed") == first, "the same source, the same version"
    f.write_text("def process(b): return []\n")
    assert load("pv_hashed") != first


def test_a_plugin_in_a_package_changes_version_when_any_file_of_the_package_does(importable: Path) -> None:
    pkg = importable / "pvpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "plugin.py").write_text("from pvpkg.helpers import f\ndef process(b): return None\n")
    (pkg / "helpers.py").write_text("def f(): return 1\n")
    first = load("pvpkg.plugin")
    (pkg / "helpers.py").write_text("def f(): return 2\n")
    assert load("pvpkg.plugin") != first, "a helper module changed"
    (pkg / "__init__.py").write_text('__version__ = "7.0"\n')
    assert load("pvpkg.plugin") == "7.0", "the package's own version, when the module has none"


def test_a_module_without_a_readable_source_is_unknown_not_an_error() -> None:
    assert plugin_version("sys") == "unknown"
    assert plugin_version("never_imported_module") == "unknown"


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    def produce(self, topic: str, value: Any, key: Any, headers: Any, queue_wait_s: float) -> None:
        self.sent.append(list(headers or []))

    def deliver(self, timeout_s: float, beat: Any) -> None:
        pass


def test_every_output_carries_the_version_unless_the_plugin_set_the_header_itself() -> None:
    from runtime.plugin import Output

    spec = WorkerSpec(0, 1, "/seg", "/epochs", "p", {}, "out", None, {}, 1, 0.0, 0.0, 1)
    board = type("Board", (), {"beat": lambda _s: None})()
    runner = BatchRunner(None, spec, board, FakeProducer(), "v9")  # type: ignore[arg-type]
    runner._deliver([Output(b"a"), Output(b"b", headers=[("trace", b"1")]),
                     Output(b"c", headers=[(VERSION_HEADER, b"mine")]), Output(b"d", headers=[])])
    sent = runner.producer.sent  # type: ignore[attr-defined]
    assert sent == [[(VERSION_HEADER, b"v9")], [("trace", b"1"), (VERSION_HEADER, b"v9")],
                    [(VERSION_HEADER, b"mine")], [(VERSION_HEADER, b"v9")]]


def test_a_dead_letter_says_which_version_failed_the_record() -> None:
    headers = dict(dead_letter_headers([("ringmaster.plugin.version", b"upstream")], error_type="E",
                                       message="m", traceback="", topic="t", partition=0, offset=1,
                                       attempts=1, worker="w", plugin_version="v9"))
    assert headers[VERSION_HEADER] == b"v9"
