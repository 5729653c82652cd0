"""The redrive's loop: consume the dead-letter topic in the redrive's own group, judge each
letter, hand the ones it takes to the action at the pace of the token bucket, settle what the
broker acknowledged, commit the settled prefix of each partition.

Runs in: the CLI (``ringmaster redrive``), one thread. Group callbacks run inside
``consume()`` on that thread. ``consume()`` is called at least every half second, also while
a long run of letters waits for the token bucket or a plugin's ``Backoff``, so that the group
keeps this member (``max.poll.interval.ms``) and rebalances are served; what arrives meanwhile
is kept in order, and fetching pauses while more than a batch is kept (two batches at most,
and a fetch). Signal handlers only enqueue; the loop and its waits look.

The end is the end of each partition **as seen at start** (``ends``: the fetch high watermark
measured before the run, runtime/kafka/topic_reader.py ``partition_bounds``), or ``--to``:
letters written while the run goes on – by the daemon, or by this run for records that fail
again – are the next run's, so no letter is redriven twice by one run.
"""

from __future__ import annotations

import logging
import queue
import signal
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.errors import KafkaError
from runtime.kafka.consumer import Fetched
from runtime.kafka.offset_commits import CommitResult
from runtime.kafka.topic_reader import Stored
from runtime.redrive.actions import Action, Outcome, Result
from runtime.redrive.ledger import Ledger
from runtime.redrive.letters import Form, Letter, read_letter, stands_for
from runtime.redrive.pacing import TokenBucket
from runtime.redrive.report import Ending, Summary
from runtime.redrive.selection import Selection, Skip, Stop
from runtime.tp import TP

log = logging.getLogger("ringmaster.redrive")

# consume() at least this often, whatever the loop is waiting for (see the module docstring).
_KEEPALIVE_S = 0.5
_PROGRESS_EVERY_S = 10.0


class Consumer(Protocol):
    """What the engine needs of runtime/kafka/consumer.py GroupConsumer (tests pass a fake)."""

    def consume(self, max_records: int, timeout_s: float) -> Fetched: ...
    def pause(self, tps: Iterable[TP]) -> None: ...
    def resume(self, tps: Iterable[TP]) -> None: ...
    def commit(self, offsets: Mapping[TP, int], asynchronous: bool) -> CommitResult: ...
    def take_refused_commits(self) -> dict[TP, int]: ...


class Refetch(Protocol):
    """runtime/kafka/topic_reader.py RecordFetcher."""

    def fetch(self, topic: str, partition: int, offset: int, timeout_s: float) -> Stored | None: ...


