"""The intake room: what consume() returned, handed to each partition, and cut into batches.
Runs in: supervisor.

    consume() (the loop's) ─▶ runs per partition ─▶ open records (the partition's) ─cut─▶
        batches (per key bucket in key ordering) ─▶ the scheduler's lanes (spans registered in
        the partition's offset tracker)

Decides when a partition's records are cut and how; the partition keeps them
(runtime/supervisor/partition/partition.py). Never blocks.

How big a batch is: at most ``batch_max_records``; at most about a sixteenth of a ring for
large records (bytes per record learnt from packed frames); and at most about
``batch_target_ms`` of plugin work (µs per record learnt from the workers' results). The
last bound is for latency: a record waits for the whole batch it is in, so 500 records of
100 µs put 50 ms on every one of them (issue 16). A partition with a backlog gets batches of
up to 4 × ``batch_target_ms`` (``batch_size``): its records wait in line whatever the cut,
and each batch costs its worker a wait for the broker's acknowledgements. A batch is cut when
it is full, when its first record has waited ``batch_max_wait_ms``, or at once when a worker
has room and nothing waits for it, provided the client had nothing more queued (small batches
only when they cost nothing: when the supervisor is behind, cutting whatever arrived for every
idle worker made thousands of tiny batches, and adding workers made trivial work slower —
issue 16).

In ``key`` ordering a cut is split by key bucket. A cut too small to give each bucket a
worthwhile frame puts several buckets in one frame, in offset order (``_groups``): every cut
split in ~15 frames of a dozen records filled the supervisor with per-frame work and held
records behind it (issue 24: ~10 µs work ran at 0.54 of ideal against Pool(15)'s 0.62, p99
28 ms at half capacity). While a partition has a backlog and no worker is short of work, its
records are gathered until the cut holds a full batch for each bucket seen in it, for at most
10 × ``batch_max_wait_ms`` (``_gather``).

A share group's records are each under an acquisition lock: the loop takes no more of them than
its workers can start within half the lock (``within_the_lock``), the others wait in the
share consumer (released if their lock nears its end there). A record the share consumer says
is at its last delivery and will not be done in time is dead-lettered by the supervisor
(``LastDelivery``), like a record too large for a ring.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runtime.config import WorkerSettings
from runtime.errors import UnreadableRecord
from runtime.kafka.consumer import Fetched
from runtime.supervisor.datapath.deadletter_desk import supervisor_letter
from runtime.supervisor.datapath.isolation import fitted_letter_batch
from runtime.supervisor.partition.partition import Partition, moving_average
from runtime.supervisor.scheduling.batches import Batch, Bucket
from runtime.supervisor.scheduling.capacity import Capacity
from runtime.supervisor.seams.consumer import Consumer
from runtime.tp import TP, tp_label
from runtime.transport.packing import Run, fields_of, keys_of, offset_of, pack_run, salvage, split_by_key

log = logging.getLogger("ringmaster.intake")

_FRAMES_PER_RING = 16  # frames are sized to hold about 1/16 of a ring (see batch_size())
_HOT_LANE_SHARE = 0.8  # key ordering: a lane taking this share of a big cut...
_HOT_KEY_SHARE = 0.5  # ... because one key has this share of it, is reported
_HOT_MIN_RECORDS = 200
_BUCKET_SHARE = 0.25  # key ordering: a bucket's own frame holds at least this share of a batch
_LAG_S = 0.05  # how often lag() is asked for (the scheduler's lane weights)
# A partition with a backlog of this many batches (fetched and not cut, or not fetched yet)
# is cut in batches of up to _BACKLOG_STRETCH × batch_target_ms: see batch_size().
_BACKLOG_BATCHES = 24
_BACKLOG_STRETCH = 4
_GATHER_RING_SHARE = 4  # key ordering: records gathered for one cut hold at most 1/4 of a ring (_gather)
_GATHER_WAITS = 10  # ... and its first record waits at most this many batch_max_wait_ms (cut())
# A share group's records the loop holds at once (fetched, not done): what its workers can
# start within this share of the acquisition lock, at the µs per record learnt (issue 44: a
# poll of 500-1,500 records with one slow record ran every record twice, their locks run out
# in the rings behind it). The µs per record leave out what a batch costs around the plugin
# (the ring, the result, the loop; on a loaded host, a lot): each time records had to be
# handed back unstarted (``overcommitted``) the share shrinks to what did start of what was
# taken (at most half of it), down to _LOCK_HORIZON_MIN, and each lock's length without one
# grows it by _LOCK_HORIZON_GROWTH, up to _LOCK_HORIZON. (Grown per batch done, it was back
# at the top within one lock, and a broker stall's aftermath handed back 350-410 batches a
# lock, the records handed out four times each; halved only, 230 and then 200.)
_LOCK_HORIZON = 0.5
_LOCK_HORIZON_MIN = 0.02
_LOCK_HORIZON_GROWTH = 1.25


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A record that fits in no ring: dead-lettered by the supervisor (registered as its own
    one-record batch, so nothing is committed past it until that is acknowledged), or under
    exactly-once a LETTERS batch in its lane (``Intake.letters_in_lane``)."""

    tp: TP
    batch_id: int
    row: tuple[int, bytes | None, bytes | None, object]
    frame_bytes: int
    max_frame: int
    delivery_count: int | None = None  # a share group's
    error_type = "RecordTooLarge"

    @property
    def message(self) -> str:
        return (f"record of {self.frame_bytes} bytes does not fit in a ring "
                f"(frame limit {self.max_frame}); raise workers.ring_bytes")


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A record with a field the Kafka client cannot read (a header name that is not UTF-8):
    dead-lettered by the supervisor like TooLarge, with what could be read of it."""

    tp: TP
    batch_id: int
    row: tuple[int, bytes | None, bytes | None, object]
    message: str
    delivery_count: int | None = None  # a share group's
    error_type = "UnreadableRecord"


@dataclass(frozen=True, slots=True)
class LastDelivery:
    """A share group's record at its last delivery (the group's share.delivery.count.limit)
    that will not be done within its acquisition lock: released, or left to the lock, the
    broker would archive it with no trace. Dead-lettered by the supervisor, then accepted
    (runtime/kafka/share_consumer.py says when)."""

    tp: TP
    batch_id: int
    row: tuple[int, bytes | None, bytes | None, object]
    message: str
    delivery_count: int
    error_type = "DeliveryLimitReached"


SetAside = TooLarge | Unreadable | LastDelivery  # records the supervisor dead-letters itself

@dataclass(frozen=True, slots=True)
class IntakeView:
    """What intake reports (runtime/supervisor/daemon/report.py)."""

    first_record_at: float | None  # clock time the run's first record was fetched
    consumed: int  # records fetched


@dataclass(frozen=True, slots=True)
class Cut:
    """What one cut made: batches for the scheduler's lanes, and records set aside for the
    supervisor to dead-letter (results.py ``set_aside``)."""

    batches: list[Batch]
    set_aside: list[SetAside]


@dataclass(frozen=True, slots=True)
class Sizing:
    """What a batch's size is bounded by (``batch_size``): workers.batch_max_records and
    batch_target_ms, and the rings' shape."""

    batch_max_records: int
    batch_target_ms: float
    max_frame: int
    ring_capacity: int


