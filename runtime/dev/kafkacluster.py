"""Apache Kafka as a replicated cluster on one host: ``ringmaster broker --apache-kafka --nodes 3``.

N combined KRaft nodes (broker and controller each; the controllers form one quorum), each with
its own log dir, client listener and controller listener. Topics are replicated as a
production cluster replicates them: three replicas (fewer nodes: one per node), a produce with
``acks=all`` written to two of them before it is acknowledged (``min.insync.replicas``), the
internal topics (offsets, transaction state, share-group state) the same, no unclean leader
election. So the failures that only a replicated cluster has can be tried on one machine: a
partition's leader lost and a follower taking over, a group or transaction coordinator moving,
a node frozen (SIGSTOP) whose requests time out instead of failing, the ISR shrinking below
``min.insync.replicas`` (tests/cluster/).

A node keeps its log dir until the cluster stops, so a node killed and started again comes back
with its data, as a restarted broker does; the cluster's directory goes at stop. Each node is a
process group of its own that dies with the process that started it (PR_SET_PDEATHSIG: with
the *thread* that started it, so start and restart nodes from a thread that outlives them).

Used by ``ringmaster broker --apache-kafka --nodes N`` and the tests; never by the daemon. Starts
processes: the nodes (each through kafkabroker.launch; under ``ip netns exec`` where a node has a
namespace of its own).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from runtime.dev.certificates import make_certificates
from runtime.dev.kafkabroker import (
    SCRAM,
    cluster_id,
    format_log_dir,
    java,
    jvm_command,
    launch,
    resolve,
    scram_format_arguments,
    secured_properties,
    server_properties,
    wait_started,
    write_config,
)
from runtime.dev.tansu import free_port
from runtime.errors import ConfigError

# BROKER.md: three nodes with 512 MiB heaps and two network and I/O threads each run beside two
# daemons on 2 cores and 24 GiB.
NODE_HEAP = ["-Xms128m", "-Xmx512m"]
NODE_THREADS = {"num.network.threads": "2", "num.io.threads": "2", "background.threads": "2"}
# A node started again loads every partition's log and its coordinators' state before it
# registers, and a quorum busy electing (on 2 cores, a follower's fetch times out at 2 s) answers
# late: Kafka's 60 s default made a node restarted mid-matrix exit ("unable to register with the
# controller quorum") while KafkaNode.start waited 180 s for it. The node now waits as long.
NODE_START_S = 180.0
NODE_REGISTRATION = {"initial.broker.registration.timeout.ms": str(int(NODE_START_S * 1000))}
MAX_NODES = 9


def replication(nodes: int) -> dict[str, str]:
    """What every topic and internal topic of an ``nodes``-node cluster is replicated with:
    three replicas (one per node on a smaller cluster), acknowledged by all but one of them."""
    factor = min(3, nodes)
    min_isr = str(max(1, factor - 1))
    return {
        "default.replication.factor": str(factor),
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": str(factor),
        "transaction.state.log.replication.factor": str(factor),
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": str(factor),
        "share.coordinator.state.topic.min.isr": min_isr,
        "unclean.leader.election.enable": "false",
    }


@dataclass(frozen=True)
class NodePlace:
    """Where a node listens: its address (listened on and advertised), the clients' port, the
    controller's port, the port of its own traffic when clients must log in (SCRAM), and a
    command it runs through (``ip netns exec NAME``: in a network namespace of its own)."""

    host: str
    port: int
    controller_port: int
    internal_port: int
    prefix: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


def loopback_places(nodes: int, port: int | None = None) -> list[NodePlace]:
    """``nodes`` nodes on 127.0.0.1: clients on ``port``, ``port`` + 1, ... (free ports when
    None), the other listeners on free ports."""
    ports = [port + i for i in range(nodes)] if port else [free_port() for _ in range(nodes)]
    return [NodePlace("127.0.0.1", p, free_port(), free_port()) for p in ports]


class KafkaNode:
    """One node of a cluster: its process, log dir and log. Started, stopped, killed, frozen and
    thawed by the cluster's user (tests/cluster/ does each)."""

    def __init__(self, node_id: int, place: NodePlace, data: Path, log: Path, cmd: Sequence[str]) -> None:
        self.node_id = node_id
        self.place = place
        self.data = data
        self.log = log
        self._cmd = list(cmd)
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen = False
        self._since = 0

    @property
    def conf(self) -> Path:
        return self.data / "server.properties"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> None:
        """Start the node's process (its log dir formatted already); :meth:`wait_started` waits."""
        if self.running:
            raise RuntimeError(f"node {self.node_id} is running")
        self._since = self.log.stat().st_size if self.log.exists() else 0
        self.frozen = False
        self.proc = launch(self._cmd, self.conf, self.log, self.place.prefix)

    def wait_started(self, timeout_s: float) -> None:
        assert self.proc is not None
        wait_started(self.proc, self.log, self._since, self.place.host, self.place.port, timeout_s,
                     f"Apache Kafka node {self.node_id}")

    def start(self, timeout_s: float = NODE_START_S) -> None:
        """Start the node again with its data (after a kill or a stop), and wait for it."""
        self.launch()
        self.wait_started(timeout_s)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown; the controller learns of it when its session ends."""
        self._signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
        self.frozen = False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (a controlled shutdown: leadership moves first), SIGKILL after ``timeout_s``."""
        if not self.running:
            return
        self.thaw()
        self._signal(signal.SIGTERM)
        assert self.proc is not None
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def freeze(self) -> None:
        """SIGSTOP: the node hangs without dying (a GC pause, a stopped VM); requests to it
        time out instead of failing."""
        self._signal(signal.SIGSTOP)
        self.frozen = self.running

    def thaw(self) -> None:
        if self.frozen:
            self._signal(signal.SIGCONT)
            self.frozen = False


