"""What the rooms call on the group consumer: a Protocol of what they use and no more.

The real one is runtime/kafka/consumer.py GroupConsumer (and runtime/kafka/share_consumer.py
ShareGroupConsumer for a share group); tests/unit/fakes.py has a fake, and the simulator
(scripts/benchkit/sim/world.py) another. None inherits from it: each fits it structurally.
Runs in: supervisor.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Protocol, runtime_checkable

from runtime.kafka.consumer import Fetched
from runtime.kafka.group_offsets import GroupStanding
from runtime.kafka.offset_commits import CommitResult
from runtime.kafka.share_consumer import Outcome, ShareCounts
from runtime.tp import TP
from runtime.transport.packing import Run

OnPartitions = Callable[[list[TP]], None]


class Consumer(Protocol):
    """The group consumer, as the rooms use it."""

    @property
    def acknowledged(self) -> dict[TP, int]:
        """The last offset the broker acknowledged, per partition."""
    @property
    def stats_summary(self) -> dict[str, float]: ...

    def subscribe(self, topics: list[str], on_assign: OnPartitions, on_revoke: OnPartitions,
                  on_lost: OnPartitions, /) -> None: ...
    def consume(self, max_records: int, timeout_s: float, /) -> Fetched: ...
    def pause(self, tps: list[TP], /) -> None: ...
    def resume(self, tps: list[TP], /) -> None: ...
    def commit(self, offsets: dict[TP, int], asynchronous: bool, timeout_s: float, /) -> CommitResult: ...
    def take_refused_commits(self) -> dict[TP, int]: ...
    def release(self, tp: TP, run: Run, keep: bool = False, /) -> None:
        """Fetched records the loop dropped before running them: a share consumer hands them
        back to its group, or keeps them (``keep``: the loop runs them after a wait); a group
        consumer reads them again after the seek that follows."""
    def seek_to_start(self, tps: list[TP], /) -> list[TP]: ...
    def seek(self, tp: TP, offset: int, /) -> bool: ...
    def high_watermark(self, tp: TP, /) -> int | None: ...
    def group_standing(self, ask_committed: bool, /, settle_s: float = 0.0,
                       held: Collection[TP] = ()) -> GroupStanding | None:
        """None: no view of the group (a share group, a test's fake): a member is judged alone.
        ``settle_s``: ask the committed offsets anew, stable, and wait for them that long;
        ``held``: this member's partitions (it judges them itself)."""
    def stop(self) -> None: ...
    def close(self, timeout_s: float, /) -> bool: ...


@runtime_checkable
class Acknowledging(Protocol):
    """A share group's consumer (runtime/kafka/share_consumer.py), as the rooms use it besides
    the Consumer seam: what the share committer hands it, what the loop asks before a crashing
    record is dead-lettered, the group's lock that the loop sizes its fetches by."""

    def acknowledge(self, tp: TP, first: int, last: int, outcome: Outcome, /) -> int: ...
    def keep(self, tp: TP, first: int, last: int, /) -> int: ...
    def may_dead_letter(self, tp: TP, offset: int, /) -> bool: ...
    def settle(self, timeout_s: float, /) -> None: ...
    def holding(self) -> dict[str, int]: ...
    @property
    def counts(self) -> ShareCounts: ...
    @property
    def lock_s(self) -> float: ...


def share_acks(consumer: Consumer) -> Acknowledging | None:
    """A share group's consumer, as the rooms that acknowledge records use it (None: a
    consumer group's)."""
    return consumer if isinstance(consumer, Acknowledging) else None