@dataclass(frozen=True, slots=True)
class Shape:
    """How intake cuts, from the settings and the rings: ``share`` (a share group's: frames
    carry delivery counts), ``buckets`` (key ordering: lanes per partition, fixed for the run),
    ``letters_in_lane`` (under exactly-once with a dead-letter topic, the largest letter it
    takes: set-aside records are then LETTERS batches in their lane, ``_in_lane``, not
    handed to the supervisor's desk; None: they are), ``lock_s`` (a share group's acquisition
    lock, read from the group at start: what the loop takes is sized by it, ``within_the_lock``)."""

    w: WorkerSettings
    sizing: Sizing
    share: bool
    buckets: int
    letters_in_lane: int | None = None
    lock_s: float | None = None


class BatchIds:
    """One counter for every batch of the run, so an id never means two batches."""

    def __init__(self) -> None:
        self._next = 1

    def __call__(self) -> int:
        bid = self._next
        self._next += 1
        return bid


class Intake:
    def __init__(self, shape: Shape, consumer: Consumer, partitions: Mapping[TP, Partition],
                 next_id: BatchIds, clock: Callable[[], float]) -> None:
        """``consumer``: where the ends of partitions (high watermarks) are read and records of
        partitions no longer held are handed back."""
        self.w = shape.w
        self.sizing = shape.sizing
        self.consumer = consumer
        self.partitions = partitions
        self.buckets = shape.buckets
        self.ring_capacity = shape.sizing.ring_capacity
        self.max_frame = shape.sizing.max_frame
        self.next_id = next_id
        self.clock = clock
        self.ordering = self.w.ordering
        self.share = shape.share
        self.letters_in_lane = shape.letters_in_lane
        self.lock_s = shape.lock_s
        self.lock_share = _LOCK_HORIZON  # of the lock the loop fills (within_the_lock)
        self._lock_share_at = clock()  # when it last changed
        self._last: list[SetAside] = []  # records at their last delivery, for the next cut's set-aside
        self.bytes_per_record = 0.0  # over all packed frames (fetch sizing)
        self.consumed = 0
        self.last_records_at = clock()
        self.first_record_at: float | None = None
        self._lag_at = float("-inf")

    def snapshot(self) -> IntakeView:
        return IntakeView(self.first_record_at, self.consumed)

    # ------------------------------------------------------------------ fetched records
    def within_the_lock(self, wanted: int) -> int:
        """A share group's: how many of ``wanted`` records the loop may take, so that what it
        holds (fetched and not done) is what its workers start within _LOCK_HORIZON of the
        lock, at the slowest partition's µs per record (before any is learnt, a batch per
        worker). What it holds beyond that would wait in the rings while its lock ran out, and
        run twice; left in the share consumer, it goes to another member instead."""
        if self.lock_s is None:
            return wanted
        now = self.clock()
        if self.lock_share < _LOCK_HORIZON and now - self._lock_share_at >= self.lock_s:
            self.lock_share = min(_LOCK_HORIZON, self.lock_share * _LOCK_HORIZON_GROWTH)
            self._lock_share_at = now
        cost_us = max((p.intake.us_per_record for p in self.partitions.values()), default=0.0)
        workers = max(1, self.w.processes)
        if cost_us > 0:
            horizon = max(1, int(workers * self.lock_s * self.lock_share * 1e6 / cost_us))
        else:
            horizon = workers * self.w.batch_max_records
        held = sum(p.tracker.uncommitted_records + len(p.intake.open_msgs) for p in self.partitions.values())
        return min(wanted, max(0, horizon - held))

    def take(self, fetched: Fetched) -> bool:
        """Apply what consume() returned (after the rebalance straddle was settled). True if
        these are the first records of the run. A share group's partitions whose records near
        the end of their lock hand back what is not started (``Partition.hand_back_unstarted``)."""
        now = self.clock()
        first = False
        for tp in fetched.lock_ending:
            p = self.partitions.get(tp)
            if p is not None:
                self._hand_back(p)
        for tp, last in fetched.last_deliveries.items():
            self._last_deliveries(tp, last)
        if fetched.count:
            self.last_records_at = now
            if self.first_record_at is None:
                self.first_record_at = now
                first = True
            self.consumed += fetched.count
        for tp, run in fetched.runs.items():
            p = self.partitions.get(tp)
            if p is None:  # revoked meanwhile, or over capacity: not ours to process or commit
                self.consumer.release(tp, run)
            else:
                p.fetched(run, now)
        for tp, offset in fetched.eof.items():
            p = self.partitions.get(tp)
            if p is not None:
                p.reached_end(offset, now)
        return first

    def _hand_back(self, p: Partition) -> None:
        unstarted, held = p.hand_back_unstarted()
        if unstarted:
            log.info("records not started as their acquisition lock nears its end: released; "
                     "fetching less of them from now on", extra={"tp": p.label, "records": unstarted,
                                                                 "held": held})
            self.overcommitted(1 - unstarted / max(held, unstarted))

    def _last_deliveries(self, tp: TP, run: Run) -> None:
        """Share records at their last delivery, not done in time (LastDelivery): each one a
        batch of its own, registered (invariant 1: acknowledged only once its letter is), set
        aside for the supervisor's dead letter, with why it waits (its partition's holds)."""
        p = self.partitions.get(tp)
        if p is None:
            return
        why = "; ".join(f"{h.reason.value}: {h.detail}" for h in p.pause.holds.values()) or "its batch waited"
        now = self.clock()
        for m in run:
            offset, count = offset_of(m), m.delivery_count() or 1
            bid = self.next_id()
            p.register([(bid, offset, offset)], now)
            self._last.append(LastDelivery(tp, bid, fields_of(m), (
                f"not done within the acquisition lock of its last delivery (delivery {count}: the group's "
                f"share.delivery.count.limit); released, the broker would archive it with no trace; "
                f"held: {why}"), count))
            log.error("record at its last delivery not done in time: dead-lettered", extra={
                "tp": tp_label(tp), "offset": offset, "delivery_count": count, "held": why})

    def overcommitted(self, started: float) -> None:
        """A share group's records had to be handed back unstarted as their lock neared its end;
        ``started``: the share of what the loop held that did start. It takes that much less of
        the lock's worth from now on, at least half as much."""
        self.lock_share = max(_LOCK_HORIZON_MIN, self.lock_share * min(0.5, max(0.0, started)))
        self._lock_share_at = self.clock()

    # ------------------------------------------------------------------ cutting
    def cut(self, capacity: Capacity, drained: bool) -> Cut:
        """Turn fetched records into batches: when a batch is full, old enough, or a worker
        has room, nothing waits for it and the client had nothing more queued (``drained``:
        the last consume() took everything). Records that fit in no ring are set aside. While
        some worker has next to nothing to do (``capacity.hungry``) nothing is gathered
        (``_gather``)."""
        now = self.clock()
        max_wait = self.w.batch_max_wait_ms / 1000
        out = Cut([], self._last)
        self._last = []
        worker_has_room = capacity.spare
        hungry = bool(capacity.hungry)
        gathered = 0  # records of gathered cuts in this tick
        for p in self.partitions.values():
            s = p.intake
            if not s.open_msgs or p.held:
                continue
            gather = self._gather(p)
            if gather and not hungry:
                # No worker is short of work and the partition has a backlog: its records wait
                # in line whatever the cut. Bounded in time all the same: a stale lag() can
                # promise records the log does not hold. At most a batch a worker of them in
                # one tick, the rest in the next ones: at the end of a backlog every
                # partition's gathering ends at once, and cutting ~100,000 records took one
                # ~80 ms turn while nothing was placed and the workers ran dry (issue 41).
                if gathered >= max(1, len(capacity.allowance)) * self._step(p):
                    continue
                if len(s.open_msgs) >= gather or now - s.open_since >= _GATHER_WAITS * max_wait:
                    gathered += len(s.open_msgs)
                    self._cut(p, now, out)
                continue
            if (len(s.open_msgs) >= self._step(p) or now - s.open_since >= max_wait
                    or (worker_has_room and drained)):
                self._cut(p, now, out)
        return out

    def _gather(self, p: Partition) -> int:
        """Key ordering, a backlog: how many records to gather before cutting, so that each key
        bucket seen in the partition gets a full batch (0: cut as usual). A cut of one batch
        split ~16 ways gave frames of ~40 records at ~100 µs, and each frame costs its worker a
        wait for acknowledgements: 0.89 of ideal with 0.5 ms waits, against 0.96 in partition
        ordering (the simulator's "acks" cases; issue 24). Only while no worker is short of
        work (``cut``): when the supervisor is the bottleneck (~10 µs of work) workers are
        hungry, and gathering would starve them. At most what the log holds (at the end of a
        burst, what is left is cut once fetched), half of max_uncommitted_records (a partition
        pauses at it), and a quarter of a ring's bytes: the records wait in the supervisor's
        memory, 2 MiB a partition at most with the default 8 MiB rings. Not for a paused
        partition (over its share of the backlog budget, or too far ahead of its committed
        offset): it fetches nothing more, so what it holds is all a cut would get."""
        if self.ordering != "key" or p.pause.paused or not self._backlog(p):
            return 0
        s = p.intake
        step = self._step(p)
        gather = step * max(1, len(s.lane_records))
        gather = min(gather, self.w.max_uncommitted_records // 2)
        if s.bytes_per_record > 0:
            gather = min(gather, int(self.ring_capacity / _GATHER_RING_SHARE / s.bytes_per_record))
        # No more than the log holds (the end of a burst: cut what there is once it is fetched).
        gather = min(gather, len(s.open_msgs) + s.behind)
        return gather if gather > step else 0

    def _bucket_runs(self, p: Partition, msgs: Run) -> Sequence[tuple[tuple[int, ...] | None, Run]]:
        if self.ordering != "key":
            return [(None, msgs)]
        # Records without a key stay together in a bucket of their own, in partition order.
        by_bucket = split_by_key(msgs, self.buckets, null_lane=self.buckets)
        self._watch_skew(p, msgs, by_bucket)
        # Grouped by the unstretched size even under a backlog: a frame of several buckets runs
        # only when it heads all their lanes, and grouping by 4 × the size held a hot
        # partition's lanes back (0.99 of ideal fell to 0.80 in the simulator).
        return _groups(msgs, sorted(by_bucket.items()), p.intake.batch_records * _BUCKET_SHARE)

    def _cut(self, p: Partition, now: float, out: Cut) -> None:
        step = self._step(p)
        msgs = p.take_open()
        parts: list[Batch | SetAside] = []
        for buckets, run in self._bucket_runs(p, msgs):
            for i in range(0, len(run), step):
                self._pack(p, buckets, run, i, min(i + step, len(run)), parts)
        self._register(p, msgs, parts, now)
        p.close_invisible_tail(now)
        p.sized(batch_size(self.sizing, p))
        if self.letters_in_lane is not None:
            parts = [x if isinstance(x, Batch) else self._in_lane(x, self.letters_in_lane) for x in parts]
        out.set_aside.extend(x for x in parts if not isinstance(x, Batch))
        out.batches.extend(x for x in parts if isinstance(x, Batch))

    def _in_lane(self, x: SetAside, max_bytes: int) -> Batch:
        """Exactly-once: the set-aside record's letter as a LETTERS batch in the record's place
        in its lane, which a worker writes and commits with the offset past the record in one
        transaction (isolation.letter_batch). Written by the supervisor's desk, outside any
        transaction, the letter was not ordered against the lane: the next batch's transaction
        could commit past the record before the broker had the letter, and a supervisor
        SIGKILLed then lost it (docs/exactly-once.md). The letter must fit a frame: one of a
        record too large for every ring is truncated to fit (``ringmaster.value.truncated``
        says how large the value was), or at worst only says where the record is."""
        tp, offset, p = x.tp, x.row[0], self.partitions[x.tp]
        letter_at = functools.partial(supervisor_letter, tp, x.row, x.error_type, x.message)
        batch = fitted_letter_batch(x.batch_id, tp, p.slot, p.epoch, offset, letter_at,
                                    max_bytes, self.max_frame)
        log.error("record set aside; its dead letter commits with its offset in a worker's transaction",
                  extra={"tp": tp_label(tp), "offset": offset, "error": f"{x.error_type}: {x.message}"})
        return batch

    def _step(self, p: Partition) -> int:
        """Records per batch to cut now: ``batch_records``, or more under a backlog (``batch_size``)."""
        return batch_size(self.sizing, p, backlog=True) if self._backlog(p) else p.intake.batch_records

    @staticmethod
    def _backlog(p: Partition) -> bool:
        """Whether the partition holds _BACKLOG_BATCHES batches of work or more: fetched and
        not cut, plus what the log holds beyond what was fetched (as of the last lag())."""
        s = p.intake
        return len(s.open_msgs) + s.behind >= _BACKLOG_BATCHES * s.batch_records

    def _register(self, p: Partition, msgs: Run, parts: list[Batch | SetAside], now: float) -> None:
        """INVARIANT (1): every record cut is registered before its batch can complete."""
        spans = [(x.batch_id, x.first, x.last) if isinstance(x, Batch) else (x.batch_id, x.row[0], x.row[0])
                 for x in parts]
        if self.ordering == "key":
            # Buckets interleave: one span for the whole cut, done when every bucket's part is.
            p.register_span(offset_of(msgs[0]), offset_of(msgs[-1]), spans, len(msgs), now)
        else:
            p.register(spans, now)  # one lane, in offset order: a span per batch

    def _pack(self, p: Partition, buckets: tuple[int, ...] | None, msgs: Run, start: int, stop: int,
              out: list[Batch | SetAside]) -> None:
        """Pack msgs[start:stop] into one frame (split in two while it does not fit)."""
        batch_id = self.next_id()
        count = stop - start
        counts = [m.delivery_count() or 1 for m in msgs[start:stop]] if self.share else None
        try:
            frame = pack_run(batch_id, p.slot, p.epoch, p.tp[0], p.tp[1], msgs, start, stop, counts)
        except UnreadableRecord as bad:
            # Set aside for the supervisor to dead-letter; the records around it are packed
            # again by the fast path (never one by one: a bad record costs one more pack).
            i = bad.index
            if not start <= i < stop:
                raise  # a packer bug, not the record's fault: never guess which record it was
            if start < i:
                self._pack(p, buckets, msgs, start, i, out)
            row, why = salvage(msgs[i], bad)
            out.append(Unreadable(p.tp, batch_id, row, why, counts[i - start] if counts else None))
            if i + 1 < stop:
                self._pack(p, buckets, msgs, i + 1, stop, out)
            return
        size = len(frame) / count
        p.learn_bytes(size)
        self.bytes_per_record = moving_average(self.bytes_per_record, size)
        if len(frame) > self.max_frame:
            if count > 1:
                mid = start + count // 2
                self._pack(p, buckets, msgs, start, mid, out)
                self._pack(p, buckets, msgs, mid, stop, out)
                return
            out.append(TooLarge(p.tp, batch_id, fields_of(msgs[start]), len(frame), self.max_frame,
                                counts[0] if counts else None))
            return
        first, last = offset_of(msgs[start]), offset_of(msgs[stop - 1])
        bucket: Bucket = None if buckets is None else buckets[0]
        # A share group's record handed out before was not finished by a member (one that
        # died running it, mostly): those deliveries count as crashes toward
        # dead_letter.max_crashes, so a record that kills whole daemons is isolated here.
        crashes = max(counts) - 1 if counts else 0
        out.append(Batch(batch_id, p.tp, p.slot, p.epoch, first, last, count, frame, bucket,
                         crashes, buckets=buckets if buckets is not None and len(buckets) > 1 else None))

    def _watch_skew(self, p: Partition, msgs: Run, by_bucket: dict[int, Run]) -> None:
        """Key ordering spreads a partition over workers only as far as its keys allow: a hot
        key serialises the partition on one worker at a time. Say so (status), don't hide it."""
        counts = [(bucket, len(run)) for bucket, run in by_bucket.items()]
        if len(msgs) < _HOT_MIN_RECORDS:
            p.note_lanes(counts, None, seen=False)
            return
        bucket, run = max(by_bucket.items(), key=lambda kv: len(kv[1]))
        hot_key = None
        if len(run) >= _HOT_LANE_SHARE * len(msgs):
            key, n = Counter(keys_of(run)).most_common(1)[0]
            if n >= _HOT_KEY_SHARE * len(msgs):
                shown = "null" if key is None else repr(key[:40])
                hot_key = f"key {shown} is {n / len(msgs):.0%} of recent records (lane {bucket})"
        p.note_lanes(counts, hot_key, seen=True)

    def lag(self) -> dict[TP, int] | None:
        """Records of each partition in the log and not fetched yet: the high watermark the
        client cached from fetch responses (never a broker round trip) less the next offset
        to fetch. How much work each partition has left beyond what the supervisor holds.
        None between two answers (one every _LAG_S)."""
        now = self.clock()
        if now - self._lag_at < _LAG_S:
            return None
        self._lag_at = now
        behind = {}
        for tp, p in self.partitions.items():
            high, fetched = self.consumer.high_watermark(tp), p.intake.next_offset
            if high is not None and fetched is not None and high > fetched:
                behind[tp] = high - fetched
            p.set_behind(behind.get(tp, 0))
        return behind

    # ------------------------------------------------------------------ asked by other rooms
    def buffered_bytes(self, p: Partition) -> float:
        """Records fetched and not cut yet, in frame bytes (estimated)."""
        s = p.intake
        return len(s.open_msgs) * (s.bytes_per_record or self.bytes_per_record)


def batch_size(sizing: Sizing, p: Partition, backlog: bool = False) -> int:
    """Records per batch for this partition from now on (module docstring). Small frames
    against the ring keep backpressure fine-grained: with half-ring frames, 10 KiB records
    made 2 MiB frames and an 8 MiB ring refused the next one at 75 % full.

    ``backlog``: the partition has many batches of work waiting (``_backlog``), and its
    records wait in line whatever the cut: then a batch holds up to _BACKLOG_STRETCH ×
    batch_target_ms of work. Every batch ends with a wait for the broker to acknowledge
    its outputs (~0.5-1 ms against a local broker, while the worker's core idles), so
    10 ms batches lost about a tenth of each worker to it on 2 cores (issue 24)."""
    s = p.intake
    target_bytes = min(sizing.max_frame // 2, sizing.ring_capacity // _FRAMES_PER_RING)
    size = min(sizing.batch_max_records, int(target_bytes / max(s.bytes_per_record, 1.0)))
    if sizing.batch_target_ms and s.us_per_record > 0:
        stretch = _BACKLOG_STRETCH if backlog else 1
        size = min(size, int(stretch * sizing.batch_target_ms * 1000 / s.us_per_record))
    return max(1, size)


def _groups(msgs: Run, runs: list[tuple[int, Run]], least: float) -> list[tuple[tuple[int, ...], Run]]:
    """Key ordering: a cut's bucket runs as frames. A bucket with at least ``least`` records
    has frames of its own; the others share frames, a few buckets each, with at least that
    many records together, their records in offset order (the order of ``msgs``, the cut)."""
    out: list[tuple[tuple[int, ...], Run]] = []
    group: list[int] = []
    size = 0
    small: list[list[int]] = []
    for bucket, run in runs:
        if len(run) >= least:
            out.append(((bucket,), run))
            continue
        group.append(bucket)
        size += len(run)
        if size >= least:
            small.append(group)
            group, size = [], 0
    if group:
        if small:
            small[-1] += group  # the remainder joins the last group: no frame smaller than least
        else:
            small.append(group)
    if not small:
        return out
    if len(small) == 1 and not out:
        return [(tuple(small[0]), msgs)]  # the whole cut in one frame: already in offset order
    by_bucket = dict(runs)
    for buckets in small:
        merged = [m for b in buckets for m in by_bucket[b]]
        if len(buckets) > 1:
            merged.sort(key=offset_of)
        out.append((tuple(buckets), merged))
    return out
