"""Effects: what a worker's report, a worker's death or a dead letter delivered comes to, as
values. results.py decides them; applier.py applies each, by the room that acts on it. Runs in:
supervisor.

    effect        applied as
    WorkerSaid    the workforce judges the worker by it (FATAL, HELLO, EXHAUSTED)
    Complete      the workforce and the scheduler learn of a batch done; its partition counts it
                  (done(): the committable offset may move) and learns its cost
    Rewind        each partition is held and read again (rewind()); a deferred one counts it
    Block         no dead-letter topic: the partition stops at the failing record
    Isolate       a batch that keeps crashing workers is bisected (a share group's: split into
                  its records): its parts replace it
    GiveUp        a share group's batch this member will not finish: released, or rejected
    Letter        the supervisor's desk writes a record's dead letter (acknowledged later)
    ReadyLetter   ... a letter made already (one that kills its workers, outside a transaction)
    LetterDone    an acknowledged dead letter: its one-record batch is handled (invariant 1)
    Requeue       batches back to the front of their lanes (a dead worker's)

Effects are applied in the order they were decided, each result's before the next result is
decided: the decisions read the partitions as the earlier effects left them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.execution.deadletter_format import DeadLetter
from runtime.kafka.share_consumer import Outcome
from runtime.supervisor.partition.partition import Partition, PauseReason
from runtime.supervisor.scheduling.batches import Batch
from runtime.transport.frames import ResultKind

Row = tuple[int, bytes | None, bytes | None, Any]  # (offset, key, value, headers) of one record


@dataclass(frozen=True, slots=True)
class WorkerSaid:
    worker: int
    kind: ResultKind  # FATAL, HELLO or EXHAUSTED
    detail: str
    batch_id: int = 0
    fresh: bool = False  # EXHAUSTED in its very first batch


@dataclass(frozen=True, slots=True)
class Complete:
    worker: int
    p: Partition | None  # None: its partition was released meanwhile (the worker's batch still counts)
    batch_id: int
    processed: int
    outputs: int
    dead_letters: int
    discarded: int
    busy_ms: float


@dataclass(frozen=True, slots=True)
class Rewind:
    parts: tuple[Partition, ...]
    reason: PauseReason
    detail: str
    until: float | None
    deferred: Partition | None = None  # the partition whose batch was deferred (its run of back-offs)


@dataclass(frozen=True, slots=True)
class Block:
    p: Partition
    detail: str


@dataclass(frozen=True, slots=True)
class Isolate:
    p: Partition
    batch_id: int
    halves: tuple[tuple[int, int, int], ...]  # (batch id, first, last) of each part


@dataclass(frozen=True, slots=True)
class Letter:
    p: Partition
    batch_id: int
    row: Row
    error_type: str
    message: str
    attempts: int = 1
    plugin_version: str | None = None
    delivery_count: int | None = None  # a share group's record's (its ringmaster.delivery_count)


@dataclass(frozen=True, slots=True)
class GiveUp:
    p: Partition
    batch_id: int
    outcome: Outcome  # RELEASE or REJECT


@dataclass(frozen=True, slots=True)
class ReadyLetter:
    p: Partition
    batch_id: int
    offset: int
    letter: DeadLetter


@dataclass(frozen=True, slots=True)
class LetterDone:
    p: Partition
    batch_id: int


@dataclass(frozen=True, slots=True)
class Requeue:
    batches: tuple[Batch, ...]  # in the order they go back (each to the front of its lanes)


Effect = (WorkerSaid | Complete | Rewind | Block | Isolate | GiveUp | Letter | ReadyLetter | LetterDone
          | Requeue)
