"""Settings: a TOML file, then RINGMASTER__SECTION__KEY environment overrides, validated.

Runs in: the CLI, before anything touches Kafka. Every problem becomes one ConfigError
whose message names the key (``workers.processes: ...``) so a user can fix it at once.
The librdkafka properties built from these settings are runtime/kafka/properties.py's.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from runtime import durations
from runtime.errors import ConfigError, KafkaUnreachable, NotCaughtUp, PluginError
from runtime.host import cpu_budget
from runtime.java_client import java_properties
from runtime.subscription import subscribed_by
from runtime.tp import TOPIC_NAME

ENV_PREFIX = "RINGMASTER__"
# Keys whose values are secrets, in librdkafka properties (ssl.key.password, ssl.key.pem, ssl_key,
# ssl.keystore.password, sasl.password, sasl.oauthbearer.config, ...client.secret,
# ...assertion.private.key.passphrase/.pem), Java-style and schema-registry properties
# (sasl.jaas.config, ssl.keystore.key, basic.auth.user.info), Spark/Hadoop conf (fs.s3a.access.key,
# fs.azure.account.key.*) and plugin settings (api_key, auth_token, private_key, ...).
_SECRET_KEY = re.compile(
    r"password|passwd|passphrase|secret|token|credential|jaas|oauthbearer\.config|user\.info"
    r"|(api|private|access|account|keystore)[._-]?key|^ssl[._]key$|\.pem$", re.I)
# ... except where the value only says where a secret is (a path, a URL) or is a public id or a
# count: ssl.key.location, sasl.oauthbearer.assertion.private.key.file, ...token.endpoint.url,
# ...client.credentials.client.id, a plugin's tokenizer or max_tokens.
_NOT_SECRET = re.compile(r"[._-](location|file|path|url|client[._-]id)$|tokeni[sz]|(max|min|num)[._-]?tokens",
                         re.I)
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
    topic: str | None = Field(default=None, description="default: _ringmaster.control.<group_id>")
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


def members_problem(members: int, processes: int) -> str | None:
    """Why ``members`` supervisors cannot share ``processes`` workers (each runs at least one)."""
    if processes >= members:
        return None
    return (f"workers.processes ({processes}) is fewer than supervisor.members ({members}): each member "
            "runs at least one worker; raise workers.processes or lower supervisor.members (--members)")


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None,
                  check_plugin: bool = True) -> Settings:
    """Read, override and validate; raise ConfigError/PluginError with one readable line."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    from_env = _apply_env_overrides(raw, os.environ if env is None else env)
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path, from_env)) from None
    max_message_bytes(settings)  # read by the runtime itself: a bad value fails here, not mid-run
    problem = members_problem(settings.supervisor.members, settings.workers.processes)
    if problem is not None:  # `ringmaster check` says it too, before any member starts
        raise ConfigError(problem)
    check_topic_loops(settings)
    if settings.spark.source == "kafka":
        check_kafka_source(settings)
    problems = share_group_problems(settings)
    if problems:
        raise ConfigError("; ".join(problems))
    problem = guarantee_problem(settings)
    if problem is not None:  # `ringmaster check` says it, before Kafka is touched
        raise ConfigError(problem)
    if settings.admin.listen:
        parse_listen(settings.admin.listen, settings.admin.allow_remote)  # the same, before any socket
    if check_plugin:
        check_plugin_importable(settings.workers.plugin)
    return settings


def check_kafka_source(settings: Settings) -> None:
    """Spark's own Kafka source runs the Java client: every property of kafka.consumer must have
    a Java equivalent (runtime/java_client.py), and it subscribes to topic names (the Python
    source and the planner list partitions by name too)."""
    try:
        java_properties(settings.kafka.consumer)
    except ValueError as exc:
        raise ConfigError(f"kafka.consumer.{exc} (spark.source = \"kafka\")") from None
    patterns = [t for t in settings.kafka.topics if t.startswith("^")]
    if patterns:
        raise ConfigError(f"kafka.topics: {', '.join(patterns)}: the Spark backend reads topics by name, "
                          "not by pattern; list the topics")


