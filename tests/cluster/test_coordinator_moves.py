"""A batch run's read of the group's committed offsets while the group coordinator moves
(runtime/kafka/group_committed.py). Read with an admin client's ListConsumerGroupOffsets, a
NOT_COORDINATOR answer crashed the process with SIGSEGV (librdkafka#5040); read through a
consumer's committed(), asked again while the coordinator moves, it is answered.

The reads run in a child process, so that a crash fails this test instead of ending the session.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import ROOT, unique, wait_for

from runtime.kafka.admin import create_topic

from .drive import NetCluster, heal
from .who import Who

pytestmark = [pytest.mark.cluster, pytest.mark.cluster_ci, pytest.mark.timeout(300)]

READER = """
import json, sys, time
from runtime.kafka.group_committed import GroupCommitted
props, topic, seconds = json.loads(sys.argv[1]), sys.argv[2], float(sys.argv[3])
reader = GroupCommitted(props, timeout_s=20.0)
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        answer = reader.find([topic], [], stable=len(sys.argv) > 4, timeout_s=20.0)
        print(json.dumps({"t": time.monotonic(), "offsets": sorted(answer.offsets.items()),
                          "refused": sorted(answer.refused)}), flush=True)
    except Exception as exc:
        print(json.dumps({"t": time.monotonic(), "error": str(exc)}), flush=True)
"""


@pytest.mark.parametrize("stable", [False, True], ids=["committed", "stable"])
def test_the_groups_committed_offsets_are_answered_while_its_coordinator_moves(
        stable: bool, netcluster: NetCluster, tmp_path: Path) -> None:
    topic, group = unique("moving"), unique("moving-group")
    props = {**netcluster.props, "group.id": group}
    create_topic(netcluster.props, topic, 3, replication_factor=-1)
    member = Consumer({**props, "enable.auto.commit": False})
    try:
        member.commit(offsets=[TopicPartition(topic, p, 10 + p) for p in range(3)], asynchronous=False)
    finally:
        member.close()
    out = tmp_path / "reads.jsonl"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, json.dumps(props), topic, "45", *(["stable"] if stable else [])],
        stdout=open(out, "w"), stderr=subprocess.STDOUT, cwd=ROOT)  # noqa: SIM115
    try:
        wait_for(lambda: '"offsets"' in out.read_text(), 60, "a first answer")
        node = netcluster.cluster.node(Who(netcluster.props).group_coordinator(group))
        killed_at = time.monotonic()
        node.kill()
        time.sleep(10)  # the coordinator moves to another node meanwhile
        node.start()
        code = reader.wait(120)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(10)
        heal(netcluster)
    lines = [json.loads(ln) for ln in out.read_text().splitlines() if ln.startswith("{")]
    assert code == 0, f"the reader died ({code}): {out.read_text()[-2000:]}"
    after = [ln for ln in lines if ln["t"] > killed_at]
    answered = [ln for ln in after if "offsets" in ln]
    assert answered, f"no answer after the coordinator moved: {after[-5:]}"
    expected = [[[topic, p], 10 + p] for p in range(3)]
    wrong = [ln for ln in answered if any(o not in expected for o in ln["offsets"])]
    assert not wrong, f"answers naming other offsets than those committed: {wrong[:3]}"
    # Seen once on Apache Kafka 4.4: a non-stable OffsetFetch answered "nothing committed" for
    # ~35 s after the coordinator of a group with no members moved (docs/brokers.md). A batch
    # run only waits longer on such an answer; its verdict is the stable read's.
    if stable:
        assert all(ln["offsets"] == expected for ln in answered), answered[:3]
