"""The plugin on Spark against a three-node cluster: a broker killed in the middle of a job
changes nothing in what the job writes (issue 40). A backfill and a run to the end each read
their input while the leader of one of its partitions is killed and started again; each ends
with exit 0, every record's output written (Spark is at least once: a task run again writes its
outputs again, never fewer), and the run's group offsets committed to the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import ROOT, base_config, read_all, to_toml, unique, wait_for

from runtime.kafka.admin import create_topic

from .drive import NetCluster, heal
from .flow import SteadyInput, committed_now
from .who import Who

pytestmark = [pytest.mark.cluster, pytest.mark.spark, pytest.mark.timeout(900)]

PARTITIONS = 3
RECORDS = 9000
DOWN_S = 10.0


def _job(netcluster: NetCluster, names: dict[str, str], tmp: Path, *args: str) -> subprocess.Popen[str]:
    cfg = base_config(netcluster.bootstrap, names["in"], names["g"], tmp, settings={"sleep_ms": 3.0})
    cfg["workers"] = {"plugin": "probe", "settings": {"sleep_ms": 3.0}}
    cfg["output"] = {"topic": names["out"]}
    cfg["dead_letter"] = {"topic": names["dlq"]}
    cfg["spark"] = {"master": "local[2]", "trigger": "availableNow", "max_records_per_trigger": 1500,
                    "checkpoint_location": str(tmp / f"checkpoint-{args[1]}")}
    path = tmp / f"{args[1]}.toml"
    path.write_text(to_toml(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "plugins")]))
    return subprocess.Popen([sys.executable, "-m", "runtime.cli", *args, "-c", str(path)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("command", [("spark", "backfill", "--from", "earliest", "--to", "latest"),
                                     ("spark", "run", "--until-caught-up")], ids=["backfill", "run"])
def test_a_broker_killed_mid_job_changes_nothing_the_job_writes(
        command: tuple[str, ...], netcluster: NetCluster, tmp_path: Path) -> None:
    names = {k: unique(k) for k in ("in", "out", "dlq", "g")}
    for topic in names.values():
        if topic != names["g"]:
            create_topic(netcluster.props, topic, PARTITIONS, replication_factor=-1)
    source = SteadyInput(netcluster.props, names["in"], PARTITIONS, 8000.0)
    source.start()
    wait_for(lambda: source.sent >= RECORDS, 60, "the input written")
    source.finish()
    job = _job(netcluster, names, tmp_path, *command)
    try:
        # Once the job writes outputs, the leader of the input's partition 0 goes.
        wait_for(lambda: job.poll() is not None or _count(netcluster, names["out"]) >= RECORDS // 10, 300,
                 "the job at work")
        assert job.poll() is None, "the job ended before the fault: it needs a larger input"
        node = netcluster.cluster.node(Who(netcluster.props).leader_of(names["in"], 0))
        node.kill()
        time.sleep(DOWN_S)  # the fault's length, held on purpose
        node.start()
        _out, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate(timeout=30)
        heal(netcluster)
    assert job.returncode == 0, err[-4000:]
    written = {v.split(":")[-1] for v in source.values}
    read = read_all(netcluster.bootstrap, names["out"], timeout_s=120)
    outputs = [json.loads(m.value())["id"] for m in read]
    assert set(outputs) == written, f"{len(written - set(outputs))} records without an output"
    if command[1] == "run":
        assert committed_now(netcluster.props, names["g"], names["in"], PARTITIONS) == dict(source.counts)


def _count(netcluster: NetCluster, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({**netcluster.props, "group.id": unique("count"), "log_level": 2})
    try:
        total = 0
        for p in range(PARTITIONS):
            low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            total += max(0, high - max(low, 0))
        return total
    except Exception:  # a leader moving: counted again
        return 0
    finally:
        c.close()

