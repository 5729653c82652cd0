"""Where each assigned partition is read from: pauses, resumes, seeks, and the committed
offsets a start is read from (GroupConsumer delegates here; one job of the member, kept apart
from fetching and commits). librdkafka's own pause state is forgotten across rebalances and
its resume noticed late (``_wake_fetcher``): what was paused and sought is kept here.

Runs in: supervisor (and the redrive's member); ``assigned``/``note_start``/``let_go`` inside
rebalance callbacks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, TopicPartition

from runtime.errors import KafkaError
from runtime.kafka import coordinator
from runtime.kafka.client_log import raise_or_log
from runtime.kafka.offset_commits import OffsetCommits
from runtime.tp import TP, tp_label

log = logging.getLogger(__name__)


class Positions:
    """Pauses and seeks on ``client``. ``commits``: a commit that never returned holds the
    client (``OffsetCommits.wedged``), and nothing is asked of it then."""

    def __init__(self, client: Consumer, commits: OffsetCommits, reset_to_end: bool) -> None:
        self._c = client
        self._commits = commits
        # The partitions this member has paused in the client (their ends are asked for by
        # ListOffsets: a paused partition's cached high watermark stands still, watermarks.py).
        self.paused: set[TP] = set()
        # Where each partition was last sought: where it fetches from until consume() returns
        # one of its records and gives it a position (_wake_fetcher).
        self._sought: dict[TP, int] = {}
        self._reset_to_end = reset_to_end
        # Where a partition with no committed offset starts when the runtime seeks it itself.
        self.reset = OFFSET_END if reset_to_end else OFFSET_BEGINNING

    def assigned(self, tps: list[TP]) -> None:
        """librdkafka starts a new assignment fetching: none of it is paused."""
        self.paused.difference_update(tps)

    def pause(self, tps: Iterable[TP]) -> None:
        tps = list(tps)
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts and not self._commits.wedged:
            try:
                self._c.pause(parts)
                self.paused.update(tps)
            except KafkaException as exc:  # e.g. a partition no longer assigned: nothing to pause
                raise_or_log(exc, "pause")

    def resume(self, tps: Iterable[TP]) -> None:
        tps = list(tps)
        parts = [TopicPartition(t, p) for t, p in tps]
        if parts and not self._commits.wedged:
            paused = [part for part, tp in zip(parts, tps, strict=True) if tp in self.paused]
            self.paused.difference_update(tps)
            try:
                self._c.resume(parts)
            except KafkaException as exc:
                raise_or_log(exc, "resume")
                return
            self._wake_fetcher(paused)

    def _wake_fetcher(self, parts: list[TopicPartition]) -> None:
        """Make the resumed partitions fetch now. librdkafka's resume only clears a flag: the
        broker thread notices it when it next wakes, and a thread whose partitions were all
        paused has no fetch in flight and sleeps up to a second. The flow control pauses every
        partition when the backlog fills the rings and counts on records coming back within a
        fetch's round trip of a resume: instead the rings ran dry and the workers waited
        (20-800 ms on both brokers, tests/integration/test_consumer_resume.py).

        A partition that was paused is sought to its position, where the pause left librdkafka
        to fetch from anyway (past the last record consume() returned): the seek changes its
        fetch state, which wakes its broker thread (3-17 ms), and the thread then looks at all
        of its partitions. One with no position (nothing consumed since it was sought: a
        partition just assigned, or rewound) is sought again where it was last sought, which
        it still fetches from (a real offset: ``_remember_start``). Any other is left to wait."""
        # A sought offset that is out of range is reset by librdkafka; sought again it is reset
        # again, to the same start (or to what retention kept: the partition was paused, so
        # nothing more is skipped) but to a newer end: under a reset to the end, no second seek.
        sought: dict[TP, int] = {} if self._reset_to_end else self._sought
        for tp in self._c.position(parts) if parts else []:
            key = (tp.topic, tp.partition)
            offset = tp.offset if tp.offset >= 0 else sought.get(key)
            # seek() passes no leader epoch (librdkafka would first validate it, a round
            # trip); one it refuses is logged, and the resume stands.
            if tp.error is None and offset is not None:
                self.seek(key, offset)

    def note_start(self, parts: list[TopicPartition]) -> None:
        """An assignment starts each partition where it says, as a seek would."""
        for p in parts:
            self._remember_start((p.topic, p.partition), p.offset)

    def _remember_start(self, tp: TP, offset: int) -> None:
        """Where ``tp`` fetches from until a record of it is read, for _wake_fetcher: a real
        offset only. A logical one (the start or end, OFFSET_INVALID: where librdkafka finds
        it) is resolved once by librdkafka, and sought again it would be resolved anew: a
        newer end than the one the partition fetches from skips the records in between."""
        if offset >= 0:
            self._sought[tp] = offset
        else:
            self._sought.pop(tp, None)

    def let_go(self, tps: list[TP]) -> None:
        """The partitions are no longer assigned: nothing paused or sought is remembered."""
        self.paused.difference_update(tps)
        for tp in tps:
            self._sought.pop(tp, None)

    def committed(self, tps: Iterable[TP], timeout_s: float = 5.0,
                  ask_again: bool = False) -> dict[TP, int | None]:
        """The group's committed offsets; raises KafkaError when the broker does not answer
        within timeout_s, or refuses a partition (bounded: this runs on the supervisor's loop,
        which asks again on its next turn). ``ask_again``: a busy coordinator's refusal is
        asked again until timeout_s has passed (runtime/kafka/coordinator.py), for callers
        with nothing else to do."""
        start, refused = self._read_committed(tps, timeout_s, ask_again)
        if refused:
            tp, why = next(iter(refused.items()))
            more = f" (+{len(refused) - 1} more)" if len(refused) > 1 else ""
            raise KafkaError(f"reading committed offsets failed: {tp_label(tp)}: {why}{more}")
        return start

    def _read_committed(self, tps: Iterable[TP], timeout_s: float,
                        ask_again: bool) -> tuple[dict[TP, int | None], dict[TP, str]]:
        """The committed offsets the coordinator gave, and the partitions it refused in its
        answer, with why (an error of its own, e.g. not authorised: no answer for that
        partition; read as "nothing committed" it would start at the reset position).
        KafkaError when the request as a whole got no answer."""
        if self._commits.wedged:
            raise KafkaError(self._commits.wedged)
        wanted = [TopicPartition(t, p) for t, p in tps]
        deadline = time.monotonic() + timeout_s

        def ask() -> list[TopicPartition]:
            return self._c.committed(wanted, timeout=max(deadline - time.monotonic(), 0.1))

        try:
            parts = coordinator.until_answered(ask, timeout_s, "committed offsets") if ask_again else ask()
        except KafkaException as exc:
            raise KafkaError(f"reading committed offsets failed: {exc.args[0]}") from None
        start: dict[TP, int | None] = {}
        refused: dict[TP, str] = {}
        for p in parts:
            if p.error is not None:
                refused[(p.topic, p.partition)] = str(p.error)
            else:
                start[(p.topic, p.partition)] = None if p.offset < 0 else p.offset  # OFFSET_INVALID: none
        return start, refused

    def at_committed(self, tps: list[TP], timeout_s: float) -> list[TopicPartition]:
        """``tps`` at the group's committed offsets, the reset position where there is none,
        read now (asked again until answered, at most timeout_s): KafkaError if unanswered."""
        start = self.committed(tps, timeout_s, ask_again=True)
        reset = self.reset
        offsets = {tp: reset if offset is None else offset for tp, offset in start.items()}
        return [TopicPartition(t, p, offsets.get((t, p), reset)) for t, p in tps]

    def seek_to_start(self, tps: Iterable[TP]) -> list[TP]:
        """Restart fetching of just-assigned partitions at their committed offset (or the
        reset position). A seek also discards whatever librdkafka had queued for them.
        Returns the partitions that could not be sought now (the broker did not answer in
        time): the caller keeps them paused and tries again."""
        tps = list(tps)
        if not tps:
            return []
        try:
            start, refused = self._read_committed(tps, 5.0, ask_again=False)
        except KafkaError as exc:
            log.warning("cannot read committed offsets yet; will retry",
                        extra={"error": str(exc), "throttle": "committed offsets unread"})
            return tps
        for tp, why in refused.items():  # only these wait: the others start
            log.warning("the coordinator refused a partition's committed offset; will retry",
                        extra={"tp": tp_label(tp), "error": why,
                               "throttle": f"committed refused {tp_label(tp)}"})
        failed = list(refused)
        for tp, offset in start.items():
            if not self.seek(tp, self.reset if offset is None else offset):
                failed.append(tp)
        return failed

    def seek(self, tp: TP, offset: int) -> bool:
        """Fetch tp from offset next; what librdkafka had queued for it is discarded (its op
        version moves on). False (logged) if librdkafka refused."""
        if self._commits.wedged:
            return False
        try:
            self._c.seek(TopicPartition(tp[0], tp[1], offset))
            self._remember_start(tp, offset)
            return True
        except KafkaException as exc:
            # A held partition's seek is tried again and again, with a back-off (librdkafka
            # refuses it while its own fetch of the committed offset is unanswered): said once
            # in a while.
            err = exc.args[0]
            code = err.code() if hasattr(err, "code") else ""
            log.warning("seek failed", extra={"tp": tp_label(tp), "offset": offset, "error": str(err),
                                              "throttle": f"seek failed {tp_label(tp)} {code}"})
            return False

