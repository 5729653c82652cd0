"""What a worker is told when it starts: ``WorkerSpec``, built by the supervisor for each
incarnation of a slot (supervisor/workers/pool.py) and handed to the new process, and the
properties of the output producer it makes.

Runs in: the supervisor, which builds it; a worker, which reads it; the plugin harness
(runtime/testing.py), which builds one for its in-process runner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WorkerSpec:
    index: int
    incarnation: int
    segment_path: str
    epochs_path: str
    plugin: str
    settings: dict[str, Any]
    output_topic: str | None
    dead_letter_topic: str | None
    producer_props: dict[str, Any]
    max_attempts: int
    retry_backoff_s: float
    retry_backoff_max_s: float
    parent_pid: int
    delivery_timeout_s: float = 30.0
    max_message_bytes: int = 1_000_000
    log_level: str = "INFO"
    log_format: str = "text"
    input_topics: tuple[str, ...] = ()  # kafka.topics: an Output(topic=...) into one of them loops
    plugin_path: str = ""  # the generation's copy of the plugin's source (supervisor/workers/snapshots.py)
    # Exactly-once (runtime/kafka/transactions.py): this slot's transactional id ("" for
    # at-least-once), the segment holding the group's metadata, and the properties of the
    # client that reads the group's committed offsets.
    transactional_id: str = ""
    pipelined_delivery: bool = False  # workers.pipelined_delivery (batch_runner.py; not with exactly-once)
    group_metadata_path: str = ""
    group_props: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"worker-{self.index}.{self.incarnation}"


def producer_props(spec: WorkerSpec) -> dict[str, Any]:
    """The output producer's properties: with this slot's transactional id under exactly-once.

    Delivery reports come for failures only (``delivery.report.only.error``): a worker waits
    for its whole batch's outputs at once and needs only what failed
    (runtime/kafka/producer.py: once nothing is in flight, every message not reported failed
    was acknowledged), and a report for each success cost a Python call and a message object
    per output, ~15 % of a worker's output path. Set it in [kafka.producer] to override."""
    props = {"delivery.report.only.error": True, **spec.producer_props}
    if spec.transactional_id:
        props["transactional.id"] = spec.transactional_id
    return props
