"""Changing a running daemon against the real broker: a plugin reload (``ringmaster reload``,
SIGHUP) and a resize (``ringmaster scale``, SIGTTIN/SIGTTOU) while records flow, in every
ordering mode. The supervisor is the group's only member, so none of this rebalances: nothing
is lost, nothing reordered within a partition or key, and the outputs of a partition (of a key)
show the new version from some offset on, never an old one after a new one. A reload whose new
code cannot start is rolled back and the daemon keeps its old code."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    Ringmaster,
    assert_runs_in_order,
    daemon_config,
    journal_with_keys,
    make_topics,
    produce_rows,
    read_all,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

V1, V2, V3 = "v1", "v2-second", "v3-third-one"  # lengths differ: no stale bytecode can pass for new
ORDER = {V1: 1, V2: 2, V3: 3}
VERSION_HEADER = "ringmaster.plugin.version"
PARTITIONS, KEYS = 3, 40
POISON_EVERY = 997  # a record the plugin raises on: its dead letter says which version failed it


def write_plugin(plugin_dir: Path, version: str, body: str = "") -> None:
    """The probe plugin (tests/plugins/probe.py) under another name and a version of its own."""
    (plugin_dir / "liveprobe.py").write_text(
        f"from probe import process, setup, teardown  # noqa: F401\n__version__ = {version!r}\n{body}")


def rows(start: int, n: int) -> list[tuple[bytes, bytes, None]]:
    out = []
    for i in range(start, start + n):
        value = f"raise:r{i}" if i % POISON_EVERY == POISON_EVERY - 1 else f"r{i}"
        out.append((f"k{i % KEYS}".encode(), value.encode(), None))
    return out


def good_ids(start: int, n: int) -> set[str]:
    return {f"r{i}" for i in range(start, start + n) if i % POISON_EVERY != POISON_EVERY - 1}


def start(broker: Any, names: dict[str, str], tmp_path: Path, partitions: int = PARTITIONS,
          **workers: Any) -> tuple[Ringmaster, Path]:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    write_plugin(plugin_dir, V1)
    make_topics(broker.bootstrap, partitions, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, journal=True, plugin="liveprobe", **workers)
    cfg["dead_letter"].update({"max_attempts": 1, "retry_backoff_s": 0.0})
    cfg["admin"] = {"librdkafka_stats_s": 0.2}  # the client's own rebalance count, in status
    rm = Ringmaster(cfg, tmp_path, env={"PYTHONDONTWRITEBYTECODE": "1"}, plugin_dirs=[plugin_dir])
    return rm, plugin_dir


def group_state(s: dict[str, Any]) -> tuple[int, int, list[Any]]:
    """What a rebalance would change: our callbacks, librdkafka's own count, revocations."""
    return s["rebalances"], int(s["librdkafka"].get("rebalances_total", -1)), s["revocations"]


Seqs = dict[Any, list[tuple[int, str]]]


def outputs_by_sequence(broker: Any, topic: str, ordering: str) -> tuple[Seqs, set[str]]:
    """(sequence -> [(input offset, version)] in offset order, ids): per partition, or per key in
    key ordering."""
    seqs: dict[Any, list[tuple[int, str]]] = defaultdict(list)
    ids = set()
    for m in read_all(broker.bootstrap, topic):
        body = json.loads(m.value())
        version = dict(m.headers() or [])[VERSION_HEADER].decode()
        name = (body["p"], m.key()) if ordering == "key" else body["p"]
        seqs[name].append((body["o"], version))
        ids.add(body["id"])
    return {k: sorted(v) for k, v in seqs.items()}, ids


def assert_versions_never_go_back(seqs: Seqs) -> None:
    for name, seq in seqs.items():
        ranks = [ORDER[v] for _, v in seq]
        assert ranks == sorted(ranks), f"{name}: an old version after a new one: {_changes(seq)}"


def _changes(seq: list[tuple[int, str]]) -> list[tuple[int, str]]:
    return [(o, v) for i, (o, v) in enumerate(seq) if i == 0 or v != seq[i - 1][1]][:20]


def assert_order(tmp_path: Path, ordering: str) -> None:
    """Each record processed once (no fault here redelivers anything), in order per partition
    (per key in key ordering); unordered: once each."""
    rows_ = journal_with_keys(tmp_path / "journal")
    if ordering == "unordered":
        seen = [(part, off) for _ns, part, off, _pid, _key in rows_]
        assert len(seen) == len(set(seen)), "a record processed twice"
        return
    seqs: dict[Any, list[tuple[int, int]]] = defaultdict(list)
    for _ns, part, off, pid, key in rows_:
        seqs[(part, key) if ordering == "key" else part].append((off, pid))
    assert_runs_in_order(seqs, exact=True)


@pytest.mark.parametrize(("ordering", "start_method"), [
    ("partition", "spawn"), ("key", "spawn"), ("unordered", "spawn"), ("partition", "forkserver")])