class ApacheKafkaCluster:
    """``with ApacheKafkaCluster(3) as c: c.bootstrap`` – N replicated KRaft nodes.

    ``places``: where each node listens (default: loopback, clients on ``port``, ``port`` + 1,
    ...). ``overrides`` replace server properties of every node; ``scram`` (user, password) makes
    the client listeners SASL_SSL with SCRAM-SHA-512, as :class:`ApacheKafkaBroker` does (the
    nodes' own traffic stays on plaintext listeners of their own). ``log_dir``: where the
    nodes' logs go (``node-<id>.log``; default: the cluster's directory, gone at stop)."""

    def __init__(self, nodes: int = 3, port: int | None = None, log_dir: str | os.PathLike[str] | None = None,
                 overrides: Mapping[str, str] | None = None, scram: tuple[str, str] | None = None,
                 tls_dir: str | os.PathLike[str] | None = None,
                 places: Sequence[NodePlace] | None = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ConfigError(f"--nodes: expected 1 to {MAX_NODES}, got {nodes}")
        if places is not None and len(places) != nodes:
            raise ValueError(f"{len(places)} places for {nodes} nodes")
        self.places = list(places) if places is not None else loopback_places(nodes, port)
        self.bootstrap = ",".join(p.address for p in self.places)
        self._log_dir = Path(log_dir) if log_dir else None
        self._overrides = dict(overrides or {})
        self.scram = scram
        self._tls_dir = Path(tls_dir) if tls_dir else None
        self.ca: Path | None = None
        self.dir: Path | None = None
        self.nodes: list[KafkaNode] = []

    def client_properties(self) -> dict[str, str]:
        """The librdkafka properties a client of this cluster needs besides bootstrap.servers."""
        if self.scram is None:
            return {}
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM, "sasl.username": self.scram[0],
                "sasl.password": self.scram[1], "ssl.ca.location": str(self.ca)}

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def start(self, timeout_s: float = 240.0) -> ApacheKafkaCluster:
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()  # Ctrl-C while starting: no JVM and no log dir stay behind
            raise

    def _start(self, timeout_s: float) -> ApacheKafkaCluster:
        libs = resolve()
        jvm = java()
        self.dir = Path(tempfile.mkdtemp(prefix="ringmaster-kafka-cluster-", dir=self._log_dir))
        logs = self._log_dir or self.dir
        voters = ",".join(f"{i}@{p.host}:{p.controller_port}" for i, p in enumerate(self.places, 1))
        common = {**replication(len(self.places)), **NODE_THREADS, **NODE_REGISTRATION}
        scram: list[str] = []
        certs = None
        if self.scram is not None:
            certs = make_certificates(self._tls_dir or self.dir / "tls")
            self.ca = certs.ca
            scram = scram_format_arguments(self.scram)
        for node_id, place in enumerate(self.places, 1):
            data = self.dir / f"node-{node_id}"
            data.mkdir()
            listeners = {
                "node.id": str(node_id),
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://{place.address},CONTROLLER://{place.host}:{place.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{place.address}",
            }
            if certs is not None:
                listeners.update(secured_properties(place.port, place.port, place.controller_port,
                                                    place.internal_port, certs, place.host))
            props = server_properties(place.port, place.controller_port, place.port, data,
                                      {**common, **listeners, **self._overrides})
            log = logs / f"node-{node_id}.log"
            write_config(data, props, log)
            self.nodes.append(KafkaNode(node_id, place, data, log, jvm_command(jvm, libs, data, NODE_HEAP)))
        cluster = cluster_id()
        # Formatting starts a JVM per node: side by side, it takes the time of one.
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            formats = [pool.submit(format_log_dir, n._cmd, n.conf, cluster, n.log, scram) for n in self.nodes]
            for done in formats:
                done.result()
        for n in self.nodes:  # from this thread: the nodes die with it (PR_SET_PDEATHSIG)
            n.launch()
        # A node's broker starts once the quorum has a leader, which needs a majority of them.
        deadline = time.monotonic() + timeout_s
        for n in self.nodes:
            n.wait_started(max(1.0, deadline - time.monotonic()))
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Every node stopped (SIGTERM together, SIGKILL after ``timeout_s``: the last nodes
        of a quorum that is going away cannot finish a controlled shutdown), then the cluster's
        directory removed."""
        for n in self.nodes:
            # SIGCONT first: a node frozen here, or by a user trying failover (kill -STOP).
            n._signal(signal.SIGCONT)
            n.frozen = False
            n._signal(signal.SIGTERM)
        for n in self.nodes:
            if n.proc is not None:
                try:
                    n.proc.wait(timeout_s)
                except subprocess.TimeoutExpired:
                    n.kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> ApacheKafkaCluster:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
