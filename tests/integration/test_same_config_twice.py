"""The same config started twice on one host (issue 24.3): both daemons run as members of
the group, each on a control socket of its own (the second pid-named beside the first), and
the operator's commands reach both and say which answered what. Only the first serves the
config's status file and admin endpoint (runtime/ops/control_socket.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import SOCK_DIR, Ringmaster, daemon_config, make_topics, produce, read_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_same_config_twice_on_one_host_just_works_and_commands_reach_both(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    cfg = daemon_config(broker, names, tmp_path, processes=1)
    sock = SOCK_DIR / f"{names['group']}.sock"
    cfg["supervisor"]["control_socket"] = str(sock)
    status = tmp_path / "status.json"
    first = Ringmaster(cfg, tmp_path, name="first", status_path=status)
    second: Ringmaster | None = None
    try:
        first.wait_status(lambda s: s["partitions"], 60, "the first daemon's partitions")
        second = Ringmaster(cfg, tmp_path, name="second", status_path=status)
        assert first.config_path.read_text() == second.config_path.read_text(), "the same config"
        wait_for(lambda: "another daemon of this group runs on this host" in second.log_tail(), 60,
                 "the second daemon to start beside the first")
        ids = [f"r{i}" for i in range(400)]
        produce(broker.bootstrap, names["in"], ids, 4)
        got = {json.loads(m.value())["id"] for m in read_topic(broker.bootstrap, names["out"], len(ids))}
        assert got == set(ids)
        assert first.proc.poll() is None and second.proc.poll() is None, "both run"

        # A reload's canary must finish a real batch before the old workers go (an idle reload
        # proves only that the code imports): records keep coming while both daemons reload.
        stop = threading.Event()

        def trickle() -> None:
            n = 0
            while not stop.wait(0.2) and n < 2000:
                produce(broker.bootstrap, names["in"], [f"t{n + i}" for i in range(4)], 4)
                n += 4

        feeder = threading.Thread(target=trickle, daemon=True)
        feeder.start()
        try:
            r = first.command("reload", "--timeout", "100")
        finally:
            stop.set()
            feeder.join()
        assert r.returncode == 0, (r.stdout, r.stderr)
        lines = r.stdout.strip().splitlines()
        second_sock = SOCK_DIR / f"{names['group']}.{second.proc.pid}.sock"
        assert [line.split(": ", 1)[0] for line in lines] == [str(sock), str(second_sock)], lines
        assert all("reloaded" in line for line in lines), lines

        r = first.command("status")
        assert r.returncode == 0, r.stderr
        assert "2 daemons of this group on this host" in r.stdout and str(second_sock) in r.stdout
        assert second.terminate() == 0, second.log_tail()
        assert not second_sock.exists()
        assert first.terminate() == 0, first.log_tail()
    finally:
        first.close()
        if second is not None:
            second.close()
