"""One assigned partition, and its life: the object that holds what the supervisor keeps for
the partition and makes every change to it, as Karafka's Coordinator and franz-go's cursor
put a partition's behaviour on the partition. The rooms decide (intake when to cut, flow
control when to pause, results what a worker's report means); they ask the partition, and
the partition changes its parts and tells whoever else must know: the epoch table in shared
memory (its fence), the scheduler (its batches not in a ring yet, ``discard``) and the client
(records fetched and dropped, a seek). ``tests/unit/test_ownership.py`` fails when any other
module writes one of its parts.

    parts       holds                                          changed by
    epoch       its fence in shared memory: a frame of an      fence(), rewind()
                older epoch is skipped by workers (inv. 5)
    intake      fetched records not cut yet, offsets seen,     fetched(), reached_end(),
                what it learnt of its records (batch sizing)   take_open(), learn_*(), sized()
    tracker     spans registered, done, committable offset     register(), done(), split(),
                (a share group's: acknowledgements)            committed(), read_again()
    pause       holds (why it must not fetch), backpressure,   hold(), release(), decided(),
                what the client was last told                  told()
    stats       records done, outputs, dead letters, back-offs done(), deferred(), letter_done()

Its states and the transitions between them (docs/design.md draws them):

    seeking ──started()──▶ reading ──rewind()──▶ rewinding ──read_again()──▶ reading
       ▲                   │    ▲  (a new epoch; held)    (its batches are all back:
       └─wait_for_start()──┘    │                          sought to its restart offset)
                                └── hold() / release(): held or not, while reading
    any state ──fence() (a release)──▶ forgotten by the table (table.py)

Pause state belongs to the runtime, not to librdkafka (invariant 4): the partition keeps what
it wants and what the client was told; flow control (runtime/supervisor/datapath/
flowcontrol.py) tells the client, and is the only room that does.

Runs in: supervisor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

# PauseReason lives with the status snapshot (ops reads it too); the rooms name it from here.
from runtime.kafka.share_consumer import Outcome
from runtime.ops.status import PauseReason as PauseReason
from runtime.supervisor.partition.acknowledgements import AckTracker, Intent
from runtime.supervisor.partition.offsets import OffsetTracker
from runtime.supervisor.scheduling.batches import Batch
from runtime.tp import TP, tp_label
from runtime.transport.packing import Run, offset_of

log = logging.getLogger("ringmaster.partition")

HOLDS = (PauseReason.OPERATOR, PauseReason.BACKOFF, PauseReason.DELIVERY, PauseReason.BLOCKED,
         PauseReason.SEEKING)
_COST_WEIGHT = 0.3  # moving averages of bytes and µs per record: recent batches count most


@dataclass(slots=True)
class Hold:
    reason: PauseReason
    detail: str
    until: float | None = None  # clock time it ends by itself; None: until released
    since: float = 0.0


@dataclass(slots=True)
class IntakeState:
    """What was fetched for the partition and how it is cut (intake.py decides when)."""

    batch_records: int  # records per frame: batch_max_records, fewer for big or slow records
    open_msgs: list[Any] = field(default_factory=list)  # fetched, not yet cut (runtime.transport.packing.Run)
    open_since: float = 0.0
    bytes_per_record: float = 0.0  # moving average over this partition's packed frames
    us_per_record: float = 0.0  # moving average of plugin time per record (from results)
    next_offset: int | None = None
    dropped_from: int | None = None  # rewinding: the lowest offset fetched and dropped since
    first_offset: int | None = None  # first offset fetched since assignment (lag before any commit)
    eof_at: int | None = None
    behind: int = 0  # records in the log not fetched yet, as of the last Intake.lag()
    last_activity: float = 0.0
    consumed: int = 0
    lane_records: dict[int, int] = field(default_factory=dict)  # key ordering: records per bucket
    hot_key: str | None = None


@dataclass(slots=True)
class PauseState:
    """Why the partition must not fetch, and what the client was last told (librdkafka's own
    pause state is not to be trusted across rebalances)."""

    holds: dict[PauseReason, Hold] = field(default_factory=dict)
    flow_paused: bool = False  # backpressure: over its share of the host's backlog
    ahead: bool = False  # key/unordered: too many records past the committed offset
    paused: bool = False  # as last sent to the client
    last_resume: float = 0.0


@dataclass(slots=True)
class Stats:
    records_done: int = 0
    outputs: int = 0
    dead_letters: int = 0
    discarded: int = 0
    deferrals: int = 0  # consecutive back-offs / delivery failures (exponential waits)
    done_at: float = 0.0  # clock time of the last batch done


class Epochs(Protocol):
    """The epoch table's slots (table.py SlotTable): a fresh epoch for a slot."""

    def fence(self, slot: int, /) -> int: ...


