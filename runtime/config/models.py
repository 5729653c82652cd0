"""The settings' models: one pydantic model per section of the TOML file, each key with its
type, default, bounds and description, and the checks that need only their own section
(a security section set once, a topic name Kafka accepts, a Unix socket path that fits).
Checks across sections are checks.py's; reading a file and the environment is loading.py's.

Runs in: the CLI, before anything touches Kafka (and every process that reads the settings).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

from runtime import durations
from runtime.errors import KafkaUnreachable, NotCaughtUp, PluginError
from runtime.host import cpu_budget
from runtime.tp import TOPIC_NAME

LibrdkafkaValue = str | int | float | bool
_SUN_PATH_MAX = 108  # sockaddr_un.sun_path on Linux, the terminating NUL included


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# [kafka.security] -> the librdkafka property each sets, in every client (the consumer, the
# producers of the supervisor and the workers, admin clients, redrive, produce/tail, Spark).
SECURITY_PROPERTIES = {"protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
                       "username": "sasl.username", "password": "sasl.password",
                       "ca_location": "ssl.ca.location"}


def _first_line(path: str) -> str:
    """A secret file's first line; ValueError (never the content) when it cannot be had."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path!r} cannot be read: {type(exc).__name__}") from None
    line = text.splitlines()[0] if text.strip() else ""
    if not line:
        raise ValueError(f"{path!r} is empty")
    return line


