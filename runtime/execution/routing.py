"""Where a plugin's outputs go, the same way on every backend (a local worker, the redrive,
Spark): an output's own topic (``Output(topic=...)``), else ``[output] topic``. With
neither, the output goes nowhere: it is counted (status, the redrive's summary) and said
once per process – a warning per output would flood the log, and a plugin written for
Spark's Parquet sink may produce outputs without a topic on purpose. Runs in: a worker, a
redrive, a Spark task."""

from __future__ import annotations

import logging

from runtime.plugin import VERSION_HEADER, Output

# A literal, not __name__: the name stays when the file moves (log filters name it).
log = logging.getLogger("runtime.worker.routing")


class OutputRoute:
    def __init__(self, output_topic: str | None, counted_in: str = "", keep_unrouted: bool = False) -> None:
        """``counted_in``: where the discarded count shows (said in the warning);
        ``keep_unrouted``: the sink keeps outputs without a topic (Spark's Parquet rows)."""
        self.output_topic = output_topic
        self.counted_in = counted_in
        self.keep_unrouted = keep_unrouted
        self.discarded = 0  # since the last take_discarded()
        self._warned = False

    def topic(self, out: Output) -> str | None:
        """The topic ``out`` goes to. None: no topic; unless the sink keeps such outputs, the
        caller drops it, and it is counted here."""
        topic = out.topic or self.output_topic
        if topic is None and not self.keep_unrouted:
            self.discarded += 1
            if not self._warned:
                self._warned = True
                where = f" (counted in {self.counted_in})" if self.counted_in else ""
                log.warning(f"plugin produced outputs without a topic and no [output] topic is "
                            f"configured; they are discarded{where}")
        return topic

    def take_discarded(self) -> int:
        n, self.discarded = self.discarded, 0
        return n


Headers = list[tuple[str, bytes | None]]


def with_version(headers: Headers | None, version: str) -> Headers:
    """An output's headers with the plugin's version (``ringmaster.plugin.version``), unless
    the plugin set that header itself: every output says which code made it."""
    if not headers:
        return [(VERSION_HEADER, version.encode())]
    if any(name == VERSION_HEADER for name, _ in headers):
        return headers
    return [*headers, (VERSION_HEADER, version.encode())]
