"""The plugin contract (stable: other tools depend on it) and its loader.

A plugin is a module with ``process(batch)`` and optional ``setup(context)`` and
``teardown()``. ``batch`` is a list of :class:`Record`, copies made for that call: the
plugin may change them (and the list) freely; retries, bisection and dead letters use the
records as read. A ``Reject`` names a record of the batch it was given. ``process`` returns an
iterable of outputs, or None. An output is

* ``bytes`` – a value produced to ``[output] topic`` with no key;
* ``(key, value)`` – a keyed value;
* :class:`Output` – value, key, headers, and optionally another topic;
* :class:`Reject` – marks one input record as failed without raising: it goes to the
  dead-letter topic with the given reason (the rest of the batch goes on).

Anything else (a ``str`` or ``dict`` returned whole, a number, an ``Output`` whose value is
not bytes...) fails the batch with a ``TypeError`` that names the type and the fix, inside
the same retry/dead-letter path as a plugin exception.

An exception fails the batch: it is retried, then bisected to find the failing records,
which go to the dead-letter topic. ``SystemExit`` (``sys.exit(n)`` in plugin code) counts
as an exception of the batch, whatever ``n``. Raising :class:`Backoff` is not a failure: the
batch is tried again later, in order, and its partition (or every partition) waits
meanwhile – a circuit breaker for a failing downstream. The same module runs unchanged on
Spark.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from runtime.backoff import backoff_s
from runtime.errors import BatchDeferred, PluginError

Headers = list[tuple[str, bytes | None]]


class Record:
    """One input record. ``timestamp`` is ``(type, ms)`` as confluent-kafka gives it.
    ``delivery_count``: in a share group (``kafka.group_type = "share"``), how many times the
    broker has handed this record out, this time included (above 1: a member before did not
    finish it); None in a consumer group."""

    __slots__ = ("_delivery_count", "headers", "key", "offset", "partition", "timestamp", "topic", "value")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None,
                 value: bytes | None, headers: Headers | None, timestamp: tuple[int, int],
                 delivery_count: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.key = key
        self.value = value
        self.headers = headers
        self.timestamp = timestamp
        if delivery_count is not None:
            self._delivery_count = delivery_count

    @property
    def delivery_count(self) -> int | None:
        # Left unset when None: the workers' fast paths fill the other slots only.
        return getattr(self, "_delivery_count", None)

    @delivery_count.setter
    def delivery_count(self, n: int | None) -> None:
        if n is not None:
            self._delivery_count = n

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


MAX_BACKOFF_S = 3600.0  # one Backoff waits at most this long; raise it again to wait more
_MAX_BACKOFF_DOUBLINGS = 6


def backoff_wait(seconds: float, raised_before: int) -> float:
    """How long a Backoff waits, raised again ``raised_before`` times in a row for the same
    batch: doubling each time, at most 2**6 times what the plugin asked (both backends), never
    less than that and up to 1.5 times it (jitter: runtime/backoff.py)."""
    return backoff_s(seconds, raised_before, max_doublings=_MAX_BACKOFF_DOUBLINGS, jitter_up=True)


class Backoff(BatchDeferred):
    """Raise from ``process`` when a downstream is failing: the batch is not failed and not
    dead-lettered; its partition (``scope="partition"``) or every partition of this
    supervisor (``scope="all"``) pauses for ``seconds`` (doubling if raised again for the
    same partition), then the same batch is tried again in order. Nothing is committed
    past it."""

    cause = "backoff"

    def __init__(self, seconds: float, reason: str = "", scope: str = "partition") -> None:
        if scope not in ("partition", "all"):
            raise ValueError(f'Backoff scope must be "partition" or "all", not {scope!r}')
        if not seconds >= 0:
            raise ValueError(f"Backoff seconds must be >= 0, not {seconds!r}")
        seconds = min(float(seconds), MAX_BACKOFF_S)  # inf too: "wait" is at most an hour at a time
        super().__init__(reason or f"plugin asked to back off for {seconds:g} s", seconds, scope)
        self.seconds = seconds


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


def load_plugin(name: str, path: str = "") -> Plugin:
    """Import the plugin module ``name``; ``path``: a directory searched first (a daemon's copy
    of the plugin's source for this code generation, runtime/supervisor/workers/snapshots.py)."""
    if path and path not in sys.path:
        sys.path.insert(0, path)
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


VERSION_HEADER = "ringmaster.plugin.version"  # on every output and dead letter a worker writes
_MAX_VERSION_CHARS = 64
_MAX_HASHED_FILES = 2000


def plugin_version(name: str) -> str:
    """The version of an imported plugin module, as status, metrics and the
    ``ringmaster.plugin.version`` header show it: ``__version__`` of the module, else of its
    top-level package; else the first 12 hex digits of a SHA-256 over its source – the
    module's file, or, for a module inside a package, every ``.py`` file of the top-level
    package (a plugin spread over several files changes version when any of them changes).
    ``"unknown"`` when there is no source to read (a zip or a frozen module). Never raises.
    Runs in: a worker, after the plugin was imported."""
    module = sys.modules.get(name)
    top = sys.modules.get(name.partition(".")[0])
    for m in (module, top):
        declared = getattr(m, "__version__", None)
        if declared is not None and str(declared).strip():
            return str(declared).strip()[:_MAX_VERSION_CHARS]
    try:
        files = _source_files(module, top)
        if not files:
            return "unknown"
        digest = hashlib.sha256()
        for root, path in files:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        return digest.hexdigest()[:12]
    except (OSError, ValueError):
        return "unknown"


def _source_files(module: Any, top: Any) -> list[tuple[Path, Path]]:
    """(root, file) pairs to hash, in a fixed order."""
    own = getattr(module, "__file__", None)
    if not own:
        return []
    package_init = getattr(top, "__file__", None)  # the plugin's own package, or the one it is in
    if package_init and Path(package_init).name == "__init__.py":
        root = Path(package_init).parent
        return [(root, p) for p in sorted(root.rglob("*.py"))[:_MAX_HASHED_FILES]]
    return [(Path(own).parent, Path(own))]


_NOT_AN_ITERABLE = (str, bytes, bytearray, memoryview, dict, int, float, bool, Output, Reject)


def collect_outputs(produced: Any) -> list[Output | Reject]:
    """What one ``process()`` call returned, as validated outputs. Raises TypeError naming
    the type and the fix for anything outside the contract, so a wrong return type fails the
    batch (retry, isolate, dead-letter) instead of crashing a worker or going unnoticed."""
    if produced is None:
        return []
    if isinstance(produced, _NOT_AN_ITERABLE) or not hasattr(produced, "__iter__"):
        raise TypeError(f"process() returned {type(produced).__name__}; return an iterable of "
                        "outputs (a list or a generator of bytes, (key, value) tuples, Output or "
                        "Reject) or None")
    # Exactly bytes, the commonest output, skips normalize_output's checks (~0.3 µs a record).
    return [Output(item) if type(item) is bytes else normalize_output(item) for item in produced]


def normalize_output(item: Any, default_topic: str | None = None) -> Output | Reject:
    """Turn whatever ``process`` yielded into a valid Output or Reject, or raise TypeError."""
    if isinstance(item, Output):
        return Output(_as_bytes(item.value, "Output.value"), _as_bytes(item.key, "Output.key"),
                      _headers(item.headers), _topic(item.topic))
    if isinstance(item, Reject):
        if not isinstance(item.record, Record):
            raise TypeError(f"Reject.record must be the input Record, not {type(item.record).__name__}")
        return Reject(item.record, str(item.reason))
    if isinstance(item, bytes | bytearray | memoryview):
        return Output(bytes(item))
    if isinstance(item, str):
        return Output(item.encode())
    if isinstance(item, tuple) and len(item) == 2:
        key, value = item
        return Output(_as_bytes(value, "the value of a (key, value) output"),
                      _as_bytes(key, "the key of a (key, value) output"))
    what = f"a tuple of {len(item)}" if isinstance(item, tuple) else type(item).__name__
    raise TypeError(f"process() yielded {what}; expected bytes, str, a (key, value) tuple, Output "
                    "or Reject")


def _as_bytes(v: Any, what: str) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    if isinstance(v, bytearray | memoryview):
        return bytes(v)
    raise TypeError(f"{what} must be bytes, str or None, not {type(v).__name__} "
                    "(serialise it first, e.g. json.dumps(v).encode())")


def _headers(h: Any) -> Headers | None:
    if h is None:
        return None
    if isinstance(h, Mapping):
        h = list(h.items())
    if not isinstance(h, list | tuple):
        raise TypeError(f"Output.headers must be a list of (name, value) pairs, not {type(h).__name__}")
    out: Headers = []
    for pair in h:
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"Output.headers: each header must be a (str, bytes) pair, not {pair!r:.80}")
        out.append((pair[0], _as_bytes(pair[1], f"the value of header {pair[0]!r}")))
    return out


def _topic(t: Any) -> str | None:
    if t is None or (isinstance(t, str) and t):
        return t
    raise TypeError(f"Output.topic must be a non-empty str or None, not {t!r:.80}")
