"""Unit-test a plugin in-process, against the contract the daemon applies: no broker, no workers.

    from runtime.testing import PluginHarness

    def test_upper():
        with PluginHarness("upper", settings={"suffix": "!"}, output_topic="hello.out",
                           dead_letter_topic="hello.dead") as plugin:
            batch = plugin.run([(b"a", b"hello"), b""])
        assert [(o.key, o.value) for o in batch.outputs] == [(b"a", b"HELLO!")]
        assert batch.dead_letters[0].header("ringmaster.error.message") == b"empty value"

A batch runs the way a worker runs it, through the worker's own code, not a copy: the records
are packed into a batch frame and read back as a worker reads them (runtime.transport.frames,
runtime.worker.decoding.records_of), then the worker's ``BatchRunner`` runs the plugin (retries,
bisection, ``Reject``, ``Backoff``, ``sys.exit()``, outputs outside the contract:
runtime.execution.run), routes its outputs and adds the ``ringmaster.plugin.version``
header (runtime.execution.routing), and writes dead letters formatted and made to fit as the
daemon writes them (runtime.execution.deadletter_format). What the daemon would give the Kafka
producer is collected instead of sent. The one stand-in is that producer: it refuses a message
larger than ``max_message_bytes`` (key, value and headers, as librdkafka counts them against
``message.max.bytes``) as the client does, and every other message is acknowledged at once,
so no test here sees a broker outage. Outputs are what the producer was given, in order: a
call that failed after some of its outputs were queued (a later one refused) left those queued,
and the daemon would send them, so they are there, and again from the call that follows
(at-least-once).

Differences from a daemon, by design: ``setup()`` and ``teardown()`` run in this process (once
per harness, not once per worker process), and the waits between retries default to 0 (the
daemon waits ``dead_letter.retry_backoff_s``); a ``Backoff`` comes back as a deferred batch
instead of a wait and a second run (run the batch again to see what follows).

Runs in: a plugin author's test process.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Literal

from runtime.errors import OutputRejected, PluginError
from runtime.plugin import Context, Plugin, Record, load_plugin, plugin_version
from runtime.transport.board import BOARD_BYTES, Board
from runtime.transport.frames import BLOCKED, DEFERRED, DONE, Columns, decode_frame, encode_batch
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec

__all__ = ["BatchResult", "PluginHarness", "Produced"]

Headers = list[tuple[str, bytes | None]]
# What run() takes for one record: a value, a (key, value) pair, or a Record.
RecordLike = bytes | str | None | tuple[bytes | str | None, bytes | str | None] | Record


@dataclass(frozen=True)
class Produced:
    """One message the daemon would have written: an output or a dead letter."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: Headers

    def header(self, name: str) -> bytes | None:
        """The value of the last header called ``name`` (None if there is none)."""
        found = [v for k, v in self.headers if k == name]
        return found[-1] if found else None


@dataclass
class BatchResult:
    """What one batch came to.

    ``status``: ``"done"`` (processed; every record either produced its outputs or was
    dead-lettered), ``"deferred"`` (a ``Backoff``: nothing counts, the daemon would run the
    same batch again after ``delay_s``), or ``"blocked"`` (no dead-letter topic and a record
    failed for good: the daemon stops the partition at it; ``detail`` says which and why,
    ``outputs`` are those of the records before it)."""

    status: Literal["done", "deferred", "blocked"]
    outputs: list[Produced] = field(default_factory=list)
    dead_letters: list[Produced] = field(default_factory=list)
    detail: str = ""
    delay_s: float | None = None  # deferred: the plugin's Backoff seconds (None: the daemon's own)
    scope: str = ""  # deferred: "partition" or "all"
    discarded: int = 0  # outputs with no topic to go to (no output_topic, no Output(topic=...))

    @property
    def values(self) -> list[bytes | None]:
        """The outputs' values, in the order the daemon produces them."""
        return [o.value for o in self.outputs]


class _Collector:
    """The worker's producer, in memory: what would be produced is kept, in order."""

    broken = False

    def __init__(self, max_message_bytes: int) -> None:
        self.max_message_bytes = max_message_bytes
        self.produced: list[Produced] = []

    def produce(self, topic: str, value: bytes | None, key: bytes | None = None,
                headers: Headers | None = None, queue_wait_s: float = 0.0, **_: Any) -> None:
        size = len(key or b"") + len(value or b"") + sum(len(k) + len(v or b"") for k, v in headers or [])
        if size > self.max_message_bytes:
            raise OutputRejected(f"producing to {topic!r} refused: a message of {size} bytes is larger "
                                 f"than message.max.bytes ({self.max_message_bytes}); raise kafka.producer "
                                 "message.max.bytes (and the topic's max.message.bytes) or make the "
                                 "output smaller")
        self.produced.append(Produced(topic, key, value, list(headers or [])))

    def deliver(self, timeout_s: float, beat: Callable[[], None] = lambda: None) -> None:
        beat()

    def flush(self, timeout_s: float) -> int:
        return 0


