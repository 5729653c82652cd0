"""The cluster fault matrix: every way a replicated cluster fails that a single broker cannot
show, in each mode, and what must hold. One row per (fault, mode); a new row is one entry here.

Each row runs against a three-node Apache Kafka cluster whose nodes, and whose daemons'
"hosts", each live in a network namespace of their own (tests/cluster/netns.py), with the
real ``ringmaster run`` (tests/cluster/drive.py), and is judged by an independent reader of
the topics, never by the daemons' logs (tests/cluster/test_cluster_matrix.py):
- 0 records lost: every input record has its output, every poison record its dead letter;
- under exactly-once, each output and each dead letter once to a ``read_committed`` reader;
- no member exits by itself; each stops with exit 0 when asked (a batch run: exit 0 at the
  true end, never a hang);
- the group's commits reach the end;
- the recovery time: from the fault's end to the outputs of every input partition flowing
  again (and to the first commit), written into docs/brokers.md as the failover figures.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a fault does to the cluster (drive.py does it):
KINDS = {
    "leader-killed": "the leader of an input partition is killed (SIGKILL), and started again",
    "leader-frozen": "the leader of an input partition hangs (SIGSTOP), and wakes up",
    "output-leader-killed": "the leader of an output partition is killed, and started again",
    "group-coordinator-killed": "the group coordinator's node is killed: the coordinator moves",
    "group-coordinator-frozen": "the group coordinator's node hangs: every member's session times out",
    "transaction-coordinator-killed": "a worker's transaction coordinator is killed mid-transaction",
    "share-coordinator-killed": "the share coordinator of the share group's partition is killed",
    "node-isolated": "the network splits: the input leader's node cut off from everyone",
    "daemon-cut-from-leader": "one daemon can no longer reach the input leader's node, which the "
                              "others still reach (its packets vanish: requests time out)",
    "throttled-link": "the input leader's link slowed to 256 kbit/s",
    "slow-link": "300 ms of latency each way on the input leader's link (tc netem)",
    "lossy-link": "10 % packet loss each way on the input leader's link (tc netem)",
    "isr-below-min": "the ISR of the outputs and dead letters shrinks below min.insync.replicas: "
                     "NOT_ENOUGH_REPLICAS while a node is down",
    "supervisor-killed": "a supervisor is SIGKILLed and replaced on its host at once",
    "supervisor-replaced-while-node-down": "the input leader's node is killed, and at once a supervisor "
                                           "is SIGKILLed and replaced on its host: the replacement "
                                           "starts (its status and control topics, a share group's "
                                           "config) while the node is down, and publishes its status",
    "supervisor-killed-elsewhere": "a supervisor is SIGKILLed and not replaced: the member on the "
                                   "other host takes its partitions",
}
NETEM = {"slow-link", "lossy-link"}


@dataclass(frozen=True)
class Row:
    kind: str
    mode: str = "at-least-once"  # or "exactly-once", "share"
    protocol: str = "classic"  # or "consumer" (KIP-848)
    batch_run: bool = False  # the daemons run --until-caught-up over a fixed input
    ci: bool = False  # also in ./scripts/test --all (the representative subset)
    hold_s: float = 12.0  # how long the fault lasts
    producer: tuple[tuple[str, int], ...] = ()  # kafka.producer settings of the daemons
    # False: the row measures a documented trade-off (a member on another host cannot fence a
    # dead one's transactions: they end by transaction.timeout.ms), its recovery not held to
    # the aim (test_cluster_matrix.RECOVERY_S)
    aim: bool = True

    @property
    def id(self) -> str:
        parts = [self.kind, self.mode]
        if self.protocol != "classic":
            parts.append(self.protocol)
        if self.batch_run:
            parts.append("batch")
        if self.producer:
            parts += [f"{k}={v}" for k, v in self.producer]
        return "-".join(parts)


ALO, EOS, SHARE = "at-least-once", "exactly-once", "share"
# The trade-off a member on another host lives with under exactly-once: the open transactions
# of a supervisor killed there end only by transaction.timeout.ms.
# librdkafka refuses a message.timeout.ms above it (runtime/config/checks.py): the daemons'
# output.delivery_timeout_s is lowered below it (drive._config).
SHORT_TXN = (("transaction.timeout.ms", 15000),)

ROWS: list[Row] = [
    # ------------------------------------------------------------------ a leader lost
    Row("leader-killed", ALO, ci=True),
    Row("leader-killed", ALO, "consumer"),
    Row("leader-killed", EOS),
    Row("leader-killed", SHARE),
    Row("leader-killed", ALO, batch_run=True),
    Row("leader-frozen", ALO),
    Row("leader-frozen", EOS),
    Row("output-leader-killed", EOS),
    # ------------------------------------------------------------------ a coordinator moves
    Row("group-coordinator-killed", ALO),
    Row("group-coordinator-killed", ALO, "consumer"),
    Row("group-coordinator-killed", EOS, ci=True),
    Row("group-coordinator-killed", EOS, batch_run=True),
    Row("group-coordinator-killed", SHARE),
    Row("group-coordinator-frozen", ALO),
    Row("group-coordinator-frozen", EOS),
    Row("group-coordinator-frozen", EOS, "consumer"),
    Row("transaction-coordinator-killed", EOS),
    Row("share-coordinator-killed", SHARE),
    # ------------------------------------------------------------------ the network splits
    Row("node-isolated", ALO, ci=True),
    Row("node-isolated", EOS, ci=True),
    Row("daemon-cut-from-leader", ALO),
    Row("daemon-cut-from-leader", EOS),
    Row("throttled-link", ALO),
    Row("slow-link", ALO),
    Row("lossy-link", EOS),
    # ------------------------------------------------------------------ replicas short
    Row("isr-below-min", ALO),
    Row("isr-below-min", EOS),
    # ------------------------------------------------------------------ a member dies
    Row("supervisor-killed", EOS, hold_s=0.0),
    Row("supervisor-replaced-while-node-down", ALO),
    Row("supervisor-replaced-while-node-down", SHARE),
    Row("supervisor-killed-elsewhere", EOS, hold_s=0.0, aim=False),
    Row("supervisor-killed-elsewhere", EOS, hold_s=0.0, producer=SHORT_TXN),
]
ROWS_BY_ID = {r.id: r for r in ROWS}
assert len(ROWS_BY_ID) == len(ROWS), "row ids are unique"
