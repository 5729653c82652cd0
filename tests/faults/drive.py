"""Running one row of the fault matrix against the real broker and the real daemon, and
recording what happened (an Observation) for test_fault_matrix.py to judge.

Drivers:

* ``batch``: produce the row's records, `ringmaster run --until-caught-up`, read back.
* ``output_outage`` / ``output_outage_reset`` / ``dead_letter_outage``: a broker of its own
  behind a proxy that swallows (or resets on) Produce requests for a while, then lets them
  through; the daemon runs meanwhile and is stopped with SIGTERM at the end.
* ``supervisor_sigkill``, ``status_dir_removed``, ``idle_cpu``: deployment scenarios;
  ``supervisor_sigkill_after_isolation``: the supervisor killed as it isolates a record;
  ``supervisor_sigkill_after_set_aside``: killed once the group's offset passed a record set
  aside at intake.
* ``signals`` / ``signal_stop``: the row's signals sent to the supervisor and to its whole
  process group while records flow (it runs in a session of its own).
* ``admin_idle`` / ``admin_slow`` / ``admin_odd``: the admin endpoint crowded, slow-read or sent
  odd requests while records flow; /healthz is asked throughout.
* ``caught_up_broker_away`` / ``caught_up_commit_unanswered`` / ``caught_up_broker_stall``:
  `--until-caught-up` against a broker of its own behind a proxy that cuts it, or swallows
  OffsetCommit requests.
* ``start_offsets_unanswered``: half of each partition committed before, then `--until-caught-up`
  behind a proxy that swallows every OffsetFetch request until both partitions wait for their
  committed offsets.
* ``share`` / ``share_broker_stall``: the row in a share group (Apache Kafka); the stall
  against a broker of its own behind a proxy that cuts it.
* ``transactions``: the row's records written in committed and aborted transactions, then
  `--until-caught-up` under read_committed.
* ``redrive_letters``: good and poisoned dead letters, `ringmaster redrive` twice, then the
  daemon over what was redriven.

String values in a row's ``sections`` may name the row's topics: ``{in}``, ``{out}``, ``{dlq}``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    OffsetSpec,
    ResourceType,
)
from helpers import (
    FAST_GROUP,
    PLUGINS,
    ROOT,
    SHM_DIR,
    TEST_BROKER,
    TEST_GROUP_PROTOCOL,
    Broker,
    Ringmaster,
    base_config,
    committed,
    exited,
    produce_rows,
    proxied_broker,
    read_all,
    row_shm_dir,
    shm_segments,
    take_leftovers,
    to_toml,
    unique,
    wait_for,
)
from proxy import OFFSET_COMMIT, OFFSET_FETCH, PRODUCE, Proxy

from runtime.dev.tansu import free_port
from runtime.execution.deadletter_format import dead_letter_headers
from runtime.kafka.admin import create_topic
from runtime.kafka.transactions import transactional_id
from runtime.ops.member_slot import member_name
from tests.wire import RawRecord, WireProducer

from .matrix import POISONS, REDRIVE_LETTERS, TRANSACTIONS, Fault

TEST_PRODUCER = {"message.max.bytes": 4_000_000}
# The rows' topics keep every record whatever its timestamp: rows write records stamped in
# 2023, at 0, negative and far in the future (matrix.py), which Apache Kafka would delete by
# time (retention.ms, checked every 5 minutes) or refuse (INVALID_TIMESTAMP past
# message.timestamp.after.max.ms, an hour since Kafka 4.0). A deployment's retention is not
# what a row tests; Tansu keeps everything anyway.
TOPIC_CONFIG = {"retention.ms": "-1", "message.timestamp.after.max.ms": str(2**63 - 1)}


@dataclass
class Observation:
    fault: Fault
    values: list[bytes | None]
    counts: dict[int, int]
    exit: int | None = None
    committed: dict[int, int] = field(default_factory=dict)
    outputs: list[Any] = field(default_factory=list)
    dead: list[Any] = field(default_factory=list)
    log: str = ""
    status: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)
    dirs: dict[str, Path] = field(default_factory=dict)
    bootstrap: str = ""

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(m.value().split(b" ", 1)[0] if m.value().endswith(b" ") else m.value())
                for m in self.outputs]


def _names_in(node: Any, names: dict[str, str]) -> Any:
    """``{in}``, ``{out}``, ``{dlq}`` in the strings of a row's sections: the row's topics."""
    if isinstance(node, dict):
        return {k: _names_in(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [_names_in(v, names) for v in node]
    if isinstance(node, str):
        for key in ("in", "out", "dlq"):
            node = node.replace("{" + key + "}", names[key])
    return node


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


def _rows(fault: Fault) -> list[tuple[bytes | None, bytes | None, Any]]:
    if fault.raw is not None:
        return [(r.key, r.value, r.headers) for r, _ in fault.raw(fault.n)]
    if fault.rows is not None:
        return fault.rows(fault.n)
    return [(str(i).encode(), fault.values.get(i, f"r{i}").encode(), None) for i in range(fault.n)]


def _config(fault: Fault, bootstrap: str, names: dict[str, str], tmp: Path,
            dirs: dict[str, Path]) -> dict[str, Any]:
    workers = {"processes": 1, **fault.workers}
    cfg = base_config(bootstrap, names["in"], names["group"], tmp, fault.protocol, **workers)
    cfg["supervisor"]["shm_dir"] = str(dirs["shm"])  # the row's own (run() made it)
    settings = {k: (str(dirs["journal"]) if v == "JOURNAL" else v) for k, v in fault.settings.items()}
    settings.update({"state_dir": str(dirs["state"]), "pid_dir": str(dirs["pids"])})
    cfg["workers"]["settings"] = settings
    cfg["output"] = {"topic": names["out"]} if fault.output else {}
    cfg["dead_letter"] = {"retry_backoff_s": 0.01, "max_attempts": 2}
    if fault.dead_letter:
        cfg["dead_letter"]["topic"] = names["dlq"]
    if fault.guarantee == "exactly-once":
        # A transaction a killed worker left open ends within the row when no successor fences it.
        _merge(cfg, {"output": {"guarantee": "exactly-once", "delivery_timeout_s": 10.0},
                     "kafka": {"producer": {"transaction.timeout.ms": 15000}}})
    _merge(cfg, _names_in(json.loads(json.dumps(fault.sections)), names))
    return cfg


def prepare(fault: Fault, bootstrap: str, tmp: Path) -> tuple[Observation, dict[str, Any]]:
    names = {k: unique(k) for k in ("in", "out", "dlq", "group", "routed")}
    dirs = {k: tmp / k for k in ("journal", "state", "pids")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    dirs["shm"] = SHM_DIR / fault.id
    for topic in (names["in"], names["out"], names["dlq"], names["routed"]):
        create_topic({"bootstrap.servers": bootstrap}, topic, fault.partitions, 1, TOPIC_CONFIG)
    rows = _rows(fault)
    rows = [(k, (v.replace(b"ROUTED", names["routed"].encode()) if v else v), h) for k, v, h in rows]
    if fault.raw is not None:
        counts = produce_raw_rows(bootstrap, names["in"], fault.raw(fault.n), fault.partitions)
    else:
        counts = produce_rows(bootstrap, names["in"], rows, fault.partitions, TEST_PRODUCER)
    obs = Observation(fault, [v for _, v, _ in rows], counts, names=names, dirs=dirs, bootstrap=bootstrap)
    return obs, _config(fault, bootstrap, names, tmp, dirs)


def _no_open_transactions(bootstrap: str, topics: list[str], partitions: int) -> Callable[[], bool]:
    """Every partition's last stable offset is its end: no transaction left open on it. A
    killed supervisor's workers leave theirs to the broker, which aborts them after
    transaction.timeout.ms; until then a read_committed reader stops short of what is
    committed after them (docs/exactly-once.md, Limits)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]

    def ends(level: IsolationLevel) -> list[int]:
        answers = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps}, isolation_level=level)
        return [answers[tp].result(30).offset for tp in tps]
    return lambda: ends(IsolationLevel.READ_COMMITTED) == ends(IsolationLevel.READ_UNCOMMITTED)


