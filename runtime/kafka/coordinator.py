"""A group coordinator that is moving or loading its offsets: ask it again.

Apache Kafka answers NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS or
COORDINATOR_NOT_AVAILABLE for a moment while the coordinator of a group moves (a broker
restart, a leader change of its ``__consumer_offsets`` partition) or loads that partition (a
fresh broker loads them as the first groups appear). librdkafka looks the coordinator up again,
but hands the refused request's error to the caller of a committed-offsets fetch
(``committed()``) and of a synchronous commit. A caller that needs the answer, not just a
later retry (redrive's cursor and final commit, Spark's group offsets), asks again here until
its deadline. Tansu has a single coordinator and has not been seen to answer these; the
retry costs nothing there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from confluent_kafka import KafkaError as _CKError
from confluent_kafka import KafkaException

from runtime.backoff import backoff_s

log = logging.getLogger("ringmaster.kafka")

T = TypeVar("T")

BUSY = frozenset({_CKError.NOT_COORDINATOR, _CKError.COORDINATOR_LOAD_IN_PROGRESS,
                  _CKError.COORDINATOR_NOT_AVAILABLE})

# The first wait after a refusal, and the longest: a coordinator loads its partition in well
# under a second on a fresh broker, and a moved one is found by librdkafka within a few.
FIRST_WAIT_S = 0.1
MAX_WAIT_S = 1.0


def is_busy(error: object) -> bool:
    """Whether ``error`` (a confluent_kafka KafkaError or KafkaException) is a coordinator
    that is moving or loading, not a refusal that asking again cannot change."""
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else None
    code = getattr(error, "code", None)
    return callable(code) and code() in BUSY


def until_answered(call: Callable[[], T], timeout_s: float, what: str,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> T:
    """``call()`` again while it raises a busy coordinator's KafkaException, until
    ``timeout_s`` has passed; then (and for any other error at once) its exception is raised."""
    deadline = clock() + timeout_s
    refusals = 0
    while True:
        try:
            return call()
        except KafkaException as exc:
            wait = backoff_s(FIRST_WAIT_S, refusals, MAX_WAIT_S)
            if not is_busy(exc) or clock() + wait > deadline:
                raise
            refusals += 1
            log.info("the group coordinator is busy; asking again", extra={
                "what": what, "error": str(exc.args[0]), "refusals": refusals,
                "throttle": f"coordinator busy {what}"})
            sleep(wait)
