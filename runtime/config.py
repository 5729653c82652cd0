"""Settings: a TOML file, then RINGMASTER__SECTION__KEY environment overrides, validated.

Runs in: the CLI, before anything touches Kafka. Every problem becomes one ConfigError
whose message names the key (``workers.processes: ...``) so a user can fix it at once.
"""

from __future__ import annotations

import importlib
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from runtime.errors import ConfigError, PluginError

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


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KafkaSettings(_Section):
    bootstrap_servers: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    topics: list[str] = Field(min_length=1)
    consumer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)
    producer: dict[str, LibrdkafkaValue] = Field(default_factory=dict)

    @field_validator("topics")
    @classmethod
    def _topics_not_blank(cls, topics: list[str]) -> list[str]:
        if any(not t.strip() for t in topics):
            raise ValueError("topic names must not be empty")
        return topics

    @field_validator("consumer", "producer")
    @classmethod
    def _managed_keys(cls, props: dict[str, LibrdkafkaValue]) -> dict[str, LibrdkafkaValue]:
        managed = {"bootstrap.servers", "group.id", "enable.auto.commit", "enable.auto.offset.store"}
        clash = sorted(managed & props.keys())
        if clash:
            raise ValueError(f"{', '.join(clash)} is managed by ringmaster; remove it here")
        return props


class WorkerSettings(_Section):
    plugin: str = Field(min_length=1, description="importable module path of the plugin")
    processes: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1, le=512)
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
    pause_above: float = Field(default=0.8, gt=0.0, le=1.0)
    resume_below: float = Field(default=0.4, ge=0.0, lt=1.0)
    batch_timeout_s: float = Field(default=300.0, gt=0, description="plugin time per call")
    setup_timeout_s: float = Field(default=120.0, gt=0, description="import + setup() of a worker")
    start_attempts: int = Field(default=3, ge=1, le=100, description="failed first starts before "
                                "the daemon stops with exit 3")
    heartbeat_timeout_s: float = Field(default=60.0, gt=0, description="a worker silent this long "
                                       "(SIGSTOPped, or holding the GIL) is replaced")
    max_rss_mb: int = Field(default=0, ge=0, description="0 disables RSS recycling")
    max_batches: int = Field(default=0, ge=0, description="0 disables count recycling")
    restart_backoff_s: float = Field(default=0.2, ge=0)
    restart_backoff_max_s: float = Field(default=10.0, ge=0)
    settings: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _watermarks(self) -> WorkerSettings:
        if self.resume_below >= self.pause_above:
            raise ValueError("resume_below must be lower than pause_above (hysteresis)")
        return self


class OutputSettings(_Section):
    topic: str | None = None
    delivery_timeout_s: float = Field(default=30.0, gt=0, description="wait for the broker's "
                                      "acknowledgements of a batch's outputs and dead letters")
    retry_backoff_s: float = Field(default=1.0, ge=0, description="after a failed delivery, first wait")
    retry_backoff_max_s: float = Field(default=30.0, ge=0)


class DeadLetterSettings(_Section):
    topic: str | None = None
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
    status_file: str | None = None
    status_interval_s: float = Field(default=1.0, gt=0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = "text"
    shm_dir: str = "/dev/shm"
    max_partitions: int = Field(default=4096, ge=1)


class AdminSettings(_Section):
    """The admin endpoint (runtime/admin.py): /metrics, /healthz, /readyz, /status."""

    listen: str | None = Field(default=None, description='"127.0.0.1:9464"; off when unset')
    allow_remote: bool = Field(default=False, description="allow a non-loopback listen address "
                               "(the endpoint has no authentication)")
    partition_metrics: bool = Field(default=True, description="per-partition series (lag, offsets, "
                                    "pauses); off for very many partitions")
    loop_stuck_s: float = Field(default=60.0, gt=0, description="/healthz fails when the supervisor's "
                                "loop has not gone round for this long (at least revoke_timeout_s + 10)")
    librdkafka_stats_s: float = Field(default=0.0, ge=0, description="librdkafka statistics every N s "
                                      "as ringmaster_librdkafka_* metrics (0: off)")


class ControlSettings(_Section):
    """Operator pauses (runtime/control.py): a compacted topic per group that every member reads."""

    enabled: bool = True
    topic: str | None = Field(default=None, description="default: _ringmaster.control.<group_id>")
    replication_factor: int = Field(default=-1, description="when the topic is created (-1: the "
                                    "broker's default)")
    load_timeout_s: float = Field(default=30.0, gt=0, description="reading it at start; past this the "
                                  "supervisor does not start (pauses would be unknown)")


class SparkSettings(_Section):
    master: str = "local[*]"
    app_name: str = "ringmaster"
    checkpoint_location: str | None = None  # default: run/spark/<group_id>
    trigger: str = Field(default="5 seconds", description='"availableNow" or a processing-time interval')
    max_records_per_trigger: int = Field(default=100_000, ge=0, description="0: no limit")
    end_offsets: Literal["list", "fetch"] = "list"
    ordering_tasks: int = Field(default=0, ge=0, description="workers.ordering key/unordered: tasks "
                                "records are spread over (0: Spark's default parallelism)")
    conf: dict[str, LibrdkafkaValue] = Field(default_factory=dict)

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, v: str) -> str:
        if v != "availableNow" and not re.fullmatch(r"\d+(\.\d+)?\s*(ms|milliseconds?|s|seconds?|"
                                                    r"minutes?|min)", v.strip()):
            raise ValueError('expected "availableNow" or an interval like "5 seconds"')
        return v