def read_back(obs: Observation, rm: Ringmaster | None) -> Observation:
    n = obs.names
    if obs.fault.guarantee == "exactly-once":
        wait_for(_no_open_transactions(obs.bootstrap, [n["out"], n["dlq"]], len(obs.counts)), 60,
                 "no transaction left open on the output and dead-letter topics", interval_s=0.5)
    obs.committed = committed(obs.bootstrap, n["group"], n["in"], len(obs.counts))
    obs.outputs = read_all(obs.bootstrap, n["out"])
    obs.dead = read_all(obs.bootstrap, n["dlq"])
    obs.extra["routed"] = read_all(obs.bootstrap, n["routed"])
    if rm is not None:
        obs.log = rm.log_path.read_text(errors="replace")
        obs.status = rm.status()
    return obs


def produce_raw_rows(bootstrap: str, topic: str, rows: list[tuple[RawRecord, bool]],
                     partitions: int) -> dict[int, int]:
    """Round-robin over partitions, byte for byte (tests/wire.py): each partition's records in
    one batch per run of the same timestamp type, in order."""
    per: dict[int, list[tuple[RawRecord, bool]]] = {}
    for i, row in enumerate(rows):
        per.setdefault(i % partitions, []).append(row)
    with WireProducer(bootstrap) as p:
        for part, recs in per.items():
            for log_append, group in itertools.groupby(recs, key=lambda r: r[1]):
                p.produce(topic, part, [r for r, _ in group], log_append_time=log_append)
    return {part: len(recs) for part, recs in per.items()}