class Client(Protocol):
    """What a partition asks of the consumer itself (never a pause: flow control's)."""

    def release(self, tp: TP, run: Run, keep: bool = False, /) -> None: ...
    def seek(self, tp: TP, offset: int, /) -> bool: ...


class Discards(Protocol):
    """What a partition tells the scheduler (runtime/supervisor/scheduling/scheduler.py)."""

    def discard(self, tp: TP, /) -> Sequence[Batch]: ...


@dataclass(frozen=True)
class Outside:
    """What a partition's own changes reach beyond it, the same for every partition of the
    table (table.py): the epoch table, the client, the scheduler, the clock."""

    epochs: Epochs
    client: Client
    scheduler: Discards
    clock: Callable[[], float]


class Partition:
    """One assigned partition: its parts, changed by its own methods only (module docstring)."""

    __slots__ = ("_epoch", "_outside", "_rewinding", "intake", "pause", "slot", "stats", "tp", "tracker")

    def __init__(self, tp: TP, slot: int, batch_records: int, outside: Outside, now: float,
                 share: bool = False) -> None:
        """A new epoch of ``slot`` is taken at once. ``share``: read through a share group
        (its records are acknowledged, acknowledgements.py)."""
        self.tp = tp
        self.slot = slot
        self._outside = outside
        self._epoch = outside.epochs.fence(slot)
        self._rewinding = False  # fenced; waiting for its batches out there before reading again
        self.intake = IntakeState(batch_records, last_activity=now)
        self.tracker: OffsetTracker = AckTracker() if share else OffsetTracker()
        self.pause = PauseState(last_resume=now)
        self.stats = Stats()

    # ------------------------------------------------------------------ reading
    @property
    def label(self) -> str:
        return tp_label(self.tp)

    @property
    def epoch(self) -> int:
        """What workers compare a frame's epoch against before running it (invariant 5)."""
        return self._epoch

    @property
    def rewinding(self) -> bool:
        return self._rewinding

    def holding(self, reason: PauseReason) -> Hold | None:
        return self.pause.holds.get(reason)

    @property
    def held(self) -> bool:
        """Held for a reason (operator, back-off, ...) or rewinding: no batch may be cut or
        dispatched, and it must not fetch."""
        return bool(self.pause.holds) or self._rewinding

    @property
    def seeking(self) -> bool:
        """Its start offset is not known yet (wait_for_start)."""
        return PauseReason.SEEKING in self.pause.holds

    @property
    def blocked(self) -> str | None:
        hold = self.pause.holds.get(PauseReason.BLOCKED)
        return hold.detail if hold else None

    @property
    def keeps(self) -> bool:
        """Whether a share group's records not done in a rewind are kept by this member, to run
        again after the wait, rather than released: every release spends one of a record's
        deliveries, and at the group's limit the broker archives it (issue 44). All but an
        operator's pause, which hands them to the other members at once (docs/share-groups.md)."""
        return isinstance(self.tracker, AckTracker) and PauseReason.OPERATOR not in self.pause.holds

    @property
    def wants_pause(self) -> bool:
        """Whether it must not fetch now: held, over its share of the backlog or too far ahead."""
        return self.pause.flow_paused or self.pause.ahead or self.held

    def pause_reasons(self) -> list[PauseReason]:
        reasons = list(self.pause.holds)
        if self.pause.ahead:
            reasons.insert(0, PauseReason.AHEAD)
        if self.pause.flow_paused:
            reasons.insert(0, PauseReason.FLOW)
        return reasons

    # ------------------------------------------------------------------ its life
    def fence(self, keep: bool = False) -> None:
        """A new epoch in shared memory: workers skip every frame of an older one from now on
        (invariant 5). What was fetched and not cut, and its batches not in a ring yet, are
        stale: dropped (the scheduler is told once). ``keep``: a share group's consumer keeps
        the records dropped, to run after a wait (``keeps``)."""
        self._epoch = self._outside.epochs.fence(self.slot)
        self._discard(keep)

    def rewind(self, reason: PauseReason, detail: str, until: float | None = None) -> None:
        """Hold the partition and read it again from its lowest unhandled offset once its
        batches out in the rings have come back (read_again): a batch deferred by an outage
        or a plugin's Backoff, a record with nowhere to go, an operator pause."""
        self.hold(reason, detail, until)
        if self._rewinding:
            return
        self.fence(self.keeps)
        self._rewinding = True
        log.info("partition held", extra={"tp": self.label, "reason": reason.value, "detail": detail})

    def read_again(self) -> bool:
        """Rewinding, with every batch of the old epoch back (done, or skipped by its worker):
        what is not done is read again from its restart offset. RACE: sought any earlier, a late
        DONE could move the committable offset past the seek position. False if the client
        refused the seek (the caller tries again on its next turn)."""
        restart = self.tracker.restart_offset()
        if restart is None:
            restart = self.intake.dropped_from  # nothing registered: the first record dropped
        self.tracker.discard_unfinished(self.keeps)
        if restart is not None and not self._outside.client.seek(self.tp, restart):
            return False
        self._rewinding = False
        self._positioned()
        log.debug("partition rewound", extra={"tp": self.label, "restart": restart})
        return True

    def hold(self, reason: PauseReason, detail: str, until: float | None = None) -> None:
        """Hold it (no batch is cut or placed, and flow control pauses it) until released or
        ``until`` (clock time). Held again for the same reason, it keeps when the hold began."""
        assert reason in HOLDS, reason
        old = self.pause.holds.get(reason)
        self.pause.holds[reason] = Hold(reason, detail, until, old.since if old else self._outside.clock())

    def release(self, reason: PauseReason) -> bool:
        """True if it was held for this reason (it fetches again once flow control resumes it,
        if nothing else holds it)."""
        return self.pause.holds.pop(reason, None) is not None

    def expire_holds(self, now: float) -> list[Hold]:
        """The holds whose time is up, released."""
        ended = [h for h in self.pause.holds.values() if h.until is not None and now >= h.until]
        for hold in ended:
            del self.pause.holds[hold.reason]
        return ended

    def wait_for_start(self) -> None:
        """Its committed offset could not be read: held (SEEKING) until it is, and whatever was
        fetched for it meanwhile is dropped."""
        self.hold(PauseReason.SEEKING, "waiting to read the committed offset")
        self._discard()

    def started(self) -> bool:
        """Sought to its start: read from there. True if it was waiting for it (SEEKING)."""
        self._positioned()
        return self.release(PauseReason.SEEKING)

    def _discard(self, keep: bool = False) -> Sequence[Batch]:
        """Forget fetched records not cut yet, remembering where they began (a rewind must go
        back at least that far), and the batches not in a ring yet (returned). A share group's
        consumer is told even of none: it keeps them, or releases them with its records of
        the partition not handed out yet (``keep``)."""
        s = self.intake
        if s.open_msgs:
            first = offset_of(s.open_msgs[0])
            s.dropped_from = first if s.dropped_from is None else min(first, s.dropped_from)
        if s.open_msgs or isinstance(self.tracker, AckTracker):
            self._outside.client.release(self.tp, s.open_msgs, keep)
        s.open_msgs = []
        return self._outside.scheduler.discard(self.tp)

    def _positioned(self) -> None:
        """It is read again from a new position: what was seen is forgotten."""
        self.intake.next_offset = self.intake.eof_at = self.intake.dropped_from = None

    # ------------------------------------------------------------------ intake
    def fetched(self, run: Run, now: float) -> None:
        """Records consume() returned for it, in offset order. Rewinding (fetched before the
        seek that reads it again) or not started yet, they are dropped, and where the dropped
        records began is remembered, so that the seek goes back there."""
        s = self.intake
        if self._rewinding or self.seeking:
            first = offset_of(run[0])
            if self._rewinding and (s.dropped_from is None or first < s.dropped_from):
                s.dropped_from = first
            self._outside.client.release(self.tp, run, self.keeps)
            return
        run = self._fresh(run)
        if not run:
            return
        if s.open_msgs:
            s.open_msgs.extend(run)
        else:
            s.open_msgs = run
            s.open_since = now
        if s.first_offset is None:
            s.first_offset = offset_of(run[0])
        s.consumed += len(run)
        s.next_offset = offset_of(run[-1]) + 1
        s.eof_at = None
        s.last_activity = now

    def _fresh(self, run: Run) -> Run:
        """INVARIANT (1): the records of ``run`` the partition was not handed before. A
        consume() can return records of an older position: librdkafka purges its queue on a
        seek, not what it already returned to Python, and a start sought again under a
        partition still held goes back to the group's committed offset. Below ``next_offset``
        (handed over since it was positioned) or the tracker's ``handled_to`` (registered or
        done), a record is cut already or done: registered again it would be run twice, and
        the tracker refuses a span that goes backwards (issue 40's crash, "span [349..349]
        overlaps or goes backwards"). Dropped, with a debug line. A share group's broker hands
        a record over again when it is released: every delivery is new there."""
        if isinstance(self.tracker, AckTracker):
            return run
        if offset_of(run[-1]) - offset_of(run[0]) < len(run) - 1:
            run = self._in_order(run)
        seen = [o for o in (self.intake.next_offset, self.tracker.handled_to) if o is not None]
        floor = max(seen, default=None)
        if floor is None or offset_of(run[0]) >= floor:
            return run
        keep = next((i for i, m in enumerate(run) if offset_of(m) >= floor), len(run))
        stale, run = run[:keep], run[keep:]
        log.debug("stale records dropped", extra={
            "tp": self.label, "first": offset_of(stale[0]), "last": offset_of(stale[-1]), "expected": floor})
        self._outside.client.release(self.tp, stale)
        return run

    def _in_order(self, run: Run) -> Run:
        """A run that is not in strictly rising offset order (O(1) to suspect: more records
        than offsets between its ends) holds a record twice, or goes back: each record past
        the highest before it is kept, the others were handed over already in this run.
        The backstop: the one cause found, an end event between two records handed over as
        a record, is fixed where runs are made (runtime/kafka/consumer.py); cut, a record
        twice crashed the supervisor. A repeat that gaps in the offsets (transactions'
        markers, compaction) hide from the O(1) test is not looked for: the tracker refuses
        what goes backwards there."""
        kept, top = [], None
        for m in run:
            offset = offset_of(m)
            if top is None or offset > top:
                kept.append(m)
                top = offset
        log.warning("records out of order in what the client handed over: the repeats dropped", extra={
            "tp": self.label, "records": len(run), "kept": len(kept), "first": offset_of(run[0]),
            "last": offset_of(run[-1])})
        return kept

    def reached_end(self, offset: int, now: float) -> None:
        """The consumer reported the partition's end at ``offset``. RACE: one consume() can
        return a partition's last records and its end together (taken first): the end counts
        only if nothing newer came after it."""
        if self._rewinding:
            return
        s = self.intake
        if s.next_offset is None or offset >= s.next_offset:
            s.eof_at = offset
            s.last_activity = now
            if s.first_offset is None:
                s.first_offset = offset
            self.close_invisible_tail(now)

    def take_open(self) -> Run:
        """The records fetched and not cut yet, taken to be cut."""
        msgs, self.intake.open_msgs = self.intake.open_msgs, []
        return msgs

    def sized(self, batch_records: int) -> None:
        """Records per batch from now on (intake.py ``batch_size``)."""
        self.intake.batch_records = batch_records

    def learn_bytes(self, bytes_per_record: float) -> None:
        """The size of a frame just packed, per record."""
        self.intake.bytes_per_record = moving_average(self.intake.bytes_per_record, bytes_per_record)

    def learn_cost(self, busy_ms: float, records: int) -> bool:
        """How long the plugin took per record of this partition (a batch done). True if
        learnt (the batch size may change)."""
        if records <= 0 or busy_ms < 0:
            return False
        self.intake.us_per_record = moving_average(self.intake.us_per_record, busy_ms * 1000 / records)
        return True

    def note_lanes(self, records_per_bucket: Iterable[tuple[int, int]], hot_key: str | None,
                   seen: bool) -> None:
        """Key ordering: records per bucket in a cut; ``seen``: the cut was large enough to judge
        a hot key by (then ``hot_key`` replaces what was said before)."""
        s = self.intake
        for bucket, n in records_per_bucket:
            s.lane_records[bucket] = s.lane_records.get(bucket, 0) + n
        if seen:
            s.hot_key = hot_key

    def set_behind(self, records: int) -> None:
        """Records in the log not fetched yet (Intake.lag)."""
        self.intake.behind = records

    # ------------------------------------------------------------------ tracker
    def register(self, spans: Sequence[tuple[int, int, int]], now: float) -> None:
        """INVARIANT (1): each batch cut (batch id, first, last) registered before it can
        complete, a span each (one lane: they are in offset order)."""
        for bid, first, last in spans:
            self.tracker.register(bid, first, last, now)

    def register_span(self, first: int, last: int, parts: Sequence[tuple[int, int, int]], records: int,
                      now: float) -> None:
        """INVARIANT (1): a cut whose lanes interleave (key ordering), one span done when every
        one of its batches is."""
        self.tracker.register_span(first, last, parts, records, now)

    def close_invisible_tail(self, now: float) -> None:
        """The consumer reported the partition's end past the last record it handed over: the
        offsets between hold no record it can see (a transaction's commit marker; under
        read_committed, aborted records too), so they are done once the records before them
        are (offsets.py ``skip_to``). INVARIANT (1): only when every record fetched since the
        partition was last (re)positioned is registered – none waits uncut, none was dropped
        (a rewind or a seek resets ``next_offset``, and records dropped while SEEKING leave it
        behind) – so no record we were handed lies in the gap."""
        s = self.intake
        if s.eof_at is None or s.open_msgs or self._rewinding or self.seeking:
            return
        if s.next_offset is None:
            # Positioned (not SEEKING: the seek discarded what was fetched before it) and no
            # record handed over since: the end is where reading began, or nothing before
            # it is visible. Only for a tracker that never registered a record.
            self.tracker.start_at_end(s.eof_at)
            return
        self.tracker.skip_to(s.next_offset, s.eof_at, now)

    def split(self, batch_id: int, parts: list[tuple[int, int, int]]) -> None:
        """A batch that keeps crashing workers, bisected (isolation.py): its halves replace it."""
        self.tracker.split(batch_id, parts)

    def committed(self, offset: int | None) -> None:
        """The broker has ``offset`` (None: a refused commit, to be sent again)."""
        self.tracker.mark_committed(offset)

    def let_go_unfinished(self) -> None:
        """A share group's partition released: what is not done is handed back (RELEASE)."""
        self.tracker.discard_unfinished()

    def give_up(self, batch_id: int, outcome: Outcome = Outcome.RELEASE) -> None:
        """A share group's batch this member will not finish: RELEASE (a crashing record whose
        lock ends before its letter could be acknowledged), or REJECT (one it cannot
        dead-letter: no dead-letter topic)."""
        assert isinstance(self.tracker, AckTracker)
        self.tracker.give_up(batch_id, outcome)

    def hand_back_unstarted(self) -> tuple[int, int]:
        """A share group's records out near the end of their acquisition lock: its batches not
        in a ring yet, and records not cut, are released now, so that another member (or this
        one, later) runs them with a fresh lock, rather than here after it ended (twice: issue
        44, a slow record held a poll of 500-1,500 in the rings behind it). A record at its last
        delivery is not released (the share consumer keeps it and dead-letters it). What is in
        a ring runs on. Returns (records handed back, records it held)."""
        if not isinstance(self.tracker, AckTracker) or self._rewinding:
            return 0, 0
        held = self.tracker.uncommitted_records + len(self.intake.open_msgs)
        uncut = len(self.intake.open_msgs)
        dropped = self._discard()
        for b in dropped:
            self.tracker.give_up(b.batch_id)
        return sum(b.count for b in dropped) + uncut, held

    def take_acks(self) -> list[Intent]:
        """A share group's acknowledgements due (acknowledgements.py)."""
        assert isinstance(self.tracker, AckTracker)
        return self.tracker.take_intents()

    # ------------------------------------------------------------------ results
    def done(self, batch_id: int, processed: int, outputs: int, dead_letters: int, discarded: int,
             now: float) -> None:
        """A batch of it is done: the tracker completes it (the committable offset may move)."""
        self.tracker.complete(batch_id)
        st = self.stats
        st.records_done += processed
        st.outputs += outputs
        st.dead_letters += dead_letters
        st.discarded += discarded
        st.deferrals = 0
        st.done_at = now

    def deferred(self) -> int:
        """A batch of it was deferred: how many times in a row before this one."""
        n = self.stats.deferrals
        self.stats.deferrals += 1
        return n

    def letter_done(self, batch_id: int) -> None:
        """The dead letter the supervisor wrote for one of its records was acknowledged: that
        one-record batch is handled (invariant 1)."""
        self.tracker.complete(batch_id)
        self.stats.dead_letters += 1

    # ------------------------------------------------------------------ flow control's
    def decided(self, flow_paused: bool, ahead: bool) -> None:
        """Flow control's backpressure decision (flowcontrol.py)."""
        self.pause.flow_paused = flow_paused
        self.pause.ahead = ahead

    def told(self, paused: bool, now: float | None = None) -> None:
        """What flow control told the client; ``now``: when a resume was sent (also a resume
        sent again to repair one the client lost)."""
        self.pause.paused = paused
        if now is not None:
            self.pause.last_resume = now


def moving_average(average: float, sample: float) -> float:
    """0 means nothing learnt yet."""
    return (1 - _COST_WEIGHT) * average + _COST_WEIGHT * sample if average else sample
