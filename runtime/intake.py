"""The intake room: fetch, cut batches, dispatch them into rings. Runs in: supervisor.

    consume() ─▶ runs per partition ─▶ open records ─cut─▶ batch frames per lane ─▶ rings
                                                    (register spans in the offset tracker)

Owns, in each PartitionFlow, the fetched records and the frames waiting for ring room
(``open_msgs``, ``lanes``, ``next_offset``, ``eof_at``...), and the in-flight table's
``add``. Never blocks: a frame that finds no room waits in its lane (invariant 3).
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from runtime.config import Settings
from runtime.flow import ANY_WORKER, SEEKING, TP, Batch, InFlight, PartitionFlow
from runtime.kafka import Fetched, GroupConsumer, Run, fields_of, keys_of, offset_of, pack_run, split_by_key
from runtime.pool import WorkerHandle

log = logging.getLogger("ringmaster.intake")

_MAX_RECORDS_PER_TICK = 20_000  # one consume() call, at most
_MIN_RECORDS_PER_TICK = 100  # ... and at least, even with full rings (amortises a tick)
_FRAMES_PER_RING = 16  # frames are sized to hold about 1/16 of a ring (see _cut())
_HOT_LANE_SHARE = 0.8  # key ordering: a lane taking this share of a big cut...
_HOT_KEY_SHARE = 0.5  # ... because one key has this share of it, is reported
_HOT_MIN_RECORDS = 200


@dataclass(frozen=True, slots=True)
class TooLarge:
    """A record that fits in no ring: dead-lettered by the supervisor (registered as its own
    one-record batch, so nothing is committed past it until that is acknowledged)."""

    tp: TP
    batch_id: int
    row: tuple[int, bytes | None, bytes | None, object]
    frame_bytes: int
    max_frame: int


class BatchIds:
    """One counter for every batch of the run, so an id never means two batches."""

    def __init__(self) -> None:
        self._next = 1

    def __call__(self) -> int:
        bid = self._next
        self._next += 1
        return bid


class Intake:
    def __init__(self, settings: Settings, consumer: GroupConsumer, handles: list[WorkerHandle],
                 flows: dict[TP, PartitionFlow], in_flight: InFlight, accepting: Callable[[int], bool],
                 next_id: BatchIds, clock: Callable[[], float]) -> None:
        self.w = settings.workers
        self.consumer = consumer
        self.handles = handles
        self.flows = flows
        self.in_flight = in_flight
        self.accepting = accepting
        self.next_id = next_id
        self.clock = clock
        self.ordering = self.w.ordering
        self.bytes_per_record = 0.0  # moving average over all packed frames (fetch sizing)
        self.consumed = 0
        self.last_records_at = clock()
        self.first_record_at: float | None = None
        self.too_large: list[TooLarge] = []  # taken by the supervisor every tick

    # ------------------------------------------------------------------ fetch
    def fetch(self, wait_s: float) -> Fetched:
        return self.consumer.consume(self.records_wanted(), wait_s)

    def take(self, fetched: Fetched) -> None:
        """Apply what consume() returned (after the rebalance straddle was settled)."""
        now = self.clock()
        if fetched.count:
            self.last_records_at = now
            if self.first_record_at is None:
                self.first_record_at = now
            self.consumed += fetched.count
        for tp, run in fetched.runs.items():
            flow = self.flows.get(tp)
            if flow is None:
                continue  # revoked meanwhile: not ours to process or commit
            if flow.rewinding or SEEKING in flow.holds:
                # Fenced and about to be read again from its restart offset (these were
                # fetched before that seek), or its start offset is not known yet: drop, and
                # remember where the dropped records began, so that the seek goes back there.
                first = offset_of(run[0])
                if flow.rewinding and (flow.rewind_from is None or first < flow.rewind_from):
                    flow.rewind_from = first
                continue
            if flow.open_msgs:
                flow.open_msgs.extend(run)
            else:
                flow.open_msgs = run
                flow.open_since = now
            if flow.first_offset is None:
                flow.first_offset = offset_of(run[0])
            flow.consumed += len(run)
            flow.next_offset = offset_of(run[-1]) + 1
            flow.eof_at = None
            flow.last_activity = now
        for tp, offset in fetched.eof.items():
            flow = self.flows.get(tp)
            # RACE: one consume() can return a partition's last records and its EOF event
            # together (records applied above); an EOF counts only if nothing newer came after it.
            if flow is None or flow.rewinding:
                continue
            if flow.next_offset is None or offset >= flow.next_offset:
                flow.eof_at = offset
                flow.last_activity = now
                if flow.first_offset is None:
                    flow.first_offset = offset

    def records_wanted(self) -> int:
        """How many records one consume() may return: up to a batch per assigned partition
        (fewer ticks per record), but not much more than the rings have room for. What does
        not fit waits as pending frames, which count towards the pause rule, and a pause
        makes librdkafka drop what it had prefetched for the partition and fetch it again.
        With 10 KiB records a tick of 4,000 records was 20 MB against 8 MiB rings."""
        want = min(_MAX_RECORDS_PER_TICK, self.w.batch_max_records * max(1, len(self.flows)))
        if self.bytes_per_record:
            room = sum(max(0.0, self.w.pause_above - fill) * h.ring.capacity
                       for h, fill in zip(self.handles, self.backlog_fills(), strict=True))
            want = min(want, max(_MIN_RECORDS_PER_TICK, int(room / self.bytes_per_record)))
        return want

    # ------------------------------------------------------------------ backlog
    def backlog_fills(self) -> list[float]:
        """Per worker: (bytes in its ring + bytes of frames waiting for it) / ring capacity;
        1.0 for a worker that takes no frames now (dead, restarting, retiring)."""
        pending = [0] * len(self.handles)
        for f in self.flows.values():
            for lane, size in f.pending_bytes_by_lane().items():
                if lane is not ANY_WORKER:
                    pending[lane] += size
        return [(h.ring.used_bytes() + pending[h.index]) / h.ring.capacity if self.accepting(h.index) else 1.0
                for h in self.handles]

    def shared_fill(self, fills: list[float]) -> float:
        """Unordered ordering: the fill of all rings together, counting the frames any worker
        may take."""
        shared = sum(f.pending_bytes_by_lane().get(ANY_WORKER, 0) for f in self.flows.values())
        capacity = sum(h.ring.capacity for h in self.handles)
        used = sum(fill * h.ring.capacity for fill, h in zip(fills, self.handles, strict=True))
        return (used + shared) / capacity

    # ------------------------------------------------------------------ batching
    def cut_batches(self) -> None:
        """Turn fetched records into frames: when a batch is full, old enough, or a worker
        it can go to has nothing to do (adaptive batching: small batches only when they
        cost nothing)."""
        now = self.clock()
        max_wait = self.w.batch_max_wait_ms / 1000
        for flow in self.flows.values():
            if not flow.open_msgs or flow.holds or flow.rewinding:
                continue
            if (len(flow.open_msgs) >= flow.batch_records or now - flow.open_since >= max_wait
                    or self._a_worker_is_idle(flow)):
                self._cut(flow)

    def _a_worker_is_idle(self, flow: PartitionFlow) -> bool:
        if self.ordering == "partition":
            return self.handles[flow.owner].ring.used_bytes() == 0 and not flow.pending()
        return not flow.pending() and any(h.ring.used_bytes() == 0 for h in self.handles)

    def _lane_runs(self, flow: PartitionFlow, msgs: Run) -> list[tuple[int | None, Run]]:
        if self.ordering == "partition":
            return [(flow.owner, msgs)]
        if self.ordering == "unordered":
            return [(ANY_WORKER, msgs)]
        by_lane = split_by_key(msgs, len(self.handles), null_lane=flow.owner)
        self._watch_skew(flow, msgs, by_lane)
        return sorted(by_lane.items())

    def _cut(self, flow: PartitionFlow) -> None:
        msgs, flow.open_msgs = flow.open_msgs, []
        ring = self.handles[0].ring
        max_frame, capacity = ring.max_frame, ring.capacity
        step = flow.batch_records
        parts: list[Batch | TooLarge] = []
        for lane, run in self._lane_runs(flow, msgs):
            for i in range(0, len(run), step):
                self._pack(flow, lane, run, i, min(i + step, len(run)), max_frame, parts)
        self._register(flow, msgs, parts)
        for part in parts:
            if isinstance(part, TooLarge):
                self.too_large.append(part)
            else:
                flow.lanes.setdefault(part.lane, deque()).append(part)
        # Adaptive batch size: as many records as fit in a sixteenth of the ring (never more
        # than half the largest frame) at the size records of this partition had lately,
        # learnt from packed frames: no per-record counting. Small frames against the ring
        # keep the pause rule fine-grained: with half-frame batches, 10 KiB records made
        # 2 MiB frames and an 8 MiB ring refused the next one at 75 % full.
        target = min(max_frame // 2, capacity // _FRAMES_PER_RING)
        flow.batch_records = max(1, min(self.w.batch_max_records,
                                        int(target / max(flow.bytes_per_record, 1.0))))

    def _register(self, flow: PartitionFlow, msgs: Run, parts: list[Batch | TooLarge]) -> None:
        """INVARIANT (1): every record cut is registered before its frame can complete."""
        spans = [(p.batch_id, p.first, p.last) if isinstance(p, Batch) else (p.batch_id, p.row[0], p.row[0])
                 for p in parts]
        if self.ordering == "key":
            # Lanes interleave: one span for the whole cut, done when every lane's part is.
            flow.tracker.register_span(offset_of(msgs[0]), offset_of(msgs[-1]), spans, len(msgs))
        else:
            for bid, first, last in spans:  # one lane, in offset order: a span per batch
                flow.tracker.register(bid, first, last)

    def _pack(self, flow: PartitionFlow, lane: int | None, msgs: Run, start: int, stop: int,
              max_frame: int, out: list[Batch | TooLarge]) -> None:
        """Pack msgs[start:stop] into one frame (split in two while it does not fit)."""
        batch_id = self.next_id()
        count = stop - start
        frame = pack_run(batch_id, flow.slot, flow.epoch, flow.tp[0], flow.tp[1], msgs, start, stop)
        size = len(frame) / count
        flow.bytes_per_record = _moving_average(flow.bytes_per_record, size)
        self.bytes_per_record = _moving_average(self.bytes_per_record, size)
        if len(frame) > max_frame:
            if count > 1:
                mid = start + count // 2
                self._pack(flow, lane, msgs, start, mid, max_frame, out)
                self._pack(flow, lane, msgs, mid, stop, max_frame, out)
                return
            out.append(TooLarge(flow.tp, batch_id, fields_of(msgs[start]), len(frame), max_frame))
            return
        first, last = offset_of(msgs[start]), offset_of(msgs[stop - 1])
        out.append(Batch(batch_id, flow.tp, flow.slot, flow.epoch, first, last, count, frame, lane))

    def _watch_skew(self, flow: PartitionFlow, msgs: Run, by_lane: dict[int, Run]) -> None:
        """Key ordering spreads a partition over workers only as far as its keys allow: a hot
        key serialises the partition on one worker. Say so (status), don't hide it."""
        for lane, run in by_lane.items():
            flow.lane_records[lane] = flow.lane_records.get(lane, 0) + len(run)
        if len(msgs) < _HOT_MIN_RECORDS:
            return
        lane, run = max(by_lane.items(), key=lambda kv: len(kv[1]))
        flow.hot_key = None
        if len(run) >= _HOT_LANE_SHARE * len(msgs):
            key, n = Counter(keys_of(run)).most_common(1)[0]
            if n >= _HOT_KEY_SHARE * len(msgs):
                shown = "null" if key is None else repr(key[:40])
                flow.hot_key = f"key {shown} is {n / len(msgs):.0%} of recent records (worker {lane})"

    # ------------------------------------------------------------------ dispatch
    def dispatch(self) -> None:
        """Move pending batches into rings while there is room; never block (invariant 3)."""
        rung: set[int] = set()
        for flow in self.flows.values():
            if flow.holds or flow.rewinding:
                continue
            for lane, q in flow.lanes.items():
                if not q:
                    continue
                if lane is ANY_WORKER:
                    self._dispatch_anywhere(q, rung)
                    continue
                h = self.handles[lane]
                while q and self.accepting(lane) and h.ring.try_write(q[0].frame):
                    self.in_flight.add(lane, q.popleft())
                    rung.add(lane)
        for i in rung:
            bell = self.handles[i].bell
            if bell is not None:
                bell.ring()

    def _dispatch_anywhere(self, q: deque[Batch], rung: set[int]) -> None:
        """Unordered: each batch to the accepting worker with the emptiest ring."""
        while q:
            order = sorted((h.ring.used_bytes(), h.index) for h in self.handles if self.accepting(h.index))
            for _, i in order:
                if self.handles[i].ring.try_write(q[0].frame):
                    self.in_flight.add(i, q.popleft())
                    rung.add(i)
                    break
            else:
                return

    def requeue(self, batches: list[Batch]) -> None:
        """Put batches back in front of their lanes, in the order given (redelivery after a
        worker died: the next incarnation, or any worker for unordered, sees them again)."""
        per_lane: dict[tuple[TP, int | None], list[Batch]] = {}
        for b in batches:
            per_lane.setdefault((b.tp, b.lane), []).append(b)
        for (tp, lane), items in per_lane.items():
            self.flows[tp].lanes.setdefault(lane, deque()).extendleft(reversed(items))


def _moving_average(average: float, sample: float) -> float:
    """Bytes per record as frames are packed: recent frames count most; 0 means none yet."""
    return 0.7 * average + 0.3 * sample if average else sample
