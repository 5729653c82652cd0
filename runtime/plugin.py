"""The plugin contract (stable: other tools depend on it) and its loader.

A plugin is a module with ``process(batch)`` and optional ``setup(context)`` and
``teardown()``. ``batch`` is a sequence of :class:`Record`. ``process`` returns an
iterable of outputs, or None. An output is

* ``bytes`` – a value produced to ``[output] topic`` with no key;
* ``(key, value)`` – a keyed value;
* :class:`Output` – value, key, headers, and optionally another topic;
* :class:`Reject` – marks one input record as failed without raising: it goes to the
  dead-letter topic with the given reason (the rest of the batch goes on).

An exception fails the batch: it is retried, then bisected to find the failing records,
which go to the dead-letter topic. The same module runs unchanged on Spark.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from runtime.errors import PluginError

Headers = list[tuple[str, bytes | None]]


class Record:
    """One input record. ``timestamp`` is ``(type, ms)`` as confluent-kafka gives it."""

    __slots__ = ("headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, headers: Headers | None, timestamp: tuple[int, int]) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp

    def __repr__(self) -> str:
        return f"Record({self.topic}[{self.partition}]@{self.offset})"


@dataclass(frozen=True, slots=True)
class Output:
    value: bytes | None
    key: bytes | None = None
    headers: Headers | None = None
    topic: str | None = None  # None: the configured [output] topic


@dataclass(frozen=True, slots=True)
class Reject:
    record: Record
    reason: str


@dataclass
class Context:
    """Given to ``setup``. Runs in: a worker process (or a Spark Python worker)."""

    worker_id: str
    settings: Mapping[str, Any] = field(default_factory=dict)
    output_topic: str | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("ringmaster.plugin"))


@dataclass(frozen=True)
class Plugin:
    name: str
    process: Callable[[Sequence[Record]], Iterable[Any] | None]
    setup: Callable[[Context], None] | None
    teardown: Callable[[], None] | None


def load_plugin(name: str) -> Plugin:
    try:
        module: ModuleType = importlib.import_module(name)
    except Exception as exc:
        raise PluginError(f"cannot import plugin {name!r}: {type(exc).__name__}: {exc}") from exc
    process = getattr(module, "process", None)
    if not callable(process):
        raise PluginError(f"plugin {name!r} has no process(batch) function")
    setup = getattr(module, "setup", None)
    teardown = getattr(module, "teardown", None)
    return Plugin(name, process, setup if callable(setup) else None,
                  teardown if callable(teardown) else None)


def normalize_output(item: Any, default_topic: str | None) -> Output | Reject:
    """Turn whatever ``process`` yielded into an Output or a Reject, or raise TypeError."""
    if isinstance(item, Output | Reject):
        return item
    if isinstance(item, bytes | bytearray | memoryview):
        return Output(bytes(item))
    if isinstance(item, tuple) and len(item) == 2:
        key, value = item
        return Output(_as_bytes(value), _as_bytes(key))
    if isinstance(item, str):
        return Output(item.encode())
    raise TypeError(f"process() yielded {type(item).__name__}; expected bytes, (key, value), "
                    "Output or Reject")


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    raise TypeError(f"output key/value must be bytes or str, not {type(v).__name__}")
