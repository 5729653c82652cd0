"""Checks across the sections of the settings, each a problem a user can fix in one line:
what the settings ask for together that cannot hold (exactly-once in key order, a share group
with an order, an output topic the daemon reads back), and the values the runtime reads itself
(message.max.bytes, the admin endpoint's address). load_settings (loading.py) runs them all;
``ringmaster check`` and the CLI ask some again where a flag changes the settings.

Runs in: the CLI, before anything touches Kafka.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Mapping
from typing import Any

from runtime.config.models import Settings
from runtime.errors import ConfigError, PluginError
from runtime.java_client import java_properties
from runtime.subscription import subscribed_by


def members_problem(members: int, processes: int) -> str | None:
    """Why ``members`` supervisors cannot share ``processes`` workers (each runs at least one)."""
    if processes >= members:
        return None
    return (f"workers.processes ({processes}) is fewer than supervisor.members ({members}): each member "
            "runs at least one worker; raise workers.processes or lower supervisor.members (--members)")


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
    return transaction_timeout_problem(settings)


def transaction_timeout_problem(settings: Settings) -> str | None:
    """librdkafka refuses a transactional producer whose message.timeout.ms (the runtime's
    output.delivery_timeout_s, or the user's own) exceeds its transaction.timeout.ms, and each
    worker would exit at its start; said here, in one line, before anything touches Kafka."""
    producer = settings.kafka.producer
    if "transaction.timeout.ms" not in producer:
        return None  # the runtime's own is never below message.timeout.ms (kafka/properties.py)
    try:
        txn = librdkafka_int(producer, "transaction.timeout.ms", 60_000)
        derived = int(settings.output.delivery_timeout_s * 1000)  # kafka/properties.py
        message = librdkafka_int(producer, "message.timeout.ms", derived)
    except ConfigError as exc:
        return f"kafka.producer.{exc}"
    if message <= txn:
        return None
    source = ("kafka.producer.message.timeout.ms" if "message.timeout.ms" in producer
              else f"output.delivery_timeout_s = {settings.output.delivery_timeout_s:g}")
    return (f"kafka.producer.transaction.timeout.ms ({txn}) is below the producer's message.timeout.ms "
            f"({message}, from {source}): librdkafka refuses that producer; set output.delivery_timeout_s "
            f"to at most {txn / 1000:g} s, or raise transaction.timeout.ms")


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
