"""Exactly-once: fence the transactional ids of worker slots that no worker of this daemon
starts now. Runs in: the supervisor (at start, on a thread of its own).

A daemon that replaces a dead one on its host takes its slot (runtime/ops/member_slot.py), so
its workers' transactional ids (runtime/kafka/transactions.py), and each worker it starts
fences its id with ``init_transactions``. It starts ``workers.processes`` of them; the dead one
may have run more: a ``ringmaster scale`` up to ``max_processes``, a reload's worker beside the
old ones. What those slots left open (a batch's outputs and offsets) would hold the partition
for every member of the group (its committed offset is not stable) and the outputs' partitions
for read_committed readers until ``transaction.timeout.ms``. So the supervisor fences every
other slot's id as it starts: a throw-away producer per id, ``init_transactions``, closed.

RACE: a worker started in such a slot while its fence runs (a ``scale`` in the first seconds)
may be fenced by it; its first transaction then fails, the batch is deferred, and its producer
is replaced (an outage of one batch, runtime/worker/transactional.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaException, Producer

from runtime.kafka.client_log import with_logger

log = logging.getLogger("ringmaster.kafka")


def fence_ids(props: Mapping[str, Any], ids: Iterable[str], timeout_s: float,
              new_producer: Callable[[dict[str, Any]], Any] = Producer) -> dict[str, str]:
    """``init_transactions`` for each id, all at once, within ``timeout_s``; the ids that could
    not be fenced, with why (their transactions end by ``transaction.timeout.ms``)."""
    ids = list(ids)
    if not ids:
        return {}

    def fence(tid: str) -> str | None:
        try:
            producer = new_producer(with_logger({**props, "transactional.id": tid}))
        except KafkaException as exc:
            return str(exc.args[0] if exc.args else exc)
        try:
            producer.init_transactions(timeout_s)
            return None
        except KafkaException as exc:
            return str(exc.args[0] if exc.args else exc)
        finally:
            producer.close()

    with ThreadPoolExecutor(min(len(ids), 16), thread_name_prefix="fence") as pool:
        outcomes = dict(zip(ids, pool.map(fence, ids), strict=True))
    failed = {tid: why for tid, why in outcomes.items() if why is not None}
    if failed:
        log.warning("could not fence the transactional ids of worker slots this daemon does not start; "
                    "what they left open ends by transaction.timeout.ms",
                    extra={"ids": sorted(failed), "reason": next(iter(failed.values()))})
    else:
        log.info("fenced the transactional ids of worker slots this daemon does not start",
                 extra={"ids": ids})
    return failed