def test_two_reloads_under_load_replace_every_worker_without_a_rebalance(
        broker: Any, names: dict[str, str], tmp_path: Path, ordering: str, start_method: str) -> None:
    """A reload with `ringmaster reload`, then another with SIGHUP, while a backlog is being
    processed; then more records, which only the newest version may touch. Under forkserver too:
    the fork server must not hold on to the old module."""
    # 9,000 records of 2.5 ms on 2 workers are ~11 s of work: a backlog for a reload that takes
    # a few seconds.
    rm, plugin_dir = start(broker, names, tmp_path, ordering=ordering, start_method=start_method,
                           settings={"sleep_ms": 2.5})
    try:
        produce_rows(broker.bootstrap, names["in"], rows(0, 9000), PARTITIONS)
        before = rm.wait_status(lambda s: s["records"] >= 800 and s["librdkafka"], 90, "progress")
        assert before["plugin_version"] == V1 and before["workers_max"] == 2
        group = group_state(before)
        assert group[0] >= 1 and group[1] >= 1, "the join counted: the check below can see a rebalance"

        write_plugin(plugin_dir, V2)
        # Under load: a backlog when the reload is asked for, worked on while it runs. Whether
        # any of it is left when the reload has finished depends on the broker and the
        # machine (on Apache Kafka, one run of the four had none left), so that is not asked.
        asked = rm.status()
        assert asked and asked["lag"] > 0, "a backlog when the reload is asked for"
        r = rm.command("reload", "--timeout", "100")
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"reloaded: 2 workers run plugin 'liveprobe' version {V2} (was {V1})"
        s = rm.wait_status(lambda s: s["reload"] and s["reload"]["state"] == "succeeded", 30, "the status")
        assert s["plugin_version"] == V2 and {w["plugin_version"] for w in s["workers"]} == {V2}
        assert s["records"] > asked["records"], "records were processed while the reload ran"

        write_plugin(plugin_dir, V3)
        rm.proc.send_signal(signal.SIGHUP)
        # The backlog may be over by now: the new code's canary waits for a batch before it
        # replaces the old workers (issue 28), so a few records come for it.
        produce_rows(broker.bootstrap, names["in"], rows(9000, 300), PARTITIONS)
        s = rm.wait_status(lambda s: s["plugin_version"] == V3 and s["reload"]["state"] == "succeeded"
                           and s["reload"]["requested_by"] == "SIGHUP", 100, "the SIGHUP reload")
        assert {w["plugin_version"] for w in s["workers"]} == {V3} and len(s["workers"]) == 2
        produce_rows(broker.bootstrap, names["in"], rows(9300, 2700), PARTITIONS)
        s = rm.wait_status(lambda s: s["records"] >= 12000 and not s["dead_letters_waiting"], 120,
                           "every record")
        assert group_state(s) == group, "no rebalance: the group never saw the reloads"
        assert s["restarts"] == 0, "replacing a worker is not a restart"
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    assert rm.socket_path is not None and not rm.socket_path.exists(), "the control socket is gone"

    seqs, ids = outputs_by_sequence(broker, names["out"], ordering)
    assert ids == good_ids(0, 12000), "nothing lost"
    assert_versions_never_go_back(seqs)
    versions = {v for seq in seqs.values() for _, v in seq}
    assert versions == {V1, V2, V3} or versions == {V1, V3}, versions
    after = [m for m in read_all(broker.bootstrap, names["out"])
             if int(json.loads(m.value())["id"][1:]) >= 9300]
    assert after and all(dict(m.headers())[VERSION_HEADER].decode() == V3 for m in after), \
        "records produced after the last reload: the newest version only"
    letters = read_all(broker.bootstrap, names["dlq"])
    assert len(letters) == 12000 // POISON_EVERY
    assert all(dict(m.headers())[VERSION_HEADER].decode() in ORDER for m in letters)
    assert_order(tmp_path, ordering)


@pytest.mark.parametrize("failure", ["setup raises", "crashes on its first batch", "does not import",
                                     "the config is invalid"])