class PluginHarness:
    """A plugin loaded once, as one worker of a daemon configured with these settings. Use it
    as a context manager (``teardown()`` runs at its end) or call :meth:`close`."""

    def __init__(self, plugin: str | ModuleType, *, settings: Mapping[str, Any] | None = None,
                 output_topic: str | None = None, dead_letter_topic: str | None = None,
                 topic: str = "input", partition: int = 0, max_attempts: int = 3,
                 retry_backoff_s: float = 0.0, max_message_bytes: int = 1_000_000) -> None:
        """``plugin``: the module or its name (``[workers] plugin``); ``settings``: ``[workers.settings]``;
        ``output_topic``, ``dead_letter_topic``: ``[output] topic``, ``[dead_letter] topic``;
        ``max_attempts``: ``dead_letter.max_attempts``; ``topic``, ``partition``: where records
        given without them come from; ``max_message_bytes``: ``kafka.producer``
        ``message.max.bytes``."""
        name = plugin.__name__ if isinstance(plugin, ModuleType) else plugin
        self.topic, self.partition = topic, partition
        self._next_offset = 0
        self._batch_id = 0
        self.spec = WorkerSpec(
            index=0, incarnation=1, segment_path="", epochs_path="", plugin=name,
            settings=dict(settings or {}), output_topic=output_topic, dead_letter_topic=dead_letter_topic,
            producer_props={}, max_attempts=max_attempts, retry_backoff_s=retry_backoff_s,
            retry_backoff_max_s=max(retry_backoff_s, 5.0), parent_pid=0,
            max_message_bytes=max_message_bytes, input_topics=(topic,))
        self.plugin: Plugin = load_plugin(name)
        if self.plugin.setup is not None:
            try:
                self.plugin.setup(Context(self.spec.name, self.spec.settings, output_topic,
                                          logging.getLogger(f"ringmaster.plugin.{name}")))
            except Exception as exc:  # as `ringmaster check` and a worker say it
                raise PluginError(f"plugin {name!r} setup() failed: {type(exc).__name__}: {exc}") from exc
        self._producer = _Collector(max_message_bytes)
        self._runner = BatchRunner(self.plugin, self.spec, Board(memoryview(bytearray(BOARD_BYTES))),
                                   self._producer, plugin_version(name))  # type: ignore[arg-type]
        self._closed = False

    def run(self, records: Iterable[RecordLike]) -> BatchResult:
        """Run one batch. Items without coordinates (a value, or a ``(key, value)`` pair) get
        this harness's topic and partition and the next offsets; ``Record`` objects keep
        theirs. A batch is one partition's records in offset order, as the daemon hands them
        over (ValueError otherwise)."""
        if self._closed:
            raise RuntimeError("the harness is closed")
        batch = [self._record(r) for r in records]
        if not batch:
            raise ValueError("a batch has at least one record")
        tp = (batch[0].topic, batch[0].partition)
        for before, r in itertools.pairwise(batch):
            if (r.topic, r.partition) != tp or r.offset <= before.offset:
                raise ValueError(f"a batch is one partition's records in offset order: {r!r} follows "
                                 f"{before!r}")
        self._next_offset = max(self._next_offset, batch[-1].offset + 1)
        self._batch_id += 1
        columns = Columns(batch[0].offset, [r.offset for r in batch], [r.key for r in batch],
                          [r.value for r in batch],
                          [r.headers for r in batch] if any(r.headers for r in batch) else None,
                          [r.timestamp[0] for r in batch], [r.timestamp[1] for r in batch])
        frame = decode_frame(encode_batch(self._batch_id, 0, 1, tp[0], tp[1], columns))
        assert frame is not None
        self._producer.produced.clear()
        result = self._runner.run(frame)
        assert result is not None, "the harness's runner delivers every batch before it returns"
        produced = list(self._producer.produced)
        letters = [p for p in produced if p.topic == self.spec.dead_letter_topic]
        outputs = [p for p in produced if p.topic != self.spec.dead_letter_topic]
        if result.kind == DONE:
            return BatchResult("done", outputs, letters, discarded=result.discarded)
        if result.kind == BLOCKED:
            return BatchResult("blocked", outputs, letters, detail=result.detail)
        if result.kind == DEFERRED:
            return BatchResult("deferred", detail=result.detail,
                               delay_s=None if result.delay_ms < 0 else result.delay_ms / 1000,
                               scope=result.scope)
        raise RuntimeError(f"the worker would have stopped: {result.detail}")  # out of memory or fds

    def _record(self, item: RecordLike) -> Record:
        if isinstance(item, Record):
            return item
        key, value = item if isinstance(item, tuple) else (None, item)
        offset = self._next_offset
        self._next_offset += 1
        return Record(self.topic, self.partition, offset, _bytes(key), _bytes(value), None, (0, 0))

    def close(self) -> None:
        """Run ``teardown()`` (once)."""
        if not self._closed and self.plugin.teardown is not None:
            self.plugin.teardown()
        self._closed = True

    def __enter__(self) -> PluginHarness:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _bytes(v: bytes | str | None) -> bytes | None:
    return v.encode() if isinstance(v, str) else v