# librdkafka properties a share consumer has no use for, and where their meaning lives instead.
_NOT_FOR_SHARE_GROUPS = {
    "group.protocol": "a share group has one protocol",
    "auto.offset.reset": "a share group's start is the group config share.auto.offset.reset "
                         "(ringmaster sets it to earliest when it was never set)",
    "partition.assignment.strategy": "share group members are not assigned partitions",
    "group.instance.id": "share groups have no static members",
    "share.acknowledgement.mode": "ringmaster acknowledges each record, once its outputs are delivered",
    # The client refuses these at construction (the run died with a traceback, issue 27):
    "session.timeout.ms": "it is the group config share.session.timeout.ms, set on the broker side",
    "heartbeat.interval.ms": "it is the group config share.heartbeat.interval.ms, set on the broker side",
}


def share_group_problems(settings: Settings) -> list[str]:
    """What a share group (``kafka.group_type = "share"``) cannot honour, one line each. A
    share group hands a partition's records to several members at once and redelivers any
    record whose lock ran out, so no order holds and no offset marks "done up to here"."""
    if settings.kafka.group_type != "share":
        return []
    problems = []
    if settings.workers.ordering != "unordered":
        problems.append(f'kafka.group_type = "share" hands records out in no order: set workers.ordering = '
                        f'"unordered" (it is {settings.workers.ordering!r})')
    if settings.supervisor.stop_when_caught_up:
        problems.append('kafka.group_type = "share" has no end to catch up with (no offsets are committed): '
                        "remove supervisor.stop_when_caught_up (or --until-caught-up)")
    for key in sorted(_NOT_FOR_SHARE_GROUPS.keys() & settings.kafka.consumer.keys()):
        problems.append(f'kafka.consumer.{key} does not apply to kafka.group_type = "share" '
                        f"({_NOT_FOR_SHARE_GROUPS[key]}); remove it")
    return problems


def guarantee_problem(settings: Settings) -> str | None:
    """Why ``output.guarantee = "exactly-once"`` cannot hold with these settings, in one line
    (None: it can, or it is not asked for). Also checked when ``--until-caught-up`` is added
    to settings that passed load_settings (runtime/cli/daemon.py)."""
    if settings.output.guarantee != "exactly-once":
        return None
    if settings.workers.ordering != "partition":
        # A transaction commits its partition's offset with its outputs: in key/unordered
        # order a later batch finishes first, and its outputs would be committed while the
        # offset stays below an earlier batch still running; a crash then runs it again.
        return (f'output.guarantee = "exactly-once" needs workers.ordering = "partition" (not '
                f'{settings.workers.ordering!r}): in that order batches of a partition finish out of '
                "order, and outputs committed ahead of the partition's offset would be written again "
                "after a crash")
    return None


def check_topic_loops(settings: Settings) -> None:
    """Refuse a configuration that feeds the daemon its own writes: an output, dead-letter or
    control topic that the subscription takes in (equal to an input topic, or matched by a
    ``^pattern``) would be consumed again, and every output would make another (10 records
    became 1,220 in 7 s). Dead letters in the output topic would reach the outputs' consumers
    as if they were outputs. One ConfigError naming every problem, before Kafka is touched.

    ``Output(topic=...)`` from the plugin is its own decision, taken per record at run time:
    allowed, with a warning (runtime/worker/batch_runner.py)."""
    topics = settings.kafka.topics
    problems = []

    def how(entry: str) -> str:
        # Shown as written in the file (a repr would double every backslash of a pattern).
        return (f"matches the subscription pattern '{entry}'" if entry.startswith("^")
                else "is also an input topic")

    written = [("output.topic", settings.output.topic, "its own outputs"),
               ("dead_letter.topic", settings.dead_letter.topic,
                "its own dead letters (and fail them again)")]
    for key, topic, what in written:
        entry = subscribed_by(topics, topic) if topic else None
        if topic and entry is not None:
            problems.append(f"{key} {topic!r} {how(entry)} (kafka.topics): the daemon would consume "
                            f"{what} forever; write them to a topic the group does not read"
                            + (", or narrow the pattern" if entry.startswith("^") else ""))
    if settings.control.enabled:
        control = settings.control.topic_for(settings.kafka.group_id)
        entry = subscribed_by(topics, control)
        if entry is not None:
            problems.append(f"the control topic {control!r} ([control] topic) {how(entry)} (kafka.topics): "
                            "the daemon would process its own pause records; set [control] topic to a "
                            "name outside the subscription, or narrow the pattern")
    if settings.control.status_interval_s:
        status = settings.control.status_topic_for(settings.kafka.group_id)
        entry = subscribed_by(topics, status)
        if entry is not None:
            problems.append(f"the status topic {status!r} (control.status_topic) {how(entry)} "
                            "(kafka.topics): the daemon would process the members' status records; set "
                            "control.status_topic to a name outside the subscription, or narrow the pattern")
    if settings.output.topic and settings.output.topic == settings.dead_letter.topic:
        problems.append(f"dead_letter.topic is output.topic ({settings.output.topic!r}): dead letters "
                        "(failed input records) would reach the outputs' consumers as if they were outputs; "
                        "use a topic of their own")
    if problems:
        raise ConfigError("; ".join(problems))