def test_a_reload_whose_new_code_cannot_start_is_rolled_back_and_the_old_code_goes_on(
        broker: Any, names: dict[str, str], tmp_path: Path, failure: str) -> None:
    rm, plugin_dir = start(broker, names, tmp_path, settings={"sleep_ms": 1.0})
    try:
        produce_rows(broker.bootstrap, names["in"], rows(0, 6000), PARTITIONS)
        before = rm.wait_status(lambda s: s["records"] >= 500 and s["librdkafka"], 90, "progress")
        old_pids = {w["pid"] for w in before["workers"]}
        body, why = {
            "setup raises": ("def setup(context):\n    raise RuntimeError('model file missing')\n",
                             "RuntimeError: model file missing"),
            "crashes on its first batch": ("import os\ndef process(batch):\n    os._exit(13)\n",
                                           "exited with status 13"),
            "does not import": ("import no_such_dependency_of_the_plugin\n",
                                "no_such_dependency_of_the_plugin"),
            "the config is invalid": ("", "workers.batch_max_records: Input should be greater than or equal"),
        }[failure]
        write_plugin(plugin_dir, V2, body)
        if failure == "the config is invalid":
            # The command reads the same file: it says what is wrong (exit 2) and sends nothing;
            # SIGHUP makes the daemon read it, and the reload fails the same way.
            good_config = rm.config_path.read_text()
            rm.config_path.write_text(good_config.replace('"plugin" = "liveprobe"',
                                                          '"plugin" = "liveprobe"\n"batch_max_records" = 0'))
            r = rm.command("reload", "--timeout", "100")
            assert r.returncode == 2 and why in r.stderr and r.stderr.count("\n") == 1, r.stderr
            rm.proc.send_signal(signal.SIGHUP)
            s = rm.wait_status(lambda s: s["reload"] and s["reload"]["state"] == "failed", 30, "the status")
            rm.config_path.write_text(good_config)
            assert s["reload"]["message"].startswith("the config cannot be used, nothing changed: config '")
            assert why in s["reload"]["message"]
        else:
            r = rm.command("reload", "--timeout", "100")
            assert r.returncode == 10, (r.stdout, r.stderr)
            line = r.stderr.strip()
            assert "\n" not in line and why in line, line
            assert line.startswith("ringmaster: error: the new plugin code cannot start")
            assert f"rolled back: the daemon keeps plugin 'liveprobe' version {V1}" in line
        s = rm.wait_status(lambda s: s["reload"] and s["reload"]["state"] == "failed", 30, "the status")
        assert s["plugin_version"] == V1 and {w["plugin_version"] for w in s["workers"]} == {V1}
        assert {w["pid"] for w in s["workers"]} == old_pids, "the old workers never stopped"
        status = rm.command("reload", "--status")
        assert status.returncode == 10 and "last reload failed" in status.stdout

        s = rm.wait_status(lambda s: s["records"] >= 6000 and not s["dead_letters_waiting"], 120,
                           "every record")
        assert group_state(s) == group_state(before), "no rebalance"
        assert s["restarts"] == 0 and s["dead_letters"] == 6000 // POISON_EVERY, "no record was blamed"
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    seqs, ids = outputs_by_sequence(broker, names["out"], "partition")
    assert ids == good_ids(0, 6000)
    assert {v for seq in seqs.values() for _, v in seq} == {V1}, "the daemon kept its old code"
    assert_order(tmp_path, "partition")


@pytest.mark.parametrize("ordering", ["partition", "key", "unordered"])
def test_resizing_up_and_down_under_load_loses_nothing_and_leaves_nothing(
        broker: Any, names: dict[str, str], tmp_path: Path, ordering: str) -> None:
    rm, _plugin_dir = start(broker, names, tmp_path, partitions=6, ordering=ordering, max_processes=4,
                            settings={"sleep_ms": 1.0})
    try:
        produce_rows(broker.bootstrap, names["in"], rows(0, 9000), 6)
        before = rm.wait_status(lambda s: s["records"] >= 500 and s["librdkafka"], 90, "progress")

        r = rm.command("scale", "--processes", "4", "--timeout", "100")
        assert (r.returncode, r.stdout.strip()) == (0, "resized from 2 to 4 workers"), r.stderr
        s = rm.wait_status(lambda s: len(s["workers"]) == 4 and s["workers_target"] == 4, 30, "4 workers")
        added = {w["index"] for w in s["workers"]} - {w["index"] for w in before["workers"]}
        rm.wait_status(lambda s: all(w["records"] > 0 for w in s["workers"] if w["index"] in added), 60,
                       "the new workers to take work")

        os.kill(rm.proc.pid, signal.SIGTTOU)
        rm.wait_status(lambda s: s["workers_target"] == 3 and len(s["workers"]) == 3
                       and s["scale"]["state"] == "succeeded", 60, "SIGTTOU: one worker fewer")
        os.kill(rm.proc.pid, signal.SIGTTIN)
        rm.wait_status(lambda s: s["workers_target"] == 4 and len(s["workers"]) == 4
                       and s["scale"]["state"] == "succeeded", 60, "SIGTTIN: one worker more")
        r = rm.command("scale", "-n", "-2", "--timeout", "100")
        assert (r.returncode, r.stdout.strip()) == (0, "resized from 4 to 2 workers"), r.stderr
        r = rm.command("scale", "-n", "5")
        assert r.returncode == 10 and r.stderr.count("\n") == 1, r.stderr
        assert "cannot run 5 workers: workers.max_processes is 4" in r.stderr

        s = rm.wait_status(lambda s: s["records"] >= 9000 and not s["dead_letters_waiting"], 120,
                           "every record")
        assert len(s["workers"]) == 2 and group_state(s) == group_state(before), "no rebalance"
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    _seqs, ids = outputs_by_sequence(broker, names["out"], ordering)
    assert ids == good_ids(0, 9000), "nothing lost"
    assert_order(tmp_path, ordering)
