"""stdlib logging with structured fields: ``log.info("paused", extra={"tp": "in[3]"})``
renders as ``... paused tp=in[3]`` (text) or one JSON object per line (json).

A line that can repeat in a storm (a Kafka client retrying an unreachable broker every
50 ms, a flood of malformed control records) carries a ``throttle`` key in its extra
fields: :class:`Throttle` lets the same key through at most once per window and reports on
the next one how many it held back (``suppressed=N``). Runs in: every process (supervisor,
workers, the CLI).

Every line says which process wrote it: ``supervisor[pid]`` or ``worker[pid]`` (the role),
and a worker's lines carry ``worker=<index> incarnation=<n>``, the same fields the
supervisor's lines about that worker use: one way to name a worker everywhere.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import time
from collections.abc import Callable

# Not printed as fields: the record's own attributes, and the throttle key (read, never
# removed, by every handler's Throttle: each handler judges the same record).
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "throttle"}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def __init__(self, role: str | None = None) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(record.created))
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"{ts} {record.levelname:<7} {self.role or record.processName}[{record.process}] " \
               f"{record.getMessage()}" + (f" {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def __init__(self, role: str | None = None) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        obj = {"ts": record.created, "level": record.levelname, "logger": record.name,
               "process": self.role or record.processName, "pid": record.process, "msg": record.getMessage()}
        obj.update({k: v if isinstance(v, int | float | bool | type(None)) else str(v)
                    for k, v in _fields(record).items()})
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj)


THROTTLE_WINDOW_S = 30.0


class Throttle(logging.Filter):
    """Lets a record with ``extra={"throttle": key}`` through at most once per ``window_s``
    per key; the next one let through carries ``suppressed`` (how many were held back).
    Records without a key always pass. Thread-safe: Kafka clients log from their own
    threads (close() runs on a helper thread)."""

    def __init__(self, window_s: float = THROTTLE_WINDOW_S, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 1024) -> None:
        super().__init__()
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._lock = threading.Lock()
        # key -> [when it was last let through, how many were held back since]
        self._seen: collections.OrderedDict[str, list[float]] = collections.OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        key = getattr(record, "throttle", None)
        if key is None:
            return True
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                seen[1] += 1
                return False
            if seen is not None and seen[1]:
                record.suppressed = int(seen[1])
            self._seen[key] = [now, 0]
            self._seen.move_to_end(key)
            while len(self._seen) > self._max_keys:  # bounded: the oldest keys are forgotten
                self._seen.popitem(last=False)
        return True


class _BoundFields(logging.Filter):
    """Adds fixed fields to every record of this process that does not set them itself."""

    def __init__(self, fields: dict[str, object]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self.fields.items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


def configure_logging(level: str = "INFO", fmt: str = "text", role: str | None = None) -> None:
    """``role``: what the process is (``supervisor``, ``worker``), shown on every line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role) if fmt == "json" else TextFormatter(role))
    handler.addFilter(Throttle())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


class CommandFormatter(logging.Formatter):
    """An operator command's own warnings: ``ringmaster: warning: message key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in _fields(record).items())
        line = f"ringmaster: {record.levelname.lower()}: {record.getMessage()}"
        return line + (f" {extra}" if extra else "")


def configure_command_logging() -> None:
    """Operator commands (pause, resume, status, top): warnings and errors only, on stderr,
    so nothing of the library's INFO chatter precedes the command's own output."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(CommandFormatter())
    handler.addFilter(Throttle())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    # A command's failure to reach the cluster is its own one line (exit 8); the client's
    # retries on the way there are not the operator's business.
    logging.getLogger("ringmaster.kafka.client").setLevel(logging.ERROR)


def bind_fields(**fields: object) -> None:
    """Put these fields on every line this process logs from now on (a worker binds its
    index and incarnation: the plugin's own log lines carry them too)."""
    for handler in logging.getLogger().handlers:
        handler.addFilter(_BoundFields(dict(fields)))
