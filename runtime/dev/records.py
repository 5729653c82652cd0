"""``ringmaster produce`` and ``ringmaster tail``: put test records into a topic and read what
comes out, with the config's own connection settings, so that trying a plugin needs no
producer or consumer of one's own. Meant for development and debugging, on any cluster.

Runs in: the CLI.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator

from runtime.config import Settings
from runtime.errors import ConfigError
from runtime.execution.deadletter_format import HEADER_PREFIX
from runtime.kafka.admin import admin_properties, create_topic
from runtime.kafka.producer import write_acknowledged
from runtime.kafka.properties import consumer_properties, producer_properties
from runtime.kafka.topic_reader import Item, tail


def input_topic(settings: Settings, topic: str | None) -> str:
    """--topic, or the config's input topic when it has exactly one."""
    if topic:
        return topic
    if len(settings.kafka.topics) != 1:
        raise ConfigError(f"the config reads {len(settings.kafka.topics)} topics "
                          f"({', '.join(settings.kafka.topics)}); say which with --topic")
    return settings.kafka.topics[0]


def records_of(lines: Iterable[str], key_separator: str | None) -> Iterator[tuple[bytes | None, bytes]]:
    """One record per line (its end of line dropped) or argument; with a separator, the key
    comes first (``a=hello`` with ``=``); without one in the text, the key is null."""
    for line in lines:
        text = line.rstrip("\r\n")
        if key_separator and key_separator in text:
            key, value = text.split(key_separator, 1)
            yield key.encode(), value.encode()
        else:
            yield None, text.encode()


def produce_lines(settings: Settings, topic: str, lines: Iterable[str], key_separator: str | None,
                  partitions: int, existing: Collection[str]) -> tuple[int, bool]:
    """Write each line as a record, acknowledged by the broker; create the topic first if it is
    not among ``existing`` (the cluster's topics, as the caller's reachability check read them).
    Returns (records written, whether the topic was created)."""
    props = producer_properties(settings)
    created = False
    if topic not in existing:
        created = create_topic(admin_properties(props), topic, partitions)
    return write_acknowledged(props, topic, records_of(lines, key_separator)), created


def output_topic(settings: Settings, topic: str | None, dead_letters: bool) -> str:
    if topic:
        return topic
    chosen = settings.dead_letter.topic if dead_letters else settings.output.topic
    if chosen is None:
        section = "[dead_letter] topic" if dead_letters else "[output] topic"
        raise ConfigError(f"the config has no {section}; say which topic with --topic")
    return chosen


def reader_properties(settings: Settings) -> dict[str, object]:
    """An assign-only reader with the group's connection settings and a group id of its own
    (it joins nothing and commits nothing)."""
    props: dict[str, object] = {k: v for k, v in consumer_properties(settings).items()
             if k not in ("partition.assignment.strategy", "group.instance.id", "statistics.interval.ms")}
    props.update({"group.id": f"{settings.kafka.group_id}.ringmaster-tail", "auto.offset.reset": "earliest"})
    return props


def describe(item: Item, keys: bool) -> str:
    """One line per record: the value (and the key, tab-separated, with ``keys``); a dead
    letter also says where its record came from and why it failed."""
    value = _text(item.value)
    headers = {k: v for k, v in item.headers}
    error = headers.get(HEADER_PREFIX + "error.type")
    if error is not None:
        where = "{}[{}]@{}".format(*(_text(headers.get(HEADER_PREFIX + f"source.{f}"))
                                     for f in ("topic", "partition", "offset")))
        why = f"{_text(error)}: {_text(headers.get(HEADER_PREFIX + 'error.message'))}"
        value = f"{where} {why}" + (f" | {value}" if value else "")
    return f"{_text(item.key)}\t{value}" if keys else value


def _text(b: bytes | None) -> str:
    return "" if b is None else b.decode("utf-8", errors="backslashreplace").replace("\n", "\\n")


def tail_lines(settings: Settings, topic: str, keys: bool, max_records: int | None,
               timeout_s: float | None, clock: Callable[[], float] = time.monotonic,
               last: int | None = None, follow: bool = True) -> Iterator[str]:
    """The topic's records as lines: from its beginning, following it; or (``last``) the last
    N of each partition, partition by partition, then following it only with ``follow``.
    Stops after ``max_records`` or once ``timeout_s`` passes without reaching them."""
    deadline = None if timeout_s is None else clock() + timeout_s
    seen = 0

    def stop() -> bool:
        return (max_records is not None and seen >= max_records) or \
            (deadline is not None and clock() > deadline)

    for item in tail(topic, reader_properties(settings), stop, last=last, follow=follow):
        seen += 1
        yield describe(item, keys)
