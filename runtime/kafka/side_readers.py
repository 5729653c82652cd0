"""What the short-lived readers beside the group share (read_ends.py, empty_gaps.py): their
client properties, and answering on a daemon thread.

Runs in: supervisor; each answer is found on a thread of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from runtime.kafka.admin import admin_properties
from runtime.kafka.client_log import with_logger

T = TypeVar("T")


def reader_properties(props: Mapping[str, Any], default_group: str,
                      more: Mapping[str, Any]) -> dict[str, Any]:
    """Connection and security only (admin_properties), as a reader of the group's isolation
    level: assigned, never subscribed, so it joins no group, and it commits or stores no offset.
    ``more``: the reader's own properties."""
    return with_logger(admin_properties(props) | {
        "group.id": str(props.get("group.id", default_group)),
        "isolation.level": str(props.get("isolation.level", "read_committed")),
        "enable.auto.commit": False, "enable.auto.offset.store": False, **more})


def answer_on_thread(name: str, find: Callable[[], T]) -> Future[T]:
    """``find()``'s answer (or exception) as a Future at once, found on a daemon thread: a
    question left unanswered at the stop keeps no process from exiting."""
    answer: Future[T] = Future()

    def run() -> None:
        try:
            answer.set_result(find())
        except BaseException as exc:  # the caller reads it from the Future
            answer.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return answer