# ---------------------------------------------------------------------------- drivers
def batch(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"], env=dict(fault.env))
    try:
        obs.exit = rm.wait(fault.timeout_s)
    finally:
        rm.close()
    obs.extra["config"] = rm.config_path
    return read_back(obs, rm)


def _share_group(cfg: dict[str, Any]) -> None:
    cfg["kafka"].update(group_type="share", consumer={})
    cfg["workers"]["ordering"] = "unordered"


def share(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """The row in a share group (kafka.group_type = "share", Apache Kafka only): no
    --until-caught-up (a share group commits no offset), so the daemon runs until every record
    is acknowledged (its status's share counts), then SIGTERM."""
    if TEST_BROKER != "kafka":
        pytest.skip("share groups need Apache Kafka (RINGMASTER_TEST_BROKER=kafka)")
    obs, cfg = prepare(fault, bootstrap, tmp)
    _share_group(cfg)
    _set_group_configs(bootstrap, obs.names["group"], fault.group_configs)
    rm = Ringmaster(cfg, tmp, "rm", env=dict(fault.env))
    try:
        _until_accepted(rm, fault, obs)
        obs.exit = rm.terminate(fault.timeout_s)
    finally:
        rm.close()
    return read_back(obs, rm)


def _until_accepted(rm: Ringmaster, fault: Fault, obs: Observation) -> None:
    """Until every record is output or dead-lettered and the daemon holds nothing (each
    acknowledged, and answered: an acknowledgement sent after the record's lock ended counts
    as a lock expiry, not as accepted). Past the row's time, judged on what there is: a record
    the broker archived without a trace is missing from both topics, not a timeout."""
    expected = {(v or b"").decode(errors="replace").split("#", 1)[0].rsplit(":", 1)[-1] for v in obs.values}

    def settled(s: dict[str, Any]) -> bool:
        share = s.get("share") or {}
        if not share or share.get("held") or share.get("unanswered") or share["acquired"] < fault.n:
            return False
        try:
            seen = {json.loads(m.value())["id"] for m in read_all(obs.bootstrap, obs.names["out"])}
            seen |= {(m.value() or b"").decode(errors="replace").split("#", 1)[0].rsplit(":", 1)[-1]
                     for m in read_all(obs.bootstrap, obs.names["dlq"])}
        except AssertionError:  # a read that found no end in time (a loaded machine): again
            return False
        return seen >= expected
    try:
        wait_for(lambda: rm.proc.poll() is None and (s := rm.status()) is not None and settled(s),
                 fault.timeout_s, "every record output or dead-lettered, nothing held", interval_s=1.0)
    except AssertionError as exc:
        obs.extra["timed_out"] = str(exc).splitlines()[0]


def share_output_outage(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """A share group's `[output] topic` missing (auto-creation off) for ``outage_s``: an outage,
    not the records' fault. Then the topic is created; the daemon runs until every record is
    accepted (output or dead-lettered), then SIGTERM."""
    if TEST_BROKER != "kafka":
        pytest.skip("share groups need Apache Kafka (RINGMASTER_TEST_BROKER=kafka)")
    obs, cfg = prepare(fault, bootstrap, tmp)
    _share_group(cfg)
    late = obs.names["out"] = unique("late-out")
    _merge(cfg, {"output": {"topic": late, "delivery_timeout_s": 1.0, "retry_backoff_s": 0.3,
                            "retry_backoff_max_s": 1.0},
                 "kafka": {"producer": {"allow.auto.create.topics": False,
                                        "topic.metadata.propagation.max.ms": 500}}})
    _set_group_configs(bootstrap, obs.names["group"], fault.group_configs)
    rm = Ringmaster(cfg, tmp, "rm")
    try:
        rm.wait_status(lambda s: s.get("deferred", 0) >= 1 or (s.get("share") or {}).get("acquired"), 60,
                       "records acquired")
        start = time.monotonic()
        wait_for(lambda: time.monotonic() - start >= fault.outage_s or rm.proc.poll() is not None,
                 fault.outage_s + 5, "the outage's length (the fault)", interval_s=0.2)
        create_topic({"bootstrap.servers": bootstrap}, late, fault.partitions, 1, TOPIC_CONFIG)
        _until_accepted(rm, fault, obs)
        obs.exit = rm.terminate(fault.timeout_s)
    finally:
        rm.close()
    return read_back(obs, rm)


def _set_group_configs(bootstrap: str, group: str, configs: Mapping[str, str]) -> None:
    """A share group's configs (the lock, the delivery limit), before it has members."""
    if not configs:
        return
    entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()]
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: not destroyed mid-call
    admin.incremental_alter_configs([res])[res].result(30)


# ---- exactly-once (docs/exactly-once.md): rows of any driver, with output.guarantee
def _exactly_once_only() -> None:
    if TEST_BROKER != "kafka":
        pytest.skip("exactly-once is judged on Apache Kafka only: Tansu's read_committed returns "
                    "aborted records")


def exactly_once_broker_stall(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """Batches under way in their transactions when the broker goes away past the session
    timeout (the partitions lost), then back: every offset committed, then SIGTERM."""
    with proxied_broker(tmp) as (broker, proxy):
        obs, cfg = _flowing(fault, broker.bootstrap, tmp, n=6000)
        cfg["supervisor"]["revoke_timeout_s"] = 2.0
        rm = Ringmaster(cfg, tmp, "rm")
        try:
            rm.wait_status(lambda s: s["records"] >= 1000 and any(w["in_flight"] for w in s["workers"]), 90,
                           "batches under way")
            proxy.cut()
            rm.wait_status(lambda s: s["rebalances"] > 1 or not s["partitions"], 30,
                           "the partitions to be lost (session.timeout.ms 2000)")
            proxy.restore()
            wait_for(_all_committed(obs), fault.timeout_s, "every offset committed", interval_s=0.3)
            obs.exit = rm.terminate(60)
        finally:
            rm.close()
            proxy.restore()
        return read_back(obs, rm)


def producer_fenced(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """A producer with the worker's transactional id starts while the worker's batch is under
    way, as a replacement on the host would (the ids are the group's, the host's and the
    slot's: runtime/ops/member_slot.py): the worker's producer is fenced mid-batch. A batch
    run, judged as every row is."""
    _exactly_once_only()
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"], env=dict(fault.env))
    try:
        rm.wait_status(lambda s: any(w["in_flight"] and w["state"] == "ready" for w in s["workers"]), 90,
                       "a batch under way")
        member = member_name(socket.gethostname(), 0)  # the row's daemon is alone in its group here
        fencer = Producer({"bootstrap.servers": bootstrap, "log_level": 2,
                           "transactional.id": transactional_id(obs.names["group"], member, 0)})
        fencer.init_transactions(30)
        obs.exit = rm.wait(fault.timeout_s)
    finally:
        rm.close()
    return read_back(obs, rm)


# ---- transactional input (issue 29): a transaction's marker takes an offset no consumer is handed
def transactions(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """The row's records written by a transactional producer, one transaction per entry of
    ``TRANSACTIONS[fault.id]`` ((records, commit?)), record i to partition i % partitions,
    then `ringmaster run --until-caught-up` with ``isolation.level = read_committed``.

    ``counts`` becomes each partition's end (records plus one marker per transaction that
    wrote to it): what a caught-up run must have committed. ``values`` are the committed
    records only. Tansu delivers aborted records under read_committed (BROKER.md), so their
    outputs are taken out of ``outputs`` into ``extra["aborted_outputs"]`` (none on Apache
    Kafka): the row judges what holds on both brokers."""
    obs, cfg = prepare(replace(fault, n=0, values={}), bootstrap, tmp)
    obs.fault = fault
    cfg["kafka"]["consumer"]["isolation.level"] = "read_committed"
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique("tx"), "linger.ms": 2,
                  **TEST_PRODUCER})
    p.init_transactions(30)
    ends: dict[int, int] = {}
    committed_values: list[bytes | None] = []
    aborted: set[str] = set()
    i = 0
    for count, commit in TRANSACTIONS[fault.id]:
        p.begin_transaction()
        touched = set()
        for _ in range(count):
            value = fault.values.get(i, f"r{i}").encode()
            part = i % fault.partitions
            p.produce(obs.names["in"], value, key=str(i).encode(), partition=part)
            ends[part] = ends.get(part, 0) + 1
            touched.add(part)
            (committed_values.append(value) if commit else aborted.add(value.decode().split(":")[-1]))
            i += 1
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)
        for part in touched:
            ends[part] += 1  # the transaction's commit or abort marker
    obs.values, obs.counts = committed_values, ends
    rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"], env=dict(fault.env))
    try:
        obs.exit = rm.wait(fault.timeout_s)
    finally:
        rm.close()
    read_back(obs, rm)
    ids = [b["id"] for b in obs.bodies()]
    obs.extra["aborted_outputs"] = [m for m, id_ in zip(obs.outputs, ids, strict=True) if id_ in aborted]
    obs.outputs = [m for m, id_ in zip(obs.outputs, ids, strict=True) if id_ not in aborted]
    return obs


# ---- poisoned dead letters (issue 29): every field redrive reads from a letter is bounded
def _letter(names: dict[str, str], i: int, poison: str | None) -> tuple[RawRecord, bool]:
    """The dead letter of input record ``g<i>`` (in[0]@i), as a worker writes it, with one
    field poisoned as ``POISONS`` names it (None: a good letter)."""
    value = f"{'p' if poison else 'g'}{i}"
    headers = [(k, v) for k, v in dead_letter_headers(
        [("trace", b"t")], error_type="ValueError", message="m", traceback="", topic=names["in"],
        partition=0, offset=i, attempts=1, worker="worker-0.1")]
    raw: list[tuple[bytes, bytes | None]] = [(k.encode(), v) for k, v in headers]
    if poison is not None:
        raw = POISONS[poison](raw)
    return RawRecord(value.encode(), f"k{i}".encode(), raw, 1_700_000_000_000 + i), False


def redrive_letters(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """The dead-letter topic holds good letters with the poisoned ones of
    ``REDRIVE_LETTERS[fault.id]`` between them (written byte for byte: tests/wire.py);
    `ringmaster redrive --json` runs twice (the second must find nothing left), then
    `ringmaster run --until-caught-up` processes what was redriven. The observation is the
    daemon's over the redriven copies (``values``: the good letters' records; ``dead``: dead
    letters written after the planted ones), with the redrive's exits and summaries in
    ``extra["redrive"]`` and its stderr in the log; ``exit`` is the first redrive's."""
    obs, cfg = prepare(replace(fault, n=0, values={}), bootstrap, tmp)
    obs.fault = fault
    poisons, args = REDRIVE_LETTERS[fault.id]
    rows = [_letter(obs.names, i, poisons.get(i)) for i in range(8)]
    produce_raw_rows(bootstrap, obs.names["dlq"], rows, 1)
    path = tmp / "redrive.toml"
    path.write_text(to_toml(cfg))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    runs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "runtime.cli", "redrive", "-c", str(path), "--json",
                               *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        runs.append((done.returncode, done.stdout, done.stderr))
    obs.exit = runs[0][0]
    obs.extra["redrive"] = runs
    good = [r.value for i, (r, _) in enumerate(rows) if i not in poisons]
    obs.values = list(good) if obs.exit == 0 else []
    obs.counts = {0: len(obs.values)} if obs.values else {}
    rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"]) if obs.values else None
    if rm is not None:
        try:
            obs.extra["daemon_exit"] = rm.wait(fault.timeout_s)
        finally:
            rm.close()
    read_back(obs, rm)
    obs.dead = obs.dead[len(rows):]  # the planted letters are the row's input, not its outcome
    obs.log = "\n".join(err for _, _, err in runs) + obs.log
    return obs


def _outage(fault: Fault, tmp: Path, how: str, poison: dict[int, str]) -> Observation:
    with proxied_broker(tmp) as (broker, proxy):
        f = Fault(fault.id, fault.group, fault.when, fault.then, values=poison, n=40, partitions=2,
                  workers={"processes": 2, **fault.workers}, protocol=fault.protocol,
                  guarantee=fault.guarantee)
        obs, cfg = prepare(f, broker.bootstrap, tmp)
        obs.fault = fault
        _merge(cfg, {"output": {"delivery_timeout_s": 2.0, "retry_backoff_s": 0.5,
                                "retry_backoff_max_s": 2.0},
                     "kafka": {"producer": {"request.timeout.ms": 1000}}})
        def group_offsets() -> dict[int, int]:
            return committed(broker.bootstrap, obs.names["group"], obs.names["in"], 2)

        proxy.block(PRODUCE, how)
        rm = Ringmaster(cfg, tmp, "rm")
        try:
            during = rm.wait_status(lambda s: s["deferred"] >= 2 and any(
                "delivery" in p["pause_reasons"] for p in s["partitions"]), 60, "deliveries to be deferred")
            obs.extra["during"] = during
            obs.extra["dead_during"] = read_all(broker.bootstrap, obs.names["dlq"])
            obs.extra["committed_during"] = group_offsets()
            obs.extra["swallowed"] = proxy.swallowed
            proxy.unblock(PRODUCE)
            wait_for(lambda: group_offsets() == obs.counts, 90, "every offset committed after the outage",
                     interval_s=0.3)
            obs.exit = rm.terminate(60)
        finally:
            rm.close()
        return read_back(obs, rm)


def output_outage(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "stall", {})


def output_outage_reset(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "reset", {})


def dead_letter_outage(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _outage(fault, tmp, "stall", {7: "raise:r7"})


def supervisor_sigkill(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    f = Fault(fault.id, fault.group, fault.when, fault.then, n=400, partitions=2,
              workers=fault.workers, settings={"sleep_ms": 20}, protocol=fault.protocol,
              guarantee=fault.guarantee)
    obs, cfg = prepare(f, bootstrap, tmp)
    obs.fault = fault
    a = Ringmaster(cfg, tmp, "a")
    try:
        s = a.wait_status(lambda s: s["records"] > 0 and all(w["alive"] for w in s["workers"]), 60,
                          "progress")
        workers = [psutil.Process(w["pid"]) for w in s["workers"]]
        a.kill()
        segments = a.segments()  # what the SIGKILL left for the next start to reclaim

        def gone() -> bool:
            return all(map(exited, workers))
        wait_for(gone, 10, "the workers of the killed supervisor to exit")
        obs.extra["segments_left"] = segments
    finally:
        a.close()
    cfg["workers"]["settings"]["sleep_ms"] = 0
    b = Ringmaster(cfg, tmp, "b", args=["--until-caught-up"])
    try:
        obs.exit = b.wait(fault.timeout_s)
    finally:
        b.close()
    obs.extra["segments_after_restart"] = sorted(set(segments) & set(shm_segments(obs.dirs["shm"])))
    return read_back(obs, b)


def supervisor_sigkill_after_isolation(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """The row's records with one that kills its workers; the supervisor SIGKILLed as soon as
    its log says the record was isolated (its dead letter on its way), then started again with
    ``--until-caught-up``. The kill lands before or after the letter's transaction committed:
    either way the letter is there once (``killed_after_letter``: which it was)."""
    obs, cfg = prepare(fault, bootstrap, tmp)
    # The supervisor logs the isolation with the letter's error type, before the letter is written.
    return _killed_then_caught_up(
        fault, bootstrap, tmp, obs, cfg, "killed_after_letter", "the record isolated", 0.02,
        lambda a: "WorkerCrashed" in a.log_path.read_text(errors="replace"))


def supervisor_sigkill_after_set_aside(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """One partition; the row's record set aside at intake (the first of ``dead``, its index
    its offset) and records after it. The supervisor is SIGKILLed as soon as the group's
    offset is past the batch after that record, then started again with ``--until-caught-up``.
    The row's ``linger.ms`` holds back what the supervisor's own producer writes (workers flush
    at each commit): a letter written there, outside the lane's transactions, is still in the
    producer when the kill lands (``letter_before_kill``: whether it was readable then)."""
    obs, cfg = prepare(fault, bootstrap, tmp)
    bad = min(int(k[1:]) for k in fault.dead)
    return _killed_then_caught_up(
        fault, bootstrap, tmp, obs, cfg, "letter_before_kill",
        "the group's offset past the batch after the record", 0.05,
        lambda _: committed(bootstrap, obs.names["group"], obs.names["in"], 1)[0] >= bad + 2)


def _killed_then_caught_up(fault: Fault, bootstrap: str, tmp: Path, obs: Observation, cfg: dict[str, Any],
                           letter_key: str, what: str, interval_s: float,
                           ready: Callable[[Ringmaster], bool]) -> Observation:
    """A daemon SIGKILLed once ``ready``, then started again with ``--until-caught-up``;
    ``obs.extra[letter_key]``: whether the dead-letter topic had a letter at the kill."""
    a = Ringmaster(cfg, tmp, "a")
    try:
        wait_for(lambda: ready(a), fault.timeout_s, what, interval_s=interval_s)
        a.kill()
        obs.extra[letter_key] = bool(read_all(bootstrap, obs.names["dlq"]))
    finally:
        a.close()
    b = Ringmaster(cfg, tmp, "b", args=["--until-caught-up"])
    try:
        obs.exit = b.wait(fault.timeout_s)
    finally:
        b.close()
    return read_back(obs, b)


def status_dir_removed(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    f = Fault(fault.id, fault.group, fault.when, fault.then, n=40, protocol=fault.protocol)
    obs, cfg = prepare(f, bootstrap, tmp)
    obs.fault = fault
    rm = Ringmaster(cfg, tmp, "rm", status_path=tmp / "missing" / "deeper" / "status.json")
    try:
        wait_for(lambda: rm.status_path.exists(), 30, "the status file in a directory created at start")
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "the first records committed")
        # A file where the status directory was: writes must fail now. Each write makes the
        # directory again (mkdir -p) if it is gone, so one may come between the removal and the
        # file: remove and try again.
        def replaced_by_a_file() -> bool:
            shutil.rmtree(tmp / "missing", ignore_errors=True)
            try:
                with open(tmp / "missing", "x") as f:
                    f.write("a file where the status directory was")
            except (FileExistsError, IsADirectoryError):
                return False
            return True
        wait_for(replaced_by_a_file, 10, "the status directory replaced by a file", interval_s=0)
        rows = [(b"k", f"r{i}".encode(), None) for i in range(40, 80)]
        more = produce_rows(bootstrap, obs.names["in"], rows, 1)
        obs.counts = {p: obs.counts[p] + more[p] for p in obs.counts}
        obs.values += [v for _, v, _ in rows]
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "records after the directory vanished committed")
        assert rm.proc.poll() is None, rm.log_tail()
        obs.exit = rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


def idle_cpu(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm")
    try:
        wait_for(lambda: committed(bootstrap, obs.names["group"], obs.names["in"], 1) == obs.counts, 60,
                 "every record committed")
        proc = psutil.Process(rm.proc.pid)
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(3)
        obs.extra["idle_cpu_share"] = (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)
        obs.exit = rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


_TRICKLE = 150  # records produced one at a time
_TRICKLE_GAP_S = 0.01  # between them: a fetch or two, each answer ending at the partition's end


def trickle(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """Records produced one at a time into a running daemon that takes a few at a time: the
    client's queue holds record, end of partition, record, end... and a consume() takes part
    of it. Until every record is committed (or the daemon exits), then SIGTERM."""
    obs, cfg = prepare(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm")
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    try:
        done = _all_committed(obs)
        wait_for(lambda: done() or rm.proc.poll() is not None, 60, "the first records committed")
        for i in range(fault.n, fault.n + _TRICKLE):
            if rm.proc.poll() is not None:
                break
            value, part = f"r{i}".encode(), i % fault.partitions
            producer.produce(obs.names["in"], value, key=str(i).encode(), partition=part)
            producer.flush(10)
            obs.values.append(value)
            obs.counts[part] = obs.counts.get(part, 0) + 1
            time.sleep(_TRICKLE_GAP_S)  # the load's shape, not a verdict: judged on commits below
        wait_for(lambda: done() or rm.proc.poll() is not None, 60, "every record committed")
        exited = rm.proc.poll()  # asked once: an exit between two asks is not a terminate's
        obs.exit = exited if exited is not None else rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


# ---------------------------------------------------------------------------- the control plane
def _flowing(fault: Fault, bootstrap: str, tmp: Path,
             n: int = 4000) -> tuple[Observation, dict[str, Any]]:
    """A row whose records keep a daemon busy for a while (2 partitions, 1 ms a record)."""
    f = Fault(fault.id, fault.group, fault.when, fault.then, n=n, partitions=2, settings={"sleep_ms": 1},
              workers={"processes": 2, **fault.workers}, protocol=fault.protocol,
              guarantee=fault.guarantee)
    obs, cfg = prepare(f, bootstrap, tmp)
    obs.fault = fault
    return obs, cfg


def _all_committed(obs: Observation) -> Callable[[], bool]:
    n = obs.names
    return lambda: committed(obs.bootstrap, n["group"], n["in"], len(obs.counts)) == obs.counts


def _send(rm: Ringmaster, name: str, target: str) -> None:
    sig = getattr(signal, f"SIG{name}")
    if target == "group":
        os.killpg(rm.proc.pid, sig)
    else:
        rm.proc.send_signal(sig)


_LIVE = {"HUP": "reload", "TTIN": "scale", "TTOU": "scale"}  # the operation each one starts


def signals(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """Each signal to the supervisor, then to its whole process group (a terminal's hangup):
    records keep flowing, and a reload or resize it starts runs to its end."""
    obs, cfg = _flowing(fault, bootstrap, tmp, n=20000)
    rm = Ringmaster(cfg, tmp, "rm", new_session=True)
    try:
        first = rm.wait_status(lambda s: s["records"] >= 200 and all(w["alive"] for w in s["workers"]), 60,
                               "progress")
        obs.extra["pids_before"] = [w["pid"] for w in first["workers"]]
        steps = obs.extra["steps"] = []  # (signal, target, operation outcome, workers alive, pids)
        for target in ("supervisor", "group"):
            for name in fault.signals:
                now = rm.status() or first
                before = now["records"]
                kind = _LIVE.get(name)
                started = ((now.get(kind) or {}).get("started_ms") or 0) if kind else 0
                _send(rm, name, target)
                outcome = None
                if kind is not None:  # a reload or a resize: wait for it to finish
                    def over(s: dict[str, Any], kind: str = kind, started: int = started) -> bool:
                        op = s.get(kind) or {}
                        return (op.get("started_ms") or 0) > started and op.get("state") != "running"
                    done = rm.wait_status(over, 90, f"the {kind} SIG{name} asked for ({target})")
                    outcome = done[kind]["state"]
                after = rm.wait_status(lambda s, b=before: s["records"] > b, 30,
                                       f"progress after SIG{name} ({target})")
                alive = [w["pid"] for w in after["workers"] if w["alive"]]
                steps.append((name, target, outcome, len(alive), alive))
        wait_for(_all_committed(obs), 120, "every record committed", interval_s=0.3)
        last = rm.status() or {}
        obs.extra["pids_after"] = [w["pid"] for w in last.get("workers", [])]
        obs.extra["restarts"] = last.get("restarts")
        obs.exit = rm.terminate(60)
    finally:
        rm.close()
    return read_back(obs, rm)


def signal_stop(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    (name,) = fault.signals
    obs, cfg = _flowing(fault, bootstrap, tmp)
    rm = Ringmaster(cfg, tmp, "rm", new_session=True)
    try:
        rm.wait_status(lambda s: s["records"] >= 300, 60, "progress")
        _send(rm, name, "group")
        obs.exit = rm.wait(60)
    finally:
        rm.close()
    obs.extra["stopped_at"] = (rm.status() or {}).get("records")
    obs.extra["committed_at_stop"] = committed(bootstrap, obs.names["group"], obs.names["in"], 2)
    cfg["workers"]["settings"]["sleep_ms"] = 0
    rest = Ringmaster(cfg, tmp, "rest", args=["--until-caught-up"])  # the next start goes on
    try:
        obs.extra["rest_exit"] = rest.wait(fault.timeout_s)
    finally:
        rest.close()
    return read_back(obs, rm)


def _admin(fault: Fault, bootstrap: str, tmp: Path,
           crowd: Callable[[str, int], dict[str, Any]]) -> Observation:
    import psutil as ps

    obs, cfg = _flowing(fault, bootstrap, tmp, n=6000)
    port = free_port()
    cfg["admin"] = {"listen": f"127.0.0.1:{port}", "max_connections": 16, "request_timeout_s": 2.0}
    rm = Ringmaster(cfg, tmp, "rm")
    try:
        wait_for(lambda: _http(port, "GET", "/readyz")[0] == 200, 60, "ready")
        fds_before = ps.Process(rm.proc.pid).num_fds()
        obs.extra.update(crowd("127.0.0.1", port))
        obs.extra["fds"] = (fds_before, ps.Process(rm.proc.pid).num_fds())
        wait_for(_all_committed(obs), 120, "every record committed", interval_s=0.3)
        obs.exit = rm.terminate(60)
    finally:
        obs.extra.get("close", lambda: None)()
        rm.close()
    return read_back(obs, rm)


def _http(port: int, method: str, path: str, raw: bytes | None = None) -> tuple[int, bytes, float]:
    """(status or 0, what came back, seconds) of one request on a fresh connection."""
    import socket
    import time as t

    started = t.monotonic()
    data = b""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            request = f"{method} {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode()
            s.sendall(raw if raw is not None else request)
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        # An answer that came before the error counts: the server answers an oversized
        # request and closes with the rest unread, which the kernel turns into a reset.
        pass
    code = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.") else 0
    return code, data, t.monotonic() - started


def _healthz(port: int, times: int = 10) -> list[tuple[int, float]]:
    out = []
    for _ in range(times):
        code, _, took = _http(port, "GET", "/healthz")
        out.append((code, took))
        time.sleep(0.2)
    return out


def admin_idle(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    import socket

    def crowd(host: str, port: int) -> dict[str, Any]:
        idle = [socket.create_connection((host, port), timeout=5) for _ in range(1000)]
        health = _healthz(port)
        return {"health": health, "close": lambda: [s.close() for s in idle]}
    return _admin(fault, bootstrap, tmp, crowd)


def admin_slow(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    import socket
    import threading

    def crowd(host: str, port: int) -> dict[str, Any]:
        cut_after: list[float] = []

        def slowloris() -> None:
            started = time.monotonic()
            with socket.create_connection((host, port), timeout=10) as s:
                try:
                    for ch in b"GET /status HTTP/1.1\r\nX-Slow: " + b"x" * 100:
                        s.send(bytes([ch]))
                        time.sleep(0.25)
                    s.recv(1)
                except OSError:
                    pass
            cut_after.append(time.monotonic() - started)

        threads = [threading.Thread(target=slowloris, daemon=True) for _ in range(40)]
        for th in threads:
            th.start()
        health = _healthz(port)
        for th in threads:
            th.join(30)
        return {"health": health, "slow_cut_after_s": cut_after}
    return _admin(fault, bootstrap, tmp, crowd)


def admin_odd(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    def crowd(host: str, port: int) -> dict[str, Any]:
        answers = {m: _http(port, m, "/status")[:2] for m in ("HEAD", "POST", "PUT", "DELETE", "OPTIONS")}
        answers["malformed"] = _http(port, "", "", b"NONSENSE\r\n\r\n")[:2]
        huge = b"GET /status HTTP/1.1\r\nX-Big: " + b"x" * 100_000 + b"\r\n\r\n"
        answers["huge"] = _http(port, "", "", huge)[:2]
        return {"health": _healthz(port), "answers": answers}
    return _admin(fault, bootstrap, tmp, crowd)


def _proxied_run(fault: Fault, tmp: Path,
                 during: Callable[[Observation, Ringmaster, Proxy, Broker], None],
                 **supervisor: Any) -> Observation:
    with proxied_broker(tmp) as (broker, proxy):
        obs, cfg = _flowing(fault, broker.bootstrap, tmp, n=6000)
        _merge(cfg, {"output": {"delivery_timeout_s": 2.0, "retry_backoff_s": 0.5,
                                "retry_backoff_max_s": 2.0}, "supervisor": supervisor})
        def progressed(s: dict[str, Any]) -> bool:
            if s["records"] < 1000:
                return False
            if fault.guarantee != "exactly-once":
                return bool(s["committed"])
            # Under exactly-once the supervisor commits nothing: the transactions' offsets are the group's.
            group = committed(broker.bootstrap, obs.names["group"], obs.names["in"], len(obs.counts))
            return any(v > 0 for v in group.values())

        rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"])
        try:
            rm.wait_status(progressed, 60, "progress and commits")
            during(obs, rm, proxy, broker)
            obs.exit = rm.wait(fault.timeout_s)
        finally:
            rm.close()
            proxy.restore()
            proxy.unblock(OFFSET_COMMIT)
        return read_back(obs, rm)


def caught_up_broker_away(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _proxied_run(fault, tmp, lambda obs, rm, proxy, broker: proxy.cut(), caught_up_timeout_s=6.0)


def caught_up_commit_unanswered(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    return _proxied_run(fault, tmp, lambda obs, rm, proxy, broker: proxy.block(OFFSET_COMMIT, "stall"),
                        caught_up_timeout_s=60.0)


def start_offsets_unanswered(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """The coordinator takes the member in but answers no offset fetch (the proxy swallows
    them, as a stuck or overloaded coordinator leaves them), then answers.
    The group has committed half of each partition: a partition started anywhere but there
    shows as outputs of records before it (the row's ``no_output``) or as records missing."""
    with proxied_broker(tmp) as (broker, proxy):
        obs, cfg = prepare(fault, broker.bootstrap, tmp)
        n = obs.names
        member = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": n["group"],
                           "enable.auto.commit": False})
        try:
            member.commit(offsets=[TopicPartition(n["in"], p, c // 2) for p, c in obs.counts.items()],
                          asynchronous=False)
        finally:
            member.close()
        # librdkafka refuses a seek of a partition while its own fetch of the committed offset
        # is unanswered, until that request times out: 10 s here, not the default 60.
        _merge(cfg, {"kafka": {"consumer": {"socket.timeout.ms": 10000}}})
        if (fault.protocol or TEST_GROUP_PROTOCOL) == "classic":
            # That timeout also drops the connection its heartbeats use: a session as long as a
            # deployment's outlasts the reconnection, where the tests' 2 s may lose the
            # partitions (KIP-848's session is the broker's; Apache Kafka assigns them back).
            _merge(cfg, {"kafka": {"consumer": {"session.timeout.ms": 10000}}})
        proxy.block(OFFSET_FETCH, "stall")
        rm = Ringmaster(cfg, tmp, "rm", args=["--until-caught-up"])
        try:
            obs.extra["during"] = rm.wait_status(
                lambda s: len(s["partitions"]) == fault.partitions
                and all("seeking" in p["pause_reasons"] for p in s["partitions"]),
                60, "every partition waiting for its committed offset")
            obs.extra["processed_during"] = obs.extra["during"]["records"]
            proxy.unblock(OFFSET_FETCH)
            obs.exit = rm.wait(fault.timeout_s)
        finally:
            rm.close()
            proxy.unblock(OFFSET_FETCH)
        return read_back(obs, rm)


def caught_up_broker_stall(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    def stall(obs: Observation, rm: Ringmaster, proxy: Proxy, broker: Broker) -> None:
        proxy.cut()
        if (fault.protocol or TEST_GROUP_PROTOCOL) == "consumer":
            # Under KIP-848 the member learns it was fenced only when the broker answers again
            # (FENCED_MEMBER_EPOCH: its partitions lost then), so the stall lasts until the
            # broker has fenced it, as its log says.
            fenced = "fenced from the group because the member session expired"
            wait_for(lambda: fenced in Path(str(broker.log_path)).read_text(errors="replace"), 30,
                     "the broker to fence the member (group.consumer.session.timeout.ms 2000)")
        else:
            rm.wait_status(lambda s: s["rebalances"] > 1 or not s["partitions"], 30,
                           "the partitions to be lost (session.timeout.ms 2000)")
        proxy.restore()
    return _proxied_run(fault, tmp, stall, caught_up_timeout_s=120.0)


def _set_lock(bootstrap: str, group: str, ms: int) -> None:
    """The share group's acquisition lock (share.record.lock.duration.ms), before it has members."""
    entry = ConfigEntry("share.record.lock.duration.ms", str(ms), incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: not destroyed mid-call
    admin.incremental_alter_configs([res])[res].result(30)


def share_broker_stall(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """A share group's member against a broker of its own behind a proxy, cut for 10 s (longer
    than the 5 s acquisition lock and the 6 s share session) while a poll is worked on, then
    healed; the daemon runs until every record's output is written, then SIGTERM. The row's
    records are one producer batch, which the broker hands out whole: one poll, which must run
    within the lock when the broker is there (a poll slower than its lock is refused anyway)."""
    if TEST_BROKER != "kafka":
        pytest.skip("share groups need Apache Kafka (RINGMASTER_TEST_BROKER=kafka)")
    with proxied_broker(tmp) as (broker, proxy):
        obs, cfg = prepare(fault, broker.bootstrap, tmp)
        _share_group(cfg)
        _merge(cfg, {"output": {"delivery_timeout_s": 2.0, "retry_backoff_s": 0.5,
                                "retry_backoff_max_s": 2.0}})
        _set_lock(broker.bootstrap, obs.names["group"], 5000)
        expected = {v.decode() for v in obs.values if v is not None}
        rm = Ringmaster(cfg, tmp, "rm")
        try:
            rm.wait_status(lambda s: (s.get("share") or {}).get("accepted", 0) >= 50, 60, "records accepted")
            proxy.cut()
            time.sleep(10)  # the outage's length is the fault: outlasting the lock and the session
            proxy.restore()

            def all_out() -> bool:
                try:
                    out = read_all(broker.bootstrap, obs.names["out"])
                    return {json.loads(m.value())["id"] for m in out} >= expected
                except AssertionError:  # a read that found no end in time (a loaded machine): again
                    return False
            # Outputs first: an ACCEPT refused after the stall is a lock expiry, and its record's
            # later delivery is what writes the output for sure; then nothing held.
            wait_for(all_out, fault.timeout_s, "every record's output after the stall", interval_s=2.0)
            _until_accepted(rm, fault, obs)
            obs.exit = rm.terminate(60)
        finally:
            rm.close()
            proxy.restore()
        return read_back(obs, rm)


def admin_port_held(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """A batch run whose ``admin.listen`` port another process holds."""
    import socket

    holder = socket.create_server(("127.0.0.1", 0))
    try:
        f = Fault(fault.id, fault.group, fault.when, fault.then, exit=fault.exit, log=fault.log,
                  sections={"admin": {"listen": f"127.0.0.1:{holder.getsockname()[1]}"}},
                  protocol=fault.protocol)
        obs = batch(f, bootstrap, tmp)
    finally:
        holder.close()
    obs.fault = fault
    return obs


DRIVERS: dict[str, Callable[[Fault, str, Path], Observation]] = {
    "batch": batch, "trickle": trickle, "output_outage": output_outage,
    "output_outage_reset": output_outage_reset,
    "dead_letter_outage": dead_letter_outage, "supervisor_sigkill": supervisor_sigkill,
    "supervisor_sigkill_after_isolation": supervisor_sigkill_after_isolation,
    "supervisor_sigkill_after_set_aside": supervisor_sigkill_after_set_aside,
    "status_dir_removed": status_dir_removed, "idle_cpu": idle_cpu, "signals": signals,
    "signal_stop": signal_stop, "admin_idle": admin_idle, "admin_slow": admin_slow, "admin_odd": admin_odd,
    "caught_up_broker_away": caught_up_broker_away, "caught_up_broker_stall": caught_up_broker_stall,
    "caught_up_commit_unanswered": caught_up_commit_unanswered,
    "start_offsets_unanswered": start_offsets_unanswered,
    "transactions": transactions,
    "redrive_letters": redrive_letters,
    "admin_port_held": admin_port_held,
    "share": share, "share_broker_stall": share_broker_stall, "share_output_outage": share_output_outage,
    "exactly_once_broker_stall": exactly_once_broker_stall, "producer_fenced": producer_fenced,
}


def run(fault: Fault, bootstrap: str, tmp: Path) -> Observation:
    """Drive the row with its daemons' segments in a directory of its own; what they leave
    there (``shm_left``), and the processes the plugin started that are still alive once the
    daemon is gone (``plugin_children_alive``), are the row's to answer for."""
    if fault.guarantee == "exactly-once":
        _exactly_once_only()
    shm = row_shm_dir(fault.id)
    try:
        obs = DRIVERS[fault.driver](fault, bootstrap, tmp)
        obs.extra["plugin_children_alive"] = plugin_children_alive(tmp / "pids")
        return obs
    finally:
        # Then they must not outlive the row either: killed only after they were counted.
        for pid_file in (tmp / "pids").glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                pid = int(pid_file.read_text())
                if psutil.pid_exists(pid):
                    os.kill(pid, signal.SIGKILL)
        left = take_leftovers(shm)
        if "obs" in locals():
            obs.extra["shm_left"] = left


def plugin_children_alive(pid_dir: Path, grace_s: float = 1.0) -> list[int]:
    """The processes the plugin recorded (probe.py's forkdaemon) still running: a killed one
    may be a zombie for a moment until init reaps it, hence the short grace."""
    pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]

    def alive() -> list[int]:
        out = []
        for pid in pids:
            with contextlib.suppress(psutil.NoSuchProcess):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out
    deadline = time.monotonic() + grace_s
    while (still := alive()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return still


__all__ = ["FAST_GROUP", "Observation", "run"]
