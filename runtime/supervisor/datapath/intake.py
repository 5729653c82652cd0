"""The intake room: fetch, and cut what was fetched into batches. Runs in: supervisor.

    consume() ─▶ runs per partition ─▶ open records ─cut─▶ batches (per key bucket in key
                                                    ordering) ─▶ the scheduler's lanes
                                                    (spans registered in the offset tracker)

Owns each partition's ``intake`` part (partitions.py). Never blocks.

How big a batch is: at most ``batch_max_records``; at most about a sixteenth of a ring for
large records (bytes per record learnt from packed frames); and at most about
``batch_target_ms`` of plugin work (µs per record learnt from the workers' results). The
last bound is for latency: a record waits for the whole batch it is in, so 500 records of
100 µs put 50 ms on every one of them (issue 16). A partition with a backlog gets batches of
up to 4 × ``batch_target_ms`` (``_size``): its records wait in line whatever the cut, and
each batch costs its worker a wait for the broker's acknowledgements. A batch is cut when it is full, when its
first record has waited ``batch_max_wait_ms``, or at once when a worker has room and nothing
waits for it, provided the client had nothing more queued (small batches only when they cost
nothing: when the supervisor is behind, cutting whatever arrived for every idle worker made
thousands of tiny batches, and adding workers made trivial work slower — issue 16).

In ``key`` ordering a cut is split by key bucket. A cut too small to give each bucket a
worthwhile frame puts several buckets in one frame, in offset order (``_groups``): every cut
split in ~15 frames of a dozen records filled the supervisor with per-frame work and held
records behind it (issue 24: ~10 µs work ran at 0.54 of ideal against Pool(15)'s 0.62, p99
28 ms at half capacity). While a partition has a backlog and no worker is short of work, its
records are gathered until the cut holds a full batch for each bucket seen in it, for at most
10 × ``batch_max_wait_ms`` (``_gather``).
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from runtime.config import WorkerSettings
from runtime.errors import UnreadableRecord
from runtime.kafka.consumer import Fetched
from runtime.supervisor.datapath.deadletter_desk import supervisor_letter
from runtime.supervisor.datapath.isolation import fitted_letter_batch
from runtime.supervisor.partition.partition import Partition, Partitions, PauseReason
from runtime.supervisor.scheduling.batches import Batch, Bucket
from runtime.supervisor.seams.consumer import Consumer
from runtime.tp import TP, tp_label
from runtime.transport.packing import Run, fields_of, keys_of, offset_of, pack_run, salvage, split_by_key

log = logging.getLogger("ringmaster.intake")

_FRAMES_PER_RING = 16  # frames are sized to hold about 1/16 of a ring (see _size())
_HOT_LANE_SHARE = 0.8  # key ordering: a lane taking this share of a big cut...
_HOT_KEY_SHARE = 0.5  # ... because one key has this share of it, is reported
_HOT_MIN_RECORDS = 200
_BUCKET_SHARE = 0.25  # key ordering: a bucket's own frame holds at least this share of a batch
_COST_WEIGHT = 0.3  # moving averages of bytes and µs per record: recent batches count most
_LAG_S = 0.05  # how often lag() is asked for (the scheduler's lane weights)
# A partition with a backlog of this many batches (fetched and not cut, or not fetched yet)
# is cut in batches of up to _BACKLOG_STRETCH × batch_target_ms: see _size().
_BACKLOG_BATCHES = 24
_BACKLOG_STRETCH = 4
# The loop's wait for a hungry worker's records (loop.py): 1 ms after a fetch that brought
# records, doubled after each that brought none, up to the idle wait. A loop turning every
# millisecond for a hungry worker no record reached took the supervisor from 3.4-3.7 to
# 4.0-4.6 µs of CPU a record on 2 cores (issue 24).
_HUNGRY_WAIT_S, _HUNGRY_MAX_S = 0.001, 0.02
_GATHER_RING_SHARE = 4  # key ordering: records gathered for one cut hold at most 1/4 of a ring (_gather)
_GATHER_WAITS = 10  # ... and its first record waits at most this many batch_max_wait_ms (cut())


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
    error_type = "UnreadableRecord"


SetAside = TooLarge | Unreadable  # records the supervisor dead-letters itself

class BatchIds:
    """One counter for every batch of the run, so an id never means two batches."""

    def __init__(self) -> None:
        self._next = 1

    def __call__(self) -> int:
        bid = self._next
        self._next += 1
        return bid


class Intake:
    def __init__(self, w: WorkerSettings, share: bool, consumer: Consumer, partitions: Partitions,
                 buckets: int, ring_capacity: int, max_frame: int, next_id: BatchIds,
                 clock: Callable[[], float], letters_in_lane: int | None = None) -> None:
        """``share``: a share group's (kafka.group_type): frames carry delivery counts.
        ``letters_in_lane``: under exactly-once with a dead-letter topic, the largest letter
        it takes; set-aside records are then LETTERS batches in their lane (``_in_lane``),
        not handed to the supervisor's desk (None: they are, ``take_too_large``)."""
        self.w = w
        self.consumer = consumer
        self.partitions = partitions
        self.buckets = buckets  # key ordering: lanes per partition (fixed for the run)
        self.ring_capacity = ring_capacity
        self.max_frame = max_frame
        self.next_id = next_id
        self.clock = clock
        self.ordering = self.w.ordering
        self.share = share
        self.letters_in_lane = letters_in_lane
        self.bytes_per_record = 0.0  # over all packed frames (fetch sizing)
        self.consumed = 0
        self.last_records_at = clock()
        self.first_record_at: float | None = None
        self.too_large: list[SetAside] = []  # handed over by take_too_large() every tick
        self.drained = True  # the last consume() took everything the client had queued
        self.hungry_wait_s = _HUNGRY_WAIT_S
        self._lag_at = float("-inf")

    # ------------------------------------------------------------------ fetch
    def fetch(self, max_records: int, wait_s: float) -> Fetched:
        fetched = self.consumer.consume(max_records, wait_s)
        self.drained = fetched.count < max_records
        self.hungry_wait_s = _HUNGRY_WAIT_S if fetched.count else min(2 * self.hungry_wait_s, _HUNGRY_MAX_S)
        return fetched

    def take(self, fetched: Fetched) -> None:
        """Apply what consume() returned (after the rebalance straddle was settled)."""
        now = self.clock()
        if fetched.count:
            self.last_records_at = now
            if self.first_record_at is None:
                self.first_record_at = now
            self.consumed += fetched.count
        for tp, run in fetched.runs.items():
            p = self.partitions.get(tp)
            if p is None:  # revoked meanwhile, or over capacity: not ours to process or commit
                self.consumer.release(tp, run)
                continue
            s = p.intake
            if p.fence.rewinding or PauseReason.SEEKING in p.pause.holds:
                # Fenced and about to be read again from its restart offset (these were
                # fetched before that seek), or its start offset is not known yet: drop, and
                # remember where the dropped records began, so that the seek goes back there.
                first = offset_of(run[0])
                if p.fence.rewinding and (s.dropped_from is None or first < s.dropped_from):
                    s.dropped_from = first
                self.consumer.release(tp, run)
                continue
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
        for tp, offset in fetched.eof.items():
            p = self.partitions.get(tp)
            # RACE: one consume() can return a partition's last records and its EOF event
            # together (records applied above); an EOF counts only if nothing newer came after it.
            if p is None or p.fence.rewinding:
                continue
            s = p.intake
            if s.next_offset is None or offset >= s.next_offset:
                s.eof_at = offset
                s.last_activity = now
                if s.first_offset is None:
                    s.first_offset = offset
                self._skip_invisible_tail(p, now)

    # ------------------------------------------------------------------ cutting
    def take_too_large(self) -> list[SetAside]:
        """The records cut since the last call that fit in no ring (this room forgets them)."""
        taken, self.too_large = self.too_large, []
        return taken

    def cut(self, worker_has_room: bool, worker_hungry: Callable[[], bool] = lambda: True) -> list[Batch]:
        """Turn fetched records into batches: when a batch is full, old enough, or a worker
        has room and nothing waits for it. Records that fit in no ring go to ``too_large``.
        ``worker_hungry``: whether some worker has next to nothing to do (then no gathering,
        ``_gather``); asked at most once, and only when a partition would gather."""
        now = self.clock()
        max_wait = self.w.batch_max_wait_ms / 1000
        out: list[Batch] = []
        hungry: bool | None = None
        for p in self.partitions.values():
            s = p.intake
            if not s.open_msgs or p.held:
                continue
            gather = self._gather(p)
            if gather and hungry is None:
                hungry = worker_hungry()
            if gather and not hungry:
                # No worker is short of work and the partition has a backlog: its records wait
                # in line whatever the cut. Bounded in time all the same: a stale lag() can
                # promise records the log does not hold.
                if len(s.open_msgs) >= gather or now - s.open_since >= _GATHER_WAITS * max_wait:
                    out += self._cut(p, now)
                continue
            if (len(s.open_msgs) >= self._step(p) or now - s.open_since >= max_wait
                    or (worker_has_room and self.drained)):
                out += self._cut(p, now)
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

    def _cut(self, p: Partition, now: float) -> list[Batch]:
        s = p.intake
        step = self._step(p)
        msgs, s.open_msgs = s.open_msgs, []
        parts: list[Batch | SetAside] = []
        for buckets, run in self._bucket_runs(p, msgs):
            for i in range(0, len(run), step):
                self._pack(p, buckets, run, i, min(i + step, len(run)), parts)
        self._register(p, msgs, parts, now)
        self._skip_invisible_tail(p, now)
        s.batch_records = self._size(p)
        if self.letters_in_lane is not None:
            parts = [x if isinstance(x, Batch) else self._in_lane(x, self.letters_in_lane) for x in parts]
        self.too_large += [x for x in parts if not isinstance(x, Batch)]
        return [x for x in parts if isinstance(x, Batch)]

    def _in_lane(self, x: SetAside, max_bytes: int) -> Batch:
        """Exactly-once: the set-aside record's letter as a LETTERS batch in the record's place
        in its lane, which a worker writes and commits with the offset past the record in one
        transaction (isolation.letter_batch). Written by the supervisor's desk, outside any
        transaction, the letter was not ordered against the lane: the next batch's transaction
        could commit past the record before the broker had the letter, and a supervisor
        SIGKILLed then lost it (docs/exactly-once.md). The letter must fit a frame: one of a
        record too large for every ring is truncated to fit (``ringmaster.value.truncated``
        says how large the value was), or at worst only says where the record is."""
        tp, offset, fence = x.tp, x.row[0], self.partitions[x.tp].fence
        letter_at = functools.partial(supervisor_letter, tp, x.row, x.error_type, x.message)
        batch = fitted_letter_batch(x.batch_id, tp, fence.slot, fence.epoch, offset, letter_at,
                                    max_bytes, self.max_frame)
        log.error("record set aside; its dead letter commits with its offset in a worker's transaction",
                  extra={"tp": tp_label(tp), "offset": offset, "error": f"{x.error_type}: {x.message}"})
        return batch

    def _size(self, p: Partition, backlog: bool = False) -> int:
        """Records per batch for this partition from now on (module docstring). Small frames
        against the ring keep backpressure fine-grained: with half-ring frames, 10 KiB records
        made 2 MiB frames and an 8 MiB ring refused the next one at 75 % full.

        ``backlog``: the partition has many batches of work waiting (``_backlog``), and its
        records wait in line whatever the cut: then a batch holds up to _BACKLOG_STRETCH ×
        batch_target_ms of work. Every batch ends with a wait for the broker to acknowledge
        its outputs (~0.5-1 ms against a local broker, while the worker's core idles), so
        10 ms batches lost about a tenth of each worker to it on 2 cores (issue 24)."""
        s = p.intake
        target_bytes = min(self.max_frame // 2, self.ring_capacity // _FRAMES_PER_RING)
        size = min(self.w.batch_max_records, int(target_bytes / max(s.bytes_per_record, 1.0)))
        if self.w.batch_target_ms and s.us_per_record > 0:
            stretch = _BACKLOG_STRETCH if backlog else 1
            size = min(size, int(stretch * self.w.batch_target_ms * 1000 / s.us_per_record))
        return max(1, size)

    def _step(self, p: Partition) -> int:
        """Records per batch to cut now: ``batch_records``, or more under a backlog (``_size``)."""
        return self._size(p, backlog=True) if self._backlog(p) else p.intake.batch_records

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
            p.tracker.register_span(offset_of(msgs[0]), offset_of(msgs[-1]), spans, len(msgs), now)
        else:
            for bid, first, last in spans:  # one lane, in offset order: a span per batch
                p.tracker.register(bid, first, last, now)

    def _pack(self, p: Partition, buckets: tuple[int, ...] | None, msgs: Run, start: int, stop: int,
              out: list[Batch | SetAside]) -> None:
        """Pack msgs[start:stop] into one frame (split in two while it does not fit)."""
        batch_id = self.next_id()
        count = stop - start
        counts = [m.delivery_count() or 1 for m in msgs[start:stop]] if self.share else None
        try:
            frame = pack_run(batch_id, p.fence.slot, p.fence.epoch, p.tp[0], p.tp[1], msgs, start, stop,
                             counts)
        except UnreadableRecord as bad:
            # Set aside for the supervisor to dead-letter; the records around it are packed
            # again by the fast path (never one by one: a bad record costs one more pack).
            i = bad.index
            if not start <= i < stop:
                raise  # a packer bug, not the record's fault: never guess which record it was
            if start < i:
                self._pack(p, buckets, msgs, start, i, out)
            row, why = salvage(msgs[i], bad)
            out.append(Unreadable(p.tp, batch_id, row, why))
            if i + 1 < stop:
                self._pack(p, buckets, msgs, i + 1, stop, out)
            return
        size = len(frame) / count
        p.intake.bytes_per_record = _moving_average(p.intake.bytes_per_record, size)
        self.bytes_per_record = _moving_average(self.bytes_per_record, size)
        if len(frame) > self.max_frame:
            if count > 1:
                mid = start + count // 2
                self._pack(p, buckets, msgs, start, mid, out)
                self._pack(p, buckets, msgs, mid, stop, out)
                return
            out.append(TooLarge(p.tp, batch_id, fields_of(msgs[start]), len(frame), self.max_frame))
            return
        first, last = offset_of(msgs[start]), offset_of(msgs[stop - 1])
        bucket: Bucket = None if buckets is None else buckets[0]
        # A share group's record handed out before was not finished by a member (one that
        # died running it, mostly): those deliveries count as crashes toward
        # dead_letter.max_crashes, so a record that kills whole daemons is isolated here.
        crashes = max(counts) - 1 if counts else 0
        out.append(Batch(batch_id, p.tp, p.fence.slot, p.fence.epoch, first, last, count, frame, bucket,
                         crashes, buckets=buckets if buckets is not None and len(buckets) > 1 else None))

    def _watch_skew(self, p: Partition, msgs: Run, by_bucket: dict[int, Run]) -> None:
        """Key ordering spreads a partition over workers only as far as its keys allow: a hot
        key serialises the partition on one worker at a time. Say so (status), don't hide it."""
        s = p.intake
        for bucket, run in by_bucket.items():
            s.lane_records[bucket] = s.lane_records.get(bucket, 0) + len(run)
        if len(msgs) < _HOT_MIN_RECORDS:
            return
        bucket, run = max(by_bucket.items(), key=lambda kv: len(kv[1]))
        s.hot_key = None
        if len(run) >= _HOT_LANE_SHARE * len(msgs):
            key, n = Counter(keys_of(run)).most_common(1)[0]
            if n >= _HOT_KEY_SHARE * len(msgs):
                shown = "null" if key is None else repr(key[:40])
                s.hot_key = f"key {shown} is {n / len(msgs):.0%} of recent records (lane {bucket})"

    def _skip_invisible_tail(self, p: Partition, now: float) -> None:
        """The consumer reported the partition's end past the last record it handed over: the
        offsets between hold no record it can see (a transaction's commit marker; under
        read_committed, aborted records too), so they are done once the records before them
        are (offsets.py ``skip_to``). INVARIANT (1): only when every record fetched since the
        partition was last (re)positioned is registered – none waits uncut, none was dropped
        (a rewind or a seek resets ``next_offset``, and records dropped while SEEKING leave it
        behind) – so no record we were handed lies in the gap."""
        s = p.intake
        if (s.eof_at is None or s.open_msgs or p.fence.rewinding
                or PauseReason.SEEKING in p.pause.holds):
            return
        if s.next_offset is None:
            # Positioned (not SEEKING: the seek discarded what was fetched before it) and no
            # record handed over since: the end is where reading began, or nothing before
            # it is visible. Only for a tracker that never registered a record.
            p.tracker.start_at_end(s.eof_at)
            return
        p.tracker.skip_to(s.next_offset, s.eof_at, now)

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
            p.intake.behind = behind.get(tp, 0)
        return behind

    # ------------------------------------------------------------------ called by other rooms
    def learn_cost(self, p: Partition, busy_ms: float, records: int) -> None:
        """Results: how long the plugin took per record of this partition (batch sizing)."""
        if records > 0 and busy_ms >= 0:
            p.intake.us_per_record = _moving_average(p.intake.us_per_record, busy_ms * 1000 / records)
            p.intake.batch_records = self._size(p)

    def drop(self, p: Partition) -> None:
        """Forget fetched records not cut yet (a fence made them stale), remembering where
        they began: a rewind must go back at least that far."""
        s = p.intake
        if s.open_msgs:
            first = offset_of(s.open_msgs[0])
            s.dropped_from = first if s.dropped_from is None else min(first, s.dropped_from)
            self.consumer.release(p.tp, s.open_msgs)
        s.open_msgs = []

    def rewound(self, p: Partition) -> None:
        """The partition is read again from a new position: what was seen is forgotten."""
        p.intake.next_offset = p.intake.eof_at = p.intake.dropped_from = None

    def buffered_bytes(self, p: Partition) -> float:
        """Records fetched and not cut yet, in frame bytes (estimated)."""
        s = p.intake
        return len(s.open_msgs) * (s.bytes_per_record or self.bytes_per_record)


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


def _moving_average(average: float, sample: float) -> float:
    """0 means nothing learnt yet."""
    return (1 - _COST_WEIGHT) * average + _COST_WEIGHT * sample if average else sample
