"""``ringmaster run --members N`` with real processes against the broker (issue 24.3): the
members share the group's partitions and one worker budget, every record is processed once
and committed, a signal to the parent stops them all, a member's death stops the rest with
its status, ``--until-caught-up`` exits 0 only when every member caught up, and nothing is
left behind (no member or worker process, segment or control socket)."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
from helpers import (
    Ringmaster,
    committed,
    daemon_config,
    journal,
    make_topics,
    produce,
    read_topic,
    shm_segments,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def member_procs(rm: Ringmaster) -> list[psutil.Process]:
    try:
        return psutil.Process(rm.proc.pid).children()
    except psutil.NoSuchProcess:
        return []


def sockets(rm: Ringmaster) -> list[str]:
    assert rm.socket_path is not None
    stem = rm.socket_path.stem
    return sorted(p.name for p in rm.socket_path.parent.iterdir() if p.name.startswith(stem))


def wait_members_listening(rm: Ringmaster, n: int) -> list[psutil.Process]:
    """Each member's control socket: a member has its consumer and workers once it listens."""
    wait_for(lambda: rm.proc.poll() is None and len(member_procs(rm)) == n and len(sockets(rm)) == n, 120,
             f"{n} members listening")
    return member_procs(rm)


def close(rm: Ringmaster) -> None:
    """The fixture's teardown, and the segments of members it killed on a failure."""
    members = [p.pid for p in member_procs(rm)]
    rm.close()
    for pid in members:
        for name in shm_segments(rm.shm_dir, pid):
            (rm.shm_dir / name).unlink(missing_ok=True)


def assert_nothing_left(rm: Ringmaster, pids: list[int]) -> None:
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"], \
        "a member or worker outlived the parent"
    assert sockets(rm) == [], "a control socket left behind"
    for pid in pids:
        assert shm_segments(rm.shm_dir, pid) == [], f"segments of {pid} left behind"


def test_two_members_share_the_partitions_process_each_record_once_and_stop_together(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, journal=True, processes=2)
    rm = Ringmaster(cfg, tmp_path, args=["--members", "2"])
    try:
        procs = wait_members_listening(rm, 2)
        # Member 0 has the status file; once it holds 2 of the 4 partitions the group settled.
        rm.wait_status(lambda s: len(s["partitions"]) == 2, 120, "member 0 to hold half the partitions")
        ids = [f"r{i}" for i in range(400)]
        ends = produce(broker.bootstrap, names["in"], ids, 4)
        out = read_topic(broker.bootstrap, names["out"], len(ids))
        got = Counter(json.loads(m.value())["id"] for m in out)
        assert set(got) == set(ids)
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 4) == ends, 60,
                 "every partition committed to its end")
        rows = journal(tmp_path / "journal")
        workers = {w.pid: m.pid for m in procs for w in m.children(recursive=True)}
        done = Counter((part, off) for _, part, off, _ in rows)
        assert len(done) == len(ids) and set(done.values()) == {1}, "each record processed once"
        by_member: dict[int, set[int]] = {}
        for _, part, _, pid in rows:
            by_member.setdefault(workers[pid], set()).add(part)
        assert len(by_member) == 2, f"both members processed records: {by_member}"
        a, b = by_member.values()
        assert not a & b and a | b == {0, 1, 2, 3}

        r = rm.command("status")
        assert r.returncode == 0, r.stderr
        assert "2 daemons of this group on this host" in r.stdout, r.stdout

        pids = [m.pid for m in procs] + list(workers)
        assert rm.terminate() == 0, rm.log_tail()
        assert_nothing_left(rm, pids)
    finally:
        close(rm)


def test_a_member_killed_stops_the_others_and_the_parent_exits_with_its_status(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, processes=2)
    rm = Ringmaster(cfg, tmp_path, args=["--members", "2"])
    try:
        procs = wait_members_listening(rm, 2)
        pids = [m.pid for m in procs] + [w.pid for m in procs for w in m.children(recursive=True)]
        procs[1].kill()
        assert rm.wait(120) == 128 + signal.SIGKILL, rm.log_tail()
        assert "member exited" in rm.log_tail(200) and "stopping every member" in rm.log_tail(200)
        wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)], 30,
                 "the killed member's workers to go")
        assert_nothing_left(rm, pids)
    finally:
        close(rm)


def test_until_caught_up_with_members_exits_0_once_every_member_caught_up(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    ids = [f"r{i}" for i in range(600)]
    ends = produce(broker.bootstrap, names["in"], ids, 4)
    cfg = daemon_config(broker, names, tmp_path, processes=2)
    summary = tmp_path / "summary.json"
    rm = Ringmaster(cfg, tmp_path,
                    args=["--members", "2", "--until-caught-up", "--summary-json", str(summary)])
    try:
        assert rm.wait(240) == 0, rm.log_tail()
        assert committed(broker.bootstrap, names["group"], names["in"], 4) == ends
        got = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], len(ids))}
        assert got == set(ids)
        doc = json.loads(summary.read_text())
        assert len(doc["members"]) == 2 and all(d is not None for d in doc["members"])
        assert sockets(rm) == []
    finally:
        close(rm)


def test_the_parent_killed_its_members_stop_gracefully_and_leave_nothing(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, processes=2)
    rm = Ringmaster(cfg, tmp_path, args=["--members", "2"])
    try:
        procs = wait_members_listening(rm, 2)
        pids = [m.pid for m in procs] + [w.pid for m in procs for w in m.children(recursive=True)]
        rm.kill()  # SIGKILL: the parent forwards nothing; PR_SET_PDEATHSIG stops each member
        wait_for(lambda: not [p for p in pids if psutil.pid_exists(p)], 90, "every member and worker to go")
        assert rm.log_tail(200).count("stop requested signal=SIGTERM") == 2, rm.log_tail(200)
        assert_nothing_left(rm, pids)  # each member stopped gracefully: its segments and socket gone
    finally:
        close(rm)