class Stopper:
    """SIGTERM and SIGINT ask the redrive to stop: the handler only enqueues (no logging, no
    raising in a handler); ``requested`` and ``wait`` look. A wait ends at once when a signal
    comes (a blocked ``SimpleQueue.get`` is woken by the handler's put)."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._stopping = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, lambda signum, _frame: self._q.put_nowait(signum))

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def request(self, signum: int = signal.SIGTERM) -> None:
        self._q.put_nowait(signum)

    def _take(self, signum: int) -> None:
        if not self._stopping:
            log.info("stop requested: finishing what is in flight, then committing",
                     extra={"signal": signal.Signals(signum).name})
        self._stopping = True

    def requested(self) -> bool:
        while not self._q.empty():
            self._take(self._q.get_nowait())
        return self._stopping

    def wait(self, seconds: float) -> bool:
        """Sleep; False (at once) if a stop is or gets requested."""
        if self.requested():
            return False
        try:
            self._take(self._q.get(timeout=max(0.0, seconds)))
            return False
        except queue.Empty:
            return True


@dataclass(frozen=True, slots=True)
class _Eof:
    """The end of a partition as a fetch saw it, kept in order after the records before it."""

    offset: int


@dataclass(eq=False)
class _Part:
    """A partition of the dead-letter topic assigned to this run. Written by the engine only."""

    tp: TP
    end: int  # the end as seen at start, or --to's offset when lower
    ledger: Ledger = field(default_factory=Ledger)
    done: bool = False  # reached its end: nothing more is taken from it
    position: int | None = None  # after the last letter taken or passed over
    committed: int | None = None  # the last offset a commit was sent for


class Redrive:
    def __init__(self, consumer: Consumer, action: Action, selection: Selection, summary: Summary,
                 ends: Mapping[int, int], clock: Callable[[], float], stopper: Stopper, *,
                 bucket: TokenBucket | None = None, refetch: Refetch | None = None,
                 commit_interval_s: float = 1.0, delivery_timeout_s: float = 30.0,
                 assign_timeout_s: float = 60.0, refetch_timeout_s: float = 30.0,
                 max_records: int = 500, to_do: Iterable[int] = ()) -> None:
        self.consumer, self.action, self.selection, self.summary = consumer, action, selection, summary
        self.ends = dict(ends)
        self.clock, self.stopper, self.bucket, self.refetch = clock, stopper, bucket, refetch
        self.commit_interval_s, self.delivery_timeout_s = commit_interval_s, delivery_timeout_s
        self.assign_timeout_s, self.refetch_timeout_s = assign_timeout_s, refetch_timeout_s
        self.max_records = max_records
        self.to_do = set(to_do)  # partitions that had letters to read at start
        self.parts: dict[TP, _Part] = {}
        self.finished: set[int] = set()  # partitions this run took to their end
        self.assigned_once = False
        # What consume() returned and is not handled yet, in order: runs of records and ends.
        self._stash: deque[tuple[TP, list[Any] | _Eof]] = deque()
        self._stashed = 0  # records in the stash
        self._holding = False  # fetching paused: the stash holds a batch or more
        self._error: str | None = None
        self._last_poll = clock()
        self._last_commit = clock()
        self._last_progress = clock()

    # -- group callbacks (inside consume()) -----------------------------------------------
    def on_assign(self, tps: list[TP]) -> None:
        self.assigned_once = True
        for tp in tps:
            end = self.ends.get(tp[1], 0)  # a partition added since the start has no letters of it
            to = self.selection.end_offset(tp[1])
            self.parts[tp] = _Part(tp, end if to is None else min(end, to))
        log.info("partitions assigned", extra={"partitions": ",".join(str(p) for _, p in sorted(tps))})

    def on_revoke(self, tps: list[TP]) -> None:
        """Wait for the copies in flight, commit what is settled, let go."""
        self._apply(self.action.settle(self.delivery_timeout_s))
        self._commit(sync=True, only=set(tps))
        self._let_go(tps)

    def on_lost(self, tps: list[TP]) -> None:
        """Another member owns them already: commit nothing (it would be refused anyway)."""
        self._let_go(tps)

    def _let_go(self, tps: Iterable[TP]) -> None:
        gone = set(tps)
        for tp in gone:
            self.parts.pop(tp, None)
        self._stash = deque((tp, item) for tp, item in self._stash if tp not in gone)
        self._stashed = sum(len(item) for _, item in self._stash if isinstance(item, list))
        self.action.forget(gone)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> Summary:
        started = self.clock()
        self.stopper.install()
        try:
            while True:
                if self.stopper.requested():
                    self.summary.ending = Ending.STOPPED
                    break
                if self._failed():
                    break
                if self.assigned_once and self.parts and all(p.done for p in self.parts.values()):
                    self.action.flush_pending()
                    if not self._failed():
                        self._ended()
                    break
                if not self.parts and self.clock() - started > self.assign_timeout_s:
                    self.summary.ending = Ending.NO_PARTITIONS
                    break
                if self._stash:
                    tp, item = self._stash.popleft()
                    if isinstance(item, _Eof):
                        self._at_eof(tp, item.offset)
                    else:
                        self._stashed -= len(item)
                        self._handle(tp, item)
                    continue
                if self._holding:
                    self._holding = False
                    self.consumer.resume(self._fetching())
                self.action.flush_pending()
                self._apply(self.action.poll())
                self._poll(0.2)
                self._apply(self.action.poll())
                self._tick()
            self._apply(self.action.settle(self.delivery_timeout_s))
            self._failed()
            self.summary.committed = self._commit(sync=True)
        finally:
            self.stopper.restore()
        return self.summary

    def _failed(self) -> bool:
        error = self._error or self.action.error
        if error is not None:
            self.summary.ending, self.summary.error = Ending.FAILED, error
        return error is not None

    def _ended(self) -> None:
        held_elsewhere = self.to_do - self.finished
        self.summary.ending = Ending.NO_PARTITIONS if held_elsewhere else Ending.END

    def _poll(self, timeout_s: float) -> None:
        """consume(): serve the group (rebalance callbacks run in here) and keep what came, in
        order; pause fetching while the stash holds a batch or more (bounded memory)."""
        fetched = self.consumer.consume(self.max_records, timeout_s)
        self._last_poll = self.clock()
        for tp, run in fetched.runs.items():
            self._stash.append((tp, run))
            self._stashed += len(run)
        # librdkafka reports a partition's end after the records of the same fetch.
        self._stash.extend((tp, _Eof(offset)) for tp, offset in fetched.eof.items())
        # The loop consumes only when the stash is empty, so one poll never holds; polls made
        # to keep the group served while a run is handled do, once they add a batch to it.
        if self._stashed > self.max_records:
            # Every time, not once: a rebalance may have handed over partitions that fetch.
            self._holding = True
            self.consumer.pause(self._fetching())

    def _keep_alive(self) -> None:
        if self.clock() - self._last_poll >= _KEEPALIVE_S:
            self._poll(0)
            self._apply(self.action.poll())
            self._tick()

    def _fetching(self) -> list[TP]:
        return [tp for tp, p in self.parts.items() if not p.done]

    def _at_eof(self, tp: TP, offset: int) -> None:
        """Every record before ``offset`` was handled (the stash keeps the order). Below the end
        seen at start only if the log was cut since (or a transaction is open): nothing more can
        be read now, and waiting for it could take for ever."""
        part = self.parts.get(tp)
        if part is not None:
            if offset < part.end:
                log.warning("the dead-letter partition ends before its end seen at the start",
                            extra={"partition": tp[1], "end": offset, "end_at_start": part.end})
            self._finish(part)

    def _finish(self, part: _Part) -> None:
        if not part.done:
            part.done = True
            self.finished.add(part.tp[1])
            self.consumer.pause([part.tp])

    def _handle(self, tp: TP, run: list[Any]) -> None:
        """One partition's consumed run, in offset order."""
        part = self.parts.get(tp)
        for m in run:
            # RACE: a wait below (the token bucket) serves rebalances: the partition may have
            # been revoked, or revoked and assigned again (a new _Part, a new cursor).
            if part is None or self.parts.get(tp) is not part or part.done:
                return
            if self._error is not None or self.action.error is not None or self.stopper.requested():
                return
            self._keep_alive()
            if self.parts.get(tp) is not part:
                return
            offset = m.offset()
            if offset >= part.end:
                self._finish(part)
                return
            if part.position is not None and offset < part.position:
                continue  # already handled (a fetch response that overlaps the last one)
            letter = _read(tp[1], offset, m)
            verdict = self.selection.judge(letter)
            if isinstance(verdict, Stop):
                self.summary.left[verdict] += 1
                self._finish(part)
                return
            if isinstance(verdict, Skip):
                self._pass_over(part, letter, verdict)
                continue
            record = self._original(letter, m)
            if record is None:
                if self._error is None:
                    self._pass_over(part, letter, Skip.SOURCE_GONE)
                continue
            if not self._pace() or self.parts.get(tp) is not part:
                return
            part.ledger.take(offset)
            part.position = offset + 1
            if self.bucket is not None:
                self.bucket.take()
            self.action.submit(tp, letter, record)
            if part.position >= part.end:
                self._finish(part)

    def _pass_over(self, part: _Part, letter: Letter, reason: Skip) -> None:
        detail = f"{letter.error_type} from {letter.source}" if letter.source is not None \
            and not letter.malformed else (letter.problem or "")
        part.ledger.pass_over(letter.offset)
        part.position = letter.offset + 1
        self.summary.skip(reason, f"offset {letter.offset}: {detail}")
        if reason is Skip.MALFORMED:
            # One line per such letter: they are rare, and each is data someone must look at.
            log.warning("dead letter passed over: a ringmaster.* header is out of bounds", extra={
                "partition": part.tp[1], "offset": letter.offset, "problem": letter.problem})
        if part.position >= part.end:
            self._finish(part)

    def _original(self, letter: Letter, m: Any) -> Stored | None:
        """The record the letter stands for: the letter itself when whole; read again from its
        source when truncated or a reference (None when no longer there)."""
        if letter.form is Form.WHOLE:
            # The letter's own fields as read once (_read): headers() is not called again.
            return Stored(letter.key, letter.value, letter.headers, m.timestamp())
        src = letter.source
        assert src is not None
        if self.refetch is None:
            return None
        try:
            stored = self.refetch.fetch(src.topic, src.partition, src.offset, self.refetch_timeout_s)
        except KafkaError as exc:
            self._error = f"cannot read the source record of a {letter.form.value} dead letter: {exc}"
            return None
        if stored is not None and not stands_for(letter, stored.key, stored.value):
            log.warning("the source record of a truncated dead letter is not the one that failed "
                        "(the topic was created again?)", extra={"source": str(src), "offset": letter.offset})
            return None
        return stored

    def _pace(self) -> bool:
        """Wait for the token bucket; False if told to stop meanwhile."""
        if self.bucket is None:
            return True
        while (delay := self.bucket.delay()) > 0:
            # A batch waiting for more records would wait for the bucket too: run it first.
            self.action.flush_pending()
            self._apply(self.action.poll())
            if not self.wait(delay):
                return False
        return True

    def wait(self, seconds: float) -> bool:
        """Sleep for the bucket or a plugin's Backoff, consuming every half second (see the
        module docstring); False if told to stop."""
        deadline = self.clock() + seconds
        while (left := deadline - self.clock()) > 0:
            due = self._last_poll + _KEEPALIVE_S - self.clock()
            if not self.stopper.wait(min(left, max(due, 0.0))):
                return False
            self._keep_alive()
        return True

    # -- settling and committing ---------------------------------------------------------
    def _apply(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            if o.result is Result.REFUSED:
                self.summary.skip(Skip.REFUSED, o.detail)
            else:
                self.summary.redriven[(o.error_type, o.source_topic)] += 1
                if o.result is Result.FAILED_AGAIN:
                    self.summary.failed_again += 1
            part = self.parts.get(o.tp)
            if part is not None:
                part.ledger.settle(o.offset)

    def _tick(self) -> None:
        now = self.clock()
        if now - self._last_commit >= self.commit_interval_s:
            self._commit(sync=False)
            self._last_commit = now
        if now - self._last_progress >= _PROGRESS_EVERY_S:
            self._last_progress = now
            log.info("redrive progress", extra={
                "redriven": self.summary.redriven_total, "passed_over": sum(self.summary.skipped.values()),
                "failed_again": self.summary.failed_again,
                "partitions_done": f"{sum(p.done for p in self.parts.values())}/{len(self.parts)}"})

    def _commit(self, sync: bool, only: set[TP] | None = None) -> bool:
        """Commit each partition's settled prefix that moved; True if the broker took it (or
        there was nothing to commit)."""
        if self.summary.dry_run:
            return True
        # An asynchronous commit is "sent" when handed to the client; the broker's refusal
        # (NOT_COORDINATOR, REBALANCE_IN_PROGRESS, an outage) comes later through consume().
        # Its partition is marked unsent here, so a later commit sends it again even if its
        # prefix has not moved since: else a run could end with its last progress uncommitted
        # and the next run redrive those letters again.
        for tp, offset in self.consumer.take_refused_commits().items():
            part = self.parts.get(tp)
            if part is not None and part.committed == offset:
                part.committed = None
        offsets = {}
        for tp, part in self.parts.items():
            if only is not None and tp not in only:
                continue
            # INVARIANT: at-least-once. The ledger's offset never passes a letter whose copy (or
            # new dead letter) the broker has not acknowledged: a stop, a crash or an outage
            # may send a letter twice, never lose one.
            committable = part.ledger.committable()
            if committable is not None and committable != part.committed:
                offsets[tp] = committable
        if not offsets:
            return True
        # ok: sent, and (synchronous) no partition refused; a CommitResult itself is always truthy.
        ok = self.consumer.commit(offsets, asynchronous=not sync).ok
        if ok:
            for tp, offset in offsets.items():
                self.parts[tp].committed = offset
        return ok


def _read(partition: int, offset: int, m: Any) -> Letter:
    """The letter ``m`` holds, its fields read once. The client cannot give every field of
    every record (confluent-kafka raises from ``headers()`` for a header name that is not
    UTF-8, which other tools can write, and caches a broken list that must not be touched
    again: runtime/transport/packing.py): such a letter is malformed, passed over, and its
    fields are not read again."""
    try:
        key, value, headers, timestamp = m.key(), m.value(), m.headers(), m.timestamp()
    except Exception as exc:  # the client's SystemError/UnicodeDecodeError, whichever it raises
        return Letter(partition, offset, None, None, [], None, "?", None, 0, None, Form.WHOLE,
                      f"the Kafka client cannot read the letter ({type(exc).__name__}: "
                      f"{str(exc)[:80]}; a header name that is not UTF-8?)", malformed=True)
    return read_letter(partition, offset, key, value, headers, timestamp)