def check_plugin_importable(module_name: str) -> None:
    """Import the plugin once in the supervisor so a typo fails before Kafka is touched."""
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # any import-time failure of user code, sys.exit() too
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            hint = (f" (searched the current directory {os.getcwd()!r}, PYTHONPATH and the installed "
                    "packages: run ringmaster where the plugin's package is, set PYTHONPATH, or "
                    "install it)")
        raise PluginError(
            f"workers.plugin: cannot import {module_name!r}: {type(exc).__name__}: {exc}{hint}"
        ) from None
    if not callable(getattr(module, "process", None)):
        raise PluginError(f"workers.plugin: module {module_name!r} has no process(batch) function")


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from None


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> dict[tuple[str, ...], str]:
    """RINGMASTER__WORKERS__PROCESSES=4 sets workers.processes. Under kafka.consumer,
    kafka.producer and spark.conf the last part names a property with dots written as
    underscores (RINGMASTER__KAFKA__CONSUMER__FETCH_MAX_BYTES -> fetch.max.bytes). The value is
    read by the type of the key it sets (_env_value). Returns which variable set which key,
    so that an error can name the variable."""
    from_env: dict[tuple[str, ...], str] = {}
    for name, text in sorted(env.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__") if p]
        if len(parts) < 2:
            raise ConfigError(f"environment variable {name}: expected {ENV_PREFIX}SECTION__KEY")
        if parts[:2] in (["kafka", "consumer"], ["kafka", "producer"], ["spark", "conf"]):
            parts = [*parts[:2], ".".join(parts[2:]).replace("_", ".")]
        node = raw
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"environment variable {name}: {part} is not a section")
            node = child
        node[parts[-1]] = _env_value(name, text, _key_kind(parts))
        from_env[tuple(parts)] = name
    return from_env


def _key_kind(parts: list[str]) -> str:
    """How an override of the key at `parts` is read, from the type the models give it:
    "list", "toml" (free-form plugin settings, a whole table) or "text": the string exactly as
    given – a string-typed key keeps it (a secret like ``0x1F`` stays ``0x1F``), a librdkafka
    or Spark property is parsed by its client, and for numbers, booleans and unknown keys
    pydantic validates the text and names the key when it is wrong."""
    model: type[BaseModel] = Settings
    for i, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return "text"
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
            continue
        if i < len(parts) - 1:  # a key inside a table: pass-through properties or plugin settings
            return "toml" if get_args(ann)[1:] == (Any,) else "text"
        return _type_kind(ann)
    return "toml"  # a whole section given as an inline table


def _type_kind(ann: Any) -> str:
    origin = get_origin(ann)
    if origin in (Union, UnionType):
        kinds = {_type_kind(a) for a in get_args(ann) if a is not type(None)}
        return kinds.pop() if len(kinds) == 1 else "text"
    if origin is list:
        return "list"
    if origin is dict:
        return "toml"
    return "text"


