"""How workers appear in the log: every line of a worker process (the plugin's own lines
too) says `worker[pid]` and carries `worker=<index> incarnation=<n>`, the same fields the
supervisor uses for that worker; a record the plugin deliberately rejects is a warning,
not an error."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.execution.run import REJECTED, Failure
from runtime.ops.logs import TextFormatter, bind_fields, configure_logging
from runtime.plugin import Plugin, Record
from runtime.transport.board import BOARD_BYTES, Board
from runtime.worker.batch_runner import BatchRunner
from runtime.worker.spec import WorkerSpec


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_every_line_of_a_worker_names_it_by_index_and_incarnation(
        root_logging: None, capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("INFO", "text", role="worker")
    bind_fields(worker=0, incarnation=2)
    logging.getLogger("ringmaster.plugin.scorer").info("model loaded")
    logging.getLogger("ringmaster.worker").warning("batch deferred", extra={"tp": "in[3]"})
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert " worker[" in line
        assert line.endswith(("model loaded worker=0 incarnation=2", "tp=in[3] worker=0 incarnation=2"))
    assert "worker-0.2" not in "\n".join(lines)


def test_the_supervisors_lines_name_a_worker_with_the_same_fields() -> None:
    record = logging.LogRecord("ringmaster.pool", logging.INFO, "", 0, "worker started", None, None)
    record.__dict__.update({"worker": 0, "incarnation": 2, "pid": 4321})
    line = TextFormatter("supervisor").format(record)
    assert " supervisor[" in line and line.endswith("worker started worker=0 incarnation=2 pid=4321")


class FakeProducer:
    def produce(self, *args: Any, **kwargs: Any) -> None:
        pass

    def deliver(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_a_rejected_record_is_a_warning_and_a_failing_one_an_error(caplog: pytest.LogCaptureFixture) -> None:
    spec = WorkerSpec(index=0, incarnation=1, segment_path="", epochs_path="", plugin="p", settings={},
                      output_topic=None, dead_letter_topic="dlq", producer_props={}, max_attempts=1,
                      retry_backoff_s=0, retry_backoff_max_s=0, parent_pid=1)
    runner = BatchRunner(Plugin(name="p", process=lambda b: None, setup=None, teardown=None), spec,
                         Board(memoryview(bytearray(BOARD_BYTES))), FakeProducer())  # type: ignore[arg-type]
    rec = Record("in", 0, 7, b"k", b"", None, (1, 0))
    with caplog.at_level(logging.DEBUG, logger="ringmaster.worker"):
        runner._dead_letter([Failure(rec, REJECTED, "empty value", "", 1),
                             Failure(rec, "ValueError", "bad input", "Traceback...", 3)])
    levels = {r.__dict__["error"]: r.levelname for r in caplog.records
              if r.getMessage() == "record dead-lettered"}
    assert levels == {"Rejected: empty value": "WARNING", "ValueError: bad input": "ERROR"}
