"""A rolled-back reload holds (issue 29.9): the files on disk are the code that just failed,
yet every worker started afterwards – a restart after a crash, one more from ``scale`` – runs
the last good generation, from the copy of its source the daemon took when that generation
started (runtime/supervisor/workers/snapshots.py). Real daemon, real broker, real files."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers import Ringmaster, daemon_config, make_topics, produce, read_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

V1, V2 = "v1-good", "v2-broken"
VERSION_HEADER = "ringmaster.plugin.version"


def write_plugin(plugin_dir: Path, version: str, body: str = "") -> None:
    (plugin_dir / "heldprobe.py").write_text(
        f"from probe import process, setup, teardown  # noqa: F401\n__version__ = {version!r}\n{body}")


def running(s: dict[str, Any]) -> list[Any]:
    """The workers that are up and said which plugin version they run."""
    return [w for w in s["workers"] if w["alive"] and w["plugin_version"]]


def versions_of_outputs(broker: Any, topic: str) -> set[str]:
    return {dict(m.headers() or [])[VERSION_HEADER].decode() for m in read_all(broker.bootstrap, topic)}


def test_workers_started_after_a_rolled_back_reload_run_the_last_good_code(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    write_plugin(plugin_dir, V1)
    make_topics(broker.bootstrap, 2, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, plugin="heldprobe", processes=2, max_processes=4)
    rm = Ringmaster(cfg, tmp_path, env={"PYTHONDONTWRITEBYTECODE": "1"}, plugin_dirs=[plugin_dir])
    try:
        produce(broker.bootstrap, names["in"], [f"a{i}" for i in range(200)], 2)
        rm.wait_status(lambda s: s["records"] >= 200 and all(w["alive"] for w in s["workers"]), 90,
                       "the first records")
        write_plugin(plugin_dir, V2, "def setup(context):\n    raise RuntimeError('broken release')\n")
        r = rm.command("reload", "--timeout", "100")
        assert r.returncode == 10, (r.stdout, r.stderr)
        assert f"rolled back: the daemon keeps plugin 'heldprobe' version {V1}" in r.stderr
        assert "from the copy of its source" in r.stderr, r.stderr

        # A crash: the worker that replaces it imports the plugin again, with V2 on disk.
        before = rm.wait_status(lambda s: all(w["alive"] for w in s["workers"]), 30, "the workers")
        victim = before["workers"][0]["pid"]
        os.kill(victim, signal.SIGKILL)
        pids = lambda s: [w["pid"] for w in running(s)]  # noqa: E731
        after = rm.wait_status(lambda s: len(pids(s)) == 2 and victim not in pids(s), 60, "its replacement")
        assert {w["plugin_version"] for w in after["workers"]} == {V1}, after["workers"]

        # One more worker: the same.
        r = rm.command("scale", "-n", "+1", "--timeout", "100")
        assert r.returncode == 0, (r.stdout, r.stderr)
        s = rm.wait_status(lambda s: len(running(s)) == 3, 60, "three workers")
        assert {w["plugin_version"] for w in s["workers"]} == {V1}, s["workers"]

        produce(broker.bootstrap, names["in"], [f"b{i}" for i in range(200)], 2)
        s = rm.wait_status(lambda s: s["records"] >= 400, 90, "the records after the rollback")
        assert s["plugin_version"] == V1 and s["dead_letters"] == 0
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    assert versions_of_outputs(broker, names["out"]) == {V1}, "no output of the broken code"
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob(f"ringmaster-plugin-{rm.proc.pid}-*")), \
        "the copies are removed at exit"