def _env_value(name: str, text: str, kind: str) -> Any:
    if kind == "toml":
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            return text
    if kind == "list":
        if not text.lstrip().startswith("["):
            return [item.strip() for item in text.split(",")]
        try:
            return tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"environment variable {name}: expected a TOML array like "
                              f'["a", "b"] or a comma-separated list like a,b ({exc})') from None
    return text


def librdkafka_int(props: Mapping[str, Any], key: str, default: int) -> int:
    """An integer librdkafka property read by the runtime itself (message.max.bytes, ...).

    The config file gives an int, an environment override the string as typed (librdkafka parses
    its properties itself, so pass-through values stay strings): both are accepted here. Only
    decimal digits, as librdkafka accepts; anything else is a ConfigError naming the key."""
    value = props.get(key, default)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        return int(value)
    raise ConfigError(f"{key}: expected an integer (got {value!r})")


def _describe(exc: ValidationError, path: Any, from_env: Mapping[tuple[str, ...], str] | None = None) -> str:
    where = f"config {str(path)!r}" if path is not None else "config"
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        var = (from_env or {}).get(tuple(str(p) for p in err["loc"]))
        source = "" if var is None else f" (set by {var})"
        if err["type"] == "missing":
            problems.append(f"{key}: required key is missing")
        elif err["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key{_did_you_mean(err['loc'])}{source}")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            problems.append(f"{key}: {msg}{shown}{source}")
    return f"{where}: " + "; ".join(problems)


def _did_you_mean(loc: tuple[Any, ...]) -> str:
    """' (did you mean processes?)' for a misspelt key, from the keys its section has."""
    model: type[BaseModel] | None = Settings
    for part in loc[:-1]:
        field = model.model_fields.get(str(part)) if model is not None else None
        ann = field.annotation if field is not None else None
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if model is None:
        return ""
    known = list(model.model_fields)
    close = difflib.get_close_matches(str(loc[-1]).lower(), known, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]}?)"
    section = ".".join(str(p) for p in loc[:-1])
    return f" ({section or 'sections'}: {', '.join(known)})"


def config_keys() -> dict[str, list[str]]:
    """Every configuration key, by section (``{"workers": ["plugin", ...]}``): what the
    documentation must describe (tests/unit/test_docs.py checks it does)."""
    keys: dict[str, list[str]] = {}
    for name, field in Settings.model_fields.items():
        section = field.annotation
        assert isinstance(section, type) and issubclass(section, BaseModel), name  # every section is a model
        keys[name] = list(section.model_fields)
    return keys


def is_secret_key(key: str) -> bool:
    """Whether a key (a librdkafka/Spark property or a plugin setting) holds a secret."""
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def redacted(data: dict[str, Any]) -> dict[str, Any]:
    """Settings as plain data (``effective_settings``, runtime/kafka/properties.py), with every
    secret value replaced: what ``ringmaster check`` prints."""

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: ("***" if is_secret_key(str(k)) else scrub(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    scrubbed: dict[str, Any] = scrub(data)  # a dict in, a dict out
    return scrubbed


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


def max_message_bytes(settings: Settings) -> int:
    """The producer's message.max.bytes (librdkafka's default 1,000,000): the size a dead
    letter is made to fit."""
    try:
        return librdkafka_int(settings.kafka.producer, "message.max.bytes", 1_000_000)
    except ConfigError as exc:
        raise ConfigError(f"kafka.producer.{exc}") from None


def parse_listen(listen: str, allow_remote: bool, option: str = "admin.listen",
                 remote: str = "the admin endpoint has no authentication, so set admin.allow_remote = true "
                               "to expose it (behind a firewall)") -> tuple[str, int]:
    """'9464', ':9464', 'localhost:9464', '127.0.0.1:9464', '0.0.0.0:9464' -> (host, port).
    ``option`` names the setting in errors; ``remote`` says how to allow a non-loopback address."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        host, port = "", listen
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        port_n = int(port)
    except ValueError:
        raise ConfigError(f"{option}: {listen!r} is not HOST:PORT") from None
    if not 0 <= port_n < 65536:
        raise ConfigError(f"{option}: port {port_n} out of range")
    if host not in ("127.0.0.1", "::1") and not allow_remote:
        raise ConfigError(f"{option}: {host} is not loopback; {remote}")
    return host, port_n