class Settings(_Section):
    kafka: KafkaSettings
    workers: WorkerSettings
    output: OutputSettings = Field(default_factory=OutputSettings)
    dead_letter: DeadLetterSettings = Field(default_factory=DeadLetterSettings)
    supervisor: SupervisorSettings = Field(default_factory=SupervisorSettings)
    control: ControlSettings = Field(default_factory=ControlSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    spark: SparkSettings = Field(default_factory=SparkSettings)


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None,
                  check_plugin: bool = True) -> Settings:
    """Read, override and validate; raise ConfigError/PluginError with one readable line."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = _read_toml(Path(path))
    _apply_env_overrides(raw, os.environ if env is None else env)
    try:
        settings = Settings.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    max_message_bytes(settings)  # read by the runtime itself: a bad value fails here, not mid-run
    if settings.admin.listen:
        parse_listen(settings.admin.listen, settings.admin.allow_remote)  # the same, before any socket
    if check_plugin:
        check_plugin_importable(settings.workers.plugin)
    return settings


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


def _apply_env_overrides(raw: dict[str, Any], env: Mapping[str, str]) -> None:
    """RINGMASTER__WORKERS__PROCESSES=4 sets workers.processes. Under kafka.consumer,
    kafka.producer and spark.conf the last part names a property with dots written as
    underscores (RINGMASTER__KAFKA__CONSUMER__FETCH_MAX_BYTES -> fetch.max.bytes). The value is
    read by the type of the key it sets (_env_value)."""
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


def _describe(exc: ValidationError, path: Any) -> str:
    where = f"config {str(path)!r}" if path is not None else "config"
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if err["type"] == "missing":
            problems.append(f"{key}: required key is missing")
        elif err["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            got = err.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            problems.append(f"{key}: {msg}{shown}")
    return f"{where}: " + "; ".join(problems)


def is_secret_key(key: str) -> bool:
    """Whether a key (a librdkafka/Spark property or a plugin setting) holds a secret."""
    return bool(_SECRET_KEY.search(key)) and not _NOT_SECRET.search(key)


def redacted(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, with secret values replaced."""

    def scrub(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: ("***" if is_secret_key(str(k)) else scrub(v)) for k, v in node.items()}
        if isinstance(node, list):
            return [scrub(v) for v in node]
        return node

    return scrub(settings.model_dump())


def consumer_properties(settings: Settings) -> dict[str, LibrdkafkaValue]:
    """librdkafka consumer config: our defaults, then the user's pass-through, then the
    properties the runtime must own for its guarantees (offsets are ours to store)."""
    props: dict[str, LibrdkafkaValue] = {
        "partition.assignment.strategy": "cooperative-sticky",
        "auto.offset.reset": "earliest",
        # Measured: the default 1000 ms backoff stalls fetching once the queue is full.
        "fetch.queue.backoff.ms": 10,
        "queued.max.messages.kbytes": 16384,
        # Flow control pauses and resumes partitions; a resumed partition is fetched only
        # after the fetch request in flight returns, which a broker may hold this long
        # (confluent-kafka-javascript#363 lowered it for the same reason). Measured with
        # 1 MiB rings: 37,915 records/s at librdkafka's 500 ms, 106,095 at 100 ms (README,
        # Tuning).
        "fetch.wait.max.ms": 100,
        "enable.partition.eof": True,
        # The supervisor calls consume() every few milliseconds whatever the plugin does
        # (only a revocation holds it, for at most revoke_timeout_s), so the default 300 s
        # only makes the group wait longer for a member that died mid-rebalance: brokers that
        # wait a dead member's rebalance timeout (the embedded one does) stall that long.
        "max.poll.interval.ms": max(60_000, int(settings.supervisor.revoke_timeout_s * 3000)),
    }
    if settings.admin.librdkafka_stats_s:
        props["statistics.interval.ms"] = int(settings.admin.librdkafka_stats_s * 1000)
    props.update(settings.kafka.consumer)
    props.update({
        "bootstrap.servers": settings.kafka.bootstrap_servers,
        "group.id": settings.kafka.group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    })
    return props


def producer_properties(settings: Settings) -> dict[str, LibrdkafkaValue]:
    props: dict[str, LibrdkafkaValue] = {
        "linger.ms": 5, "enable.idempotence": True,
        # librdkafka fails a message it could not deliver in this time itself, so a batch
        # waiting for acknowledgements learns of an outage within output.delivery_timeout_s.
        "message.timeout.ms": int(settings.output.delivery_timeout_s * 1000),
    }
    props.update(settings.kafka.producer)
    props["bootstrap.servers"] = settings.kafka.bootstrap_servers
    return props


def max_message_bytes(settings: Settings) -> int:
    """The producer's message.max.bytes (librdkafka's default 1,000,000): the size a dead
    letter is made to fit."""
    try:
        return librdkafka_int(settings.kafka.producer, "message.max.bytes", 1_000_000)
    except ConfigError as exc:
        raise ConfigError(f"kafka.producer.{exc}") from None


def parse_listen(listen: str, allow_remote: bool) -> tuple[str, int]:
    """'9464', ':9464', 'localhost:9464', '127.0.0.1:9464', '0.0.0.0:9464' -> (host, port)."""
    host, sep, port = listen.rpartition(":")
    if not sep:
        host, port = "", listen
    host = host.strip("[]") or "127.0.0.1"
    if host == "localhost":
        host = "127.0.0.1"
    try:
        port_n = int(port)
    except ValueError:
        raise ConfigError(f"admin.listen: {listen!r} is not HOST:PORT") from None
    if not 0 <= port_n < 65536:
        raise ConfigError(f"admin.listen: port {port_n} out of range")
    if host not in ("127.0.0.1", "::1") and not allow_remote:
        raise ConfigError(f"admin.listen: {host} is not loopback; the admin endpoint has no authentication, "
                          "so set admin.allow_remote = true to expose it (behind a firewall)")
    return host, port_n