class KafkaSecuritySettings(_Section):
    """Credentials and TLS for every Kafka client the runtime makes (docs/security.md)."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = Field(
        default=None, description="security.protocol (unset: librdkafka's PLAINTEXT)")
    sasl_mechanism: Literal["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN"] | None = None
    username: str | None = Field(default=None, min_length=1)
    password: SecretStr | None = Field(default=None, description="better given as "
                                       "RINGMASTER__KAFKA__SECURITY__PASSWORD, or in password_file")
    password_file: str | None = Field(default=None, description="a file holding the password (one "
                                      "line; a trailing newline is dropped), read at start")
    ca_location: str | None = Field(default=None, description="PEM file of the CA(s) that signed the "
                                    "brokers' certificates (unset: the system's)")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaSecuritySettings:
        if self.password is not None and self.password_file is not None:
            raise ValueError("set password or password_file, not both")
        has_password = self.password is not None or self.password_file is not None
        if (self.username is None) != (not has_password):
            raise ValueError("username and a password (password or password_file) go together")
        sasl = self.protocol is not None and self.protocol.startswith("SASL_")
        if self.username is not None and not sasl:
            raise ValueError('a username needs protocol = "SASL_SSL" (or "SASL_PLAINTEXT")')
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"protocol = {self.protocol!r} needs sasl_mechanism "
                             '(e.g. "SCRAM-SHA-512")')
        return self

    @field_validator("password_file")
    @classmethod
    def _readable(cls, path: str | None) -> str | None:
        if path is not None:
            _first_line(path)
        return path

    @field_validator("ca_location")
    @classmethod
    def _a_file(cls, path: str | None) -> str | None:
        if path is not None and not os.path.isfile(path):
            raise ValueError(f"{path!r} is not a file")
        return path

    def read_password(self) -> str | None:
        """The password: ``password``, or the first line of ``password_file`` (read on each
        call: a client made after the file changed gets the new one)."""
        if self.password is not None:
            return self.password.get_secret_value()
        return None if self.password_file is None else _first_line(self.password_file)


class KafkaSettings(_Section):
    bootstrap_servers: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    topics: list[str] = Field(min_length=1)
    connect_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, description="how long `run --until-caught-up` and the operator "
        "commands (pause, resume) wait for the cluster to answer before giving up with exit "
        f"{KafkaUnreachable.exit_code}; the daemon waits as long as it takes")
    group_type: Literal["consumer", "share"] = Field(
        default="consumer", description="consumer: a consumer group, each partition read by one member; "
        "share: a share group (KIP-932, Apache Kafka 4.2+), records handed out one by one to any "
        "member and acknowledged each on its own (docs/share-groups.md)")
    consumer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    producer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    security: KafkaSecuritySettings = Field(
        default_factory=KafkaSecuritySettings, description="credentials and TLS for every client "
        "(docs/security.md)")

    @model_validator(mode="after")
    def _security_set_once(self) -> KafkaSettings:
        """A property set both in [kafka.security] and a pass-through table would leave one of
        the two silently unused."""
        owned = {SECURITY_PROPERTIES[k] for k in self.security.model_fields_set
                 if k in SECURITY_PROPERTIES}
        if self.security.password_file is not None:
            owned.add("sasl.password")
        for table, props in (("consumer", self.consumer), ("producer", self.producer)):
            clash = sorted(owned & props.keys())
            if clash:
                raise ValueError(f"kafka.{table} sets {', '.join(clash)}, which [kafka.security] sets too; "
                                 "keep one")
        return self

    @field_validator("topics")
    @classmethod
    def _topics_not_blank(cls, topics: list[str]) -> list[str]:
        if any(not t.strip() for t in topics):
            raise ValueError("topic names must not be empty")
        for t in topics:
            if t.startswith("^"):
                try:
                    re.compile(t)
                except re.error as exc:
                    raise ValueError(f"{t!r} is not a valid regular expression ({exc})") from None
        return topics

    @field_validator("consumer", "producer")
    @classmethod
    def _managed_keys(cls, props: dict[str, LibrdkafkaValue]) -> dict[str, LibrdkafkaValue]:
        managed = {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store"}
        clash = sorted(managed & props.keys())
        if clash:
            raise ValueError(f"{', '.join(clash)} is managed by ringmaster; remove it here")
        return props

    @field_validator("consumer")
    @classmethod
    def _group_protocol(cls, props: dict[str, LibrdkafkaValue]) -> dict[str, LibrdkafkaValue]:
        protocol = group_protocol(props)
        if protocol not in ("classic", "consumer"):
            raise ValueError(f"group.protocol = {protocol!r}: expected \"classic\" or \"consumer\"")
        if protocol == "consumer":
            # KIP-848: the broker owns these (librdkafka refuses them at start, in words
            # that do not say where to set them instead).
            owned = sorted(BROKER_OWNED_UNDER_KIP848.keys() & props.keys())
            if owned:
                where = ", ".join(f"{k} (the broker's {BROKER_OWNED_UNDER_KIP848[k]})" for k in owned)
                raise ValueError(f'group.protocol = "consumer" leaves these to the broker; remove {where}')
        return props


class WorkerSettings(_Section):
    plugin: str = Field(min_length=1, description="importable module path of the plugin")
    processes: int = Field(
        default_factory=lambda: cpu_budget().count, ge=1, le=512, description="worker processes; "
        "default: the CPUs this process may use (the smallest of the affinity mask, the cgroup CPU "
        "quota rounded down, and the CPU count)")
    max_processes: int = Field(
        default=0, ge=0, le=512, description="the most workers `ringmaster scale` (or SIGTTIN) may run "
        "(0: processes). Fixed for the run: key ordering's lanes per partition, and each worker slot "
        "ever used holds a ring of ring_bytes in supervisor.shm_dir until the daemon stops")
    start_method: Literal["spawn", "forkserver"] = "spawn"
    ordering: Literal["partition", "key", "unordered"] = Field(
        default="partition", description="partition: one worker per partition, offset order; key: "
        "records spread over workers by key, each key in offset order; unordered: any worker")
    max_uncommitted_records: int = Field(
        default=20_000, ge=1, description="key/unordered: how far a partition may run ahead of its "
        "committed offset before it pauses (bounds duplicates after a rebalance, and memory)")
    ring_bytes: int = Field(default=8 * 1024 * 1024, ge=64 * 1024)
    batch_max_records: int = Field(default=500, ge=1, le=100_000)
    batch_max_wait_ms: int = Field(default=20, ge=0, le=10_000)
    batch_target_ms: float = Field(
        default=10.0, ge=0, le=60_000, description="plugin time one batch should take: batches are cut "
        "to about this much work (µs per record learnt from the workers), so that a record does not "
        "wait long behind the others of its batch (up to 4x that while a partition has a backlog of 24 "
        "such batches); 0: only batch_max_records and ring size bound it")
    pipelined_delivery: bool = Field(
        default=False, description="at-least-once: a worker runs its next batch while the broker "
        "acknowledges the last one's outputs, and reports that batch as soon as they are in (issue 41: "
        "+1-2 % of ideal with 0.5 ms acknowledgements, simulated); off by default: a worker that dies "
        "within milliseconds of starting a batch, before the batch before it is acknowledged, sends "
        "that one back too, and its outputs may be written twice")
    pause_above: float = Field(default=0.8, gt=0.0, le=1.0)
    resume_below: float = Field(default=0.4, ge=0.0, lt=1.0)
    batch_timeout_s: float = Field(default=300.0, gt=0, description="plugin time per call")
    setup_timeout_s: float = Field(default=120.0, gt=0, description="import + setup() of a worker")
    start_attempts: int = Field(default=3, ge=1, le=100, description="failed first starts before "
                                f"the daemon stops with exit {PluginError.exit_code}")
    heartbeat_timeout_s: float = Field(default=60.0, gt=0, description="a worker silent this long "
                                       "(SIGSTOPped, or holding the GIL) is replaced")
    max_rss_mb: int = Field(default=0, ge=0, description="0 disables RSS recycling")
    max_batches: int = Field(default=0, ge=0, description="0 disables count recycling")
    restart_backoff_s: float = Field(default=0.2, ge=0)
    restart_backoff_max_s: float = Field(default=10.0, ge=0)
    settings: dict[str, Any] = Field(default_factory=dict)

    @field_validator("plugin")
    @classmethod
    def _module_name(cls, plugin: str) -> str:
        """A file name or a path where a module name belongs is the commonest first mistake."""
        name = plugin.strip()
        if name.endswith(".py") or "/" in name or "\\" in name:
            path = Path(name)
            module = path.stem if path.suffix == ".py" else path.name
            where = str(path.parent)
            hint = "" if where in ("", ".") else (f", with {where!r} on the import path (start ringmaster "
                                                 f"there, or set PYTHONPATH={where})")
            raise ValueError(f"{plugin!r} is a file name; use the module name {module!r}{hint}")
        return plugin

    @model_validator(mode="after")
    def _watermarks(self) -> WorkerSettings:
        if self.resume_below >= self.pause_above:
            raise ValueError("resume_below must be lower than pause_above (hysteresis)")
        if self.max_processes and self.max_processes < self.processes:
            raise ValueError(f"max_processes ({self.max_processes}) must be at least processes "
                             f"({self.processes})")
        return self

    @property
    def processes_from(self) -> str:
        """What set ``processes``: the key, or what bounds the CPUs this process may use."""
        if "processes" in self.model_fields_set:
            return "workers.processes"
        budget = cpu_budget()
        return budget.why if budget.count == self.processes else "the CPUs this process may use"

    @property
    def process_limit(self) -> int:
        """The most workers the daemon may run: max_processes, or processes when it is 0."""
        return self.max_processes or self.processes


# TOPIC_NAME (runtime/tp.py) is checked at start for the topics the configuration names, so that
# an invalid topic is only ever one a plugin routed an output to: that one is the record's fault
# (runtime/kafka/producer.py), a configured one would fail them all.


class OutputSettings(_Section):
    topic: str | None = Field(default=None, pattern=TOPIC_NAME)
    guarantee: Literal["at-least-once", "exactly-once"] = Field(
        default="at-least-once", description="exactly-once: each batch's outputs, dead letters and "
        "consumed offsets are committed in one Kafka transaction (docs/exactly-once.md); needs "
        "workers.ordering = \"partition\" and a broker with transactions")
    delivery_timeout_s: float = Field(default=30.0, gt=0, description="wait for the broker's "
                                      "acknowledgements of a batch's outputs and dead letters")
    retry_backoff_s: float = Field(default=1.0, ge=0, description="after a failed delivery, first wait")
    retry_backoff_max_s: float = Field(default=30.0, ge=0)


class DeadLetterSettings(_Section):
    topic: str | None = Field(default=None, pattern=TOPIC_NAME)
    max_attempts: int = Field(default=3, ge=1, le=100)
    retry_backoff_s: float = Field(default=0.1, ge=0)
    retry_backoff_max_s: float = Field(default=5.0, ge=0)
    max_crashes: int = Field(default=2, ge=1, le=100)


class SupervisorSettings(_Section):
    commit_interval_ms: int = Field(default=1000, ge=10)
    revoke_timeout_s: float = Field(default=10.0, gt=0)
    shutdown_timeout_s: float = Field(default=30.0, gt=0)
    stop_when_caught_up: bool = False
    caught_up_idle_s: float = Field(default=0.0, ge=0)
    caught_up_timeout_s: float = Field(
        default=300.0, ge=0, description="--until-caught-up: stop with exit "
        f"{NotCaughtUp.exit_code} after this long without progress (records fetched or handled, "
        "batches in workers, rebalances; a batch deferred again "
        "and again is not progress; an operator pause waits); 0: wait for ever")
    status_file: str | None = None
    status_interval_s: float = Field(default=1.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    shm_dir: str = "/dev/shm"
    max_partitions: int = Field(default=4096, ge=1)
    members: int = Field(
        default=1, ge=1, le=64, description="supervisor processes of the group that `ringmaster run` "
        "starts on this host (each a daemon with its own consumer, rings and control socket), "
        "splitting workers.processes and workers.max_processes between them; past one supervisor's "
        "per-record ceiling with light work (docs/scaling.md)")
    control_socket: str | None = Field(
        default=None, description="the Unix socket `ringmaster reload`/`scale` talk to (mode 0600); "
        "default /tmp/ringmaster-<uid>/<group_id>.sock; \"\" turns it off (signals still work)")

    @field_validator("control_socket")
    @classmethod
    def _socket_path(cls, v: str | None) -> str | None:
        if v:
            if not os.path.isabs(v):
                raise ValueError("must be an absolute path (the daemon and the CLI may run in different "
                                 "directories)")
            if len(os.fsencode(v)) >= _SUN_PATH_MAX:
                raise ValueError(f"a Unix socket path must be shorter than {_SUN_PATH_MAX} bytes")
        return v


class AdminSettings(_Section):
    """The admin endpoint (runtime/ops/admin_server.py): /metrics, /healthz, /readyz, /status."""

    listen: str | None = Field(default=None, description='"127.0.0.1:9464"; off when unset')
    allow_remote: bool = Field(default=False, description="allow a non-loopback listen address "
                               "(the endpoint has no authentication)")
    partition_metrics: bool = Field(default=True, description="per-partition series (lag, offsets, "
                                    "pauses); off for very many partitions")
    loop_stuck_s: float = Field(default=60.0, gt=0, description="/healthz fails when the supervisor's "
                                "loop has not gone round for this long (at least revoke_timeout_s + 10)")
    librdkafka_stats_s: float = Field(default=0.0, ge=0, description="librdkafka statistics every N s "
                                      "as ringmaster_librdkafka_* metrics (0: off)")
    max_connections: int = Field(default=64, ge=1, le=10_000, description="open connections at most; "
                                 "at the cap the longest-waiting idle one is closed for a new one")
    request_timeout_s: float = Field(default=10.0, gt=0, le=3600, description="a client's time to send "
                                     "its request (and to read the answer, and idle between requests)")


class ControlSettings(_Section):
    """Operator pauses (runtime/ops/control.py): a compacted topic per group that every member reads."""

    def topic_for(self, group_id: str) -> str:
        """The control topic: ``topic``, or ``_ringmaster.control.<group_id>`` by default."""
        return self.topic or "_ringmaster.control." + re.sub(r"[^a-zA-Z0-9._-]", "_", group_id)

    enabled: bool = True
    topic: str | None = Field(default=None, pattern=TOPIC_NAME,
                              description="default: _ringmaster.control.<group_id>")
    replication_factor: int = Field(default=-1, description="when the topic is created (-1: the "
                                    "broker's default)")
    load_timeout_s: float = Field(default=30.0, gt=0, description="reading it at start; past this the "
                                  "supervisor does not start (pauses would be unknown)")
    status_interval_s: float = Field(default=5.0, ge=0, description="each member publishes a status record "
                                     "to the status topic this often, for `ringmaster console` (0: off)")
    status_topic: str | None = Field(default=None, pattern=TOPIC_NAME,
                                     description="default: _ringmaster.status.<group_id>")

    def status_topic_for(self, group_id: str) -> str:
        """The status topic: ``status_topic``, or ``_ringmaster.status.<group_id>`` by default."""
        return self.status_topic or "_ringmaster.status." + re.sub(r"[^a-zA-Z0-9._-]", "_", group_id)


# Options of Spark's Kafka source that ringmaster derives from the rest of the config; Spark
# itself refuses the consumer properties it owns (kafka.auto.offset.reset, deserializers...).
_SPARK_KAFKA_MANAGED = frozenset(k.lower() for k in (
    "subscribe", "subscribePattern", "assign", "startingOffsets", "endingOffsets", "startingTimestamp",
    "endingTimestamp", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "includeHeaders",
    "maxOffsetsPerTrigger", "kafka.bootstrap.servers", "kafka.group.id", "groupIdPrefix"))


class SparkSettings(_Section):
    master: str = "local[*]"
    app_name: str = "ringmaster"
    checkpoint_location: str | None = None  # default: run/spark/<group_id>
    trigger: str = Field(default="5 seconds", description='"availableNow" or a processing-time interval '
                         '(a duration: 5s, 1m30s, 5 seconds)')
    max_records_per_trigger: int = Field(default=100_000, ge=0, description="0: no limit")
    end_offsets: Literal["checked", "list", "fetch"] = Field(
        default="checked", description="how a partition's end is found: checked (ListOffsets, then "
        "one fetch there: never short of the end, whatever the broker), list (ListOffsets alone), "
        "fetch (a fetch from the low watermark)")
    ordering_tasks: int = Field(default=0, ge=0, description="workers.ordering key/unordered: tasks "
                                "records are spread over (0: Spark's default parallelism)")
    conf: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    source: Literal["python", "kafka"] = Field(
        default="python", description="what reads the input topics: python (ringmaster's own source, "
        "runtime/spark/source.py) or kafka (Spark's own, spark-sql-kafka-0-10, resolved with Maven; "
        "docs/spark.md says when to use which)")
    kafka_options: dict[str, LibrdkafkaValue] = Field(
        default_factory=dict, description='source = "kafka" only: options of Spark\'s Kafka source, '
        'as given ("kafka.ssl.keystore.location", "failOnDataLoss", "minPartitions")')
    kafka_source_version: str | None = Field(
        default=None, description='source = "kafka": the spark-sql-kafka-0-10 version (default: '
        "PySpark's, or the newest on Maven Central before it)")

    @model_validator(mode="after")
    def _kafka_source_only(self) -> SparkSettings:
        if self.source != "kafka":
            given = [k for k in ("kafka_options", "kafka_source_version") if getattr(self, k)]
            if given:
                raise ValueError(f"{', '.join(given)} only apply to source = \"kafka\" (source is "
                                 f"{self.source!r}): remove them, or set source = \"kafka\"")
        managed = sorted(k for k in self.kafka_options if k.lower() in _SPARK_KAFKA_MANAGED)
        if managed:
            raise ValueError(f"kafka_options: {', '.join(managed)} is set by ringmaster from [kafka] "
                             "and [spark] (topics, offsets, limits); remove it")
        return self

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, v: str) -> str:
        if v != "availableNow":
            try:
                seconds = durations.parse_duration(v)
            except ValueError as exc:
                raise ValueError(f'expected "availableNow" or an interval: {exc}') from None
            if seconds <= 0:
                raise ValueError('expected "availableNow" or an interval above 0, like "5s"')
        return v

    def trigger_ms(self) -> int | None:
        """The processing-time trigger in milliseconds (what Spark is given, whatever the unit
        written); None for "availableNow"."""
        if self.trigger == "availableNow":
            return None
        return max(1, round(durations.parse_duration(self.trigger) * 1000))


class Settings(_Section):
    kafka: KafkaSettings
    workers: WorkerSettings
    output: OutputSettings = Field(default_factory=OutputSettings)
    dead_letter: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)


# Under KIP-848 (group.protocol = "consumer") the group's timing and assignor are the
# broker's settings (or the group's, kafka-configs --entity-type groups): librdkafka refuses
# the client-side ones.
BROKER_OWNED_UNDER_KIP848 = {
    "session.timeout.ms": "group.consumer.session.timeout.ms",
    "heartbeat.interval.ms": "group.consumer.heartbeat.interval.ms",
    "partition.assignment.strategy": "group.consumer.assignors; the client may pick one "
                                     "with group.remote.assignor",
}


def group_protocol(props: Mapping[str, Any]) -> str:
    """The group protocol a consumer config asks for: "classic" (librdkafka's default) or
    "consumer" (KIP-848)."""
    return str(props.get("group.protocol", "classic")).strip().lower()
