"""Where the whole group stands: the end of every partition of its topics, and the group's
committed offsets, asked for off the loop (``--until-caught-up``).

A batch run is caught up when the group is, not only this member: a partition held by
another member – one still working, or a member killed a moment ago whose session has not
timed out yet (under KIP-848 it keeps its partitions until then, and the others get theirs
at once) – is work left, and a run that exited 0 beside it would report a topic done that
is not. So once its own partitions are done, a member asks where every partition of its
topics is committed, and stops only when each is at or past its end.

Each partition's end is taken once, the first time it is seen (so a topic written to all
the time still ends): ListOffsets under the consumer's isolation level (under
``read_committed``, the last stable offset: records of an open transaction are not work
yet), then a reader from there to where the partition ends (runtime/kafka/read_ends.py),
because Tansu answers ListOffsets "latest" short of the end (runtime/kafka/watermarks.py)
and a partition judged by that answer counted as caught up with most of it uncommitted.
The ends are asked of an admin client whose answers arrive on librdkafka's threads; the
committed offsets of a consumer that never joins the group (runtime/kafka/group_committed.py:
an admin client's ListConsumerGroupOffsets crashes the process when the coordinator moves,
librdkafka#5040), and the reads, on threads of their own. ``refresh`` never blocks the loop,
one request of a kind in flight, each abandoned after ``timeout_s`` (both steps of the ends
are bounded within it). Under a topic pattern (``^...``) the topics are those the pattern
matches in the cluster's metadata, and those this member was assigned.

An input written by a transactional producer ends with a commit marker that no record's
offset commits, and under ``read_committed`` an aborted transaction's records are never
handed over: a partition held by another member can end committed short of its end with
nothing left to do. So a small gap between a partition's committed offset and its end,
on a partition this member does not hold, is asked about (runtime/kafka/empty_gaps.py: a
reader at the committed offset reaches the end without being handed a record), once per
committed offset; an empty one counts as at its end (``GroupStanding.at``).

Runs in: supervisor (``refresh``/``standing``: never block); the admin client's threads and
the readers' (read_ends.py, empty_gaps.py) answer.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from runtime.kafka.admin import admin_properties, serve_client_log
from runtime.kafka.client_log import with_logger
from runtime.kafka.empty_gaps import EmptyGaps, Gaps
from runtime.kafka.group_committed import Committed, GroupCommitted
from runtime.kafka.read_ends import ReadEnds
from runtime.tp import TP

log = logging.getLogger(__name__)

# The widest gap asked about: a few transactions' markers and aborted records. A wider one is
# a member's work in progress, not worth a reader's time.
GAP_MAX = 1000


@dataclass(frozen=True, slots=True)
class GroupStanding:
    """``ends``: every partition of the topics seen so far, with its end when first seen;
    ``committed``: the group's committed offsets, as of the last answer (a partition absent:
    nothing committed); ``complete``: every partition the metadata named has its end, and
    the committed offsets have been answered at least once (until then nothing is judged);
    ``empty``: partitions whose gap from this committed offset to the end holds nothing a
    reader of the consumer's isolation level is handed (markers, aborted records);
    ``mapped``: every partition of the topics has its end (committed offsets or not; under a
    topic pattern, once the committed offsets have answered: their read finds the topics)."""

    ends: Mapping[TP, int]
    committed: Mapping[TP, int]
    complete: bool
    empty: Mapping[TP, int] = field(default_factory=dict)
    mapped: bool = False

    def all_held(self, held: Collection[TP]) -> bool:
        """Every partition of the topics is in ``held``: no other member has any of the
        group's work, whatever its committed offsets say (an assignment is exclusive)."""
        return self.mapped and all(tp in held for tp in self.ends)

    def at(self, tp: TP) -> int | None:
        """Where the group is done with ``tp``: its end if the gap to it is empty, else its
        committed offset (None: nothing committed)."""
        at = self.committed.get(tp)
        end = self.ends.get(tp)
        return end if at is not None and end is not None and self.empty.get(tp) == at else at

    def left(self, held: set[TP], ends: Mapping[TP, int | None] | None = None) -> dict[TP, int | None]:
        """The partitions not in ``held`` short of their end (``at``): partition -> committed
        offset (None: nothing committed). ``ends``: the end to judge each partition by, when
        the caller knows better than the group's answer (None: ``self.ends``)."""
        judged = self.ends if ends is None else ends
        return {tp: self.committed.get(tp) for tp, end in judged.items()
                if tp not in held and (self.at(tp) or 0) < (end or 0)}


class GroupAdmin(Protocol):
    """What is asked of the admin client (confluent_kafka's AdminClient; a fake in tests)."""

    # Positional-only: AdminClient and the tests' fake name them differently.
    def describe_topics(self, topics: TopicCollection, /, *, request_timeout: float
                        ) -> Mapping[str, Future[Any]]: ...
    def list_offsets(self, requests: dict[TopicPartition, OffsetSpec], /, *, isolation_level: IsolationLevel,
                     request_timeout: float) -> Mapping[TopicPartition, Future[Any]]: ...


class CommittedReader(Protocol):
    """GroupCommitted.ask (a fake in tests): the group's committed offsets of the topics named
    and of those the patterns match, stable or not, as a Future."""

    def __call__(self, names: Collection[str], patterns: Sequence[re.Pattern[str]], stable: bool,
                 timeout_s: float | None = None) -> Future[Committed]: ...


class GroupOffsets:
    def __init__(self, props: Mapping[str, Any], topics: Sequence[str], interval_s: float = 1.0,
                 timeout_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
                 admin: Callable[[], GroupAdmin] | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 gaps: Callable[[Gaps], Future[dict[TP, bool]]] | None = None,
                 read_ends: Callable[[Mapping[TP, int]], Future[dict[TP, int]]] | None = None,
                 committed: CommittedReader | None = None) -> None:
        """``admin``, ``gaps``, ``read_ends``, ``committed``: the clients asked (tests give
        fakes); ``gaps``: whether each gap holds nothing a reader is handed (EmptyGaps.ask);
        ``read_ends``: where a reader starting at the ListOffsets answer reaches each
        partition's end (ReadEnds.ask); ``committed``: the group's committed offsets
        (GroupCommitted.ask)."""
        self.group = str(props.get("group.id", ""))
        self._names = {t for t in topics if not t.startswith("^")}
        self._patterns = [re.compile(t) for t in topics if t.startswith("^")]
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self._clock = clock
        self._sleep = sleep
        self._isolation = (IsolationLevel.READ_UNCOMMITTED
                           if str(props.get("isolation.level", "read_committed")) == "read_uncommitted"
                           else IsolationLevel.READ_COMMITTED)
        self._make = admin or (lambda: AdminClient(with_logger(admin_properties(props))))
        self._admin: GroupAdmin | None = None  # made at the first ask: most runs never need it
        # The client is replaced before the next ask once an ask of partition ends went
        # unanswered in part, or an ask of the topics timed out (``_take_ends``, ``_take_topics``,
        # ``_take``): see runtime/kafka/admin.py, STALE_LEADERS.
        self._stale = False
        self._made_at = float("-inf")
        self._ends_asked: list[TP] = []
        self._ends: dict[TP, int] = {}
        self._committed: dict[TP, int] = {}
        self._answers = 0
        self._pending: dict[str, tuple[float, Mapping[Any, Future[Any]]]] = {}  # kind -> (asked at, futures)
        self._asked_at: dict[str, float] = {}
        self._known: set[TP] = set()  # partitions the topics' metadata named
        self._gaps = gaps or EmptyGaps(props).ask
        # The ends take two steps, both within timeout_s (or the answer is abandoned).
        self._read_ends = read_ends or ReadEnds(props, timeout_s / 3).ask
        self._read_committed = committed or GroupCommitted(props, timeout_s).ask
        self._empty: dict[TP, int] = {}  # partition -> the committed offset its gap is empty from
        self._probed: dict[TP, int] = {}  # partition -> the committed offset last asked about
        self._probing: Gaps = {}

    def refresh(self, committed: bool, held: Collection[TP] = ()) -> None:
        """Take in finished answers; ask again for what is due: the topics' partitions and the
        ends of new ones always, the committed offsets when ``committed``, and whether the
        small gaps of partitions not ``held`` are empty. Returns at once."""
        self._take()
        try:
            if self._names:
                self._ask("topics", lambda a: a.describe_topics(TopicCollection(sorted(self._names)),
                                                                 request_timeout=self.timeout_s / 2))
            new = sorted(self._known - set(self._ends))
            if new and "ends" not in self._pending:
                self._ends_asked = new
                self._ask("ends", lambda a: _read_from(self._read_ends, a.list_offsets(
                    {TopicPartition(t, p): OffsetSpec.latest() for t, p in new},
                    isolation_level=self._isolation, request_timeout=self.timeout_s / 2)), at_once=True)
            if committed and self.group:
                self._ask("committed", lambda _: {"committed": self._read_committed(
                    sorted(self._names), self._patterns, False)})
                if (gaps := self._new_gaps(held)) and "gaps" not in self._pending:
                    self._probing = gaps
                    self._ask("gaps", lambda _: self._probe(gaps), at_once=True)
        except (KafkaException, ValueError, TypeError) as exc:
            log.debug("cannot ask where the group stands", extra={"error": str(exc)})

    def settle(self, wait_s: float, held: Collection[TP] = ()) -> GroupStanding:
        """Ask the group's committed offsets anew, *stable*, and wait up to ``wait_s`` for the
        answer (also once abandoned: the member's last word). Under exactly-once the workers'
        transactions write them: a transaction whose commit returned may not have its offsets
        written to the group yet (the markers follow the commit), and an ordinary read returns
        the offset from before it. A stable read is answered once none is pending; a partition
        answered with an error (UNSTABLE_OFFSET_COMMIT) is asked again until ``wait_s``. Gaps
        not asked about at these offsets are then asked about, within what is left of it."""
        deadline = self._clock() + wait_s
        while self.group:
            stable: Committed | None = None
            try:
                left = max(0.1, deadline - self._clock())
                asked = self._read_committed(sorted(self._names), self._patterns, True, left)
                stable = asked.result(left + 1)
            except Exception as exc:  # no answer in time, a busy coordinator: asked again
                log.debug("stable committed offsets unknown", extra={"error": str(exc)})
            if stable is not None and not any(self._wanted(t) for t, _ in stable.refused):
                self._take_parts(stable)
                break
            if self._clock() >= deadline:
                break
            self._sleep(0.1)
        if (gaps := self._new_gaps(held)) and (left := deadline - self._clock()) > 0:
            answer = self._probe(gaps)["gaps"]  # what refresh asked about is dropped (abandon)
            with contextlib.suppress(TimeoutError):
                answer.exception(left)
            self._record(gaps, answer)
        return self.standing()

    def standing(self) -> GroupStanding:
        # Under a pattern the topics are known only once the committed offsets' read has
        # answered (its topics are the cluster's that match): until then some may be missing.
        mapped = bool(self._known) and not self._known - set(self._ends) and (
            not self._patterns or self._answers > 0)
        return GroupStanding(dict(self._ends), dict(self._committed), mapped and self._answers > 0,
                             dict(self._empty), mapped)

    def note(self, tps: Sequence[TP]) -> None:
        """Partitions assigned to this member: under a pattern, their topics are the group's too."""
        self._names |= {t for t, _ in tps if self._wanted(t)}

    def _wanted(self, topic: str) -> bool:
        return topic in self._names or any(p.search(topic) for p in self._patterns)

    def abandon(self) -> None:
        """Stop asking (the member is stopping); answers in flight are not needed any more (a
        gap asked about is asked again by settle)."""
        if "gaps" in self._pending:
            self._record(self._probing, self._pending["gaps"][1]["gaps"])
        self._pending.clear()
        self._asked_at = {k: float("inf") for k in ("topics", "ends", "committed", "gaps")}

    # ------------------------------------------------------------------ requests
    def _new_gaps(self, held: Collection[TP]) -> dict[TP, tuple[int, int]]:
        """Gaps not asked about at this committed offset: partitions not held, committed short
        of their end by at most GAP_MAX."""
        return {tp: (at, end) for tp, end in self._ends.items()
                if tp not in held and (at := self._committed.get(tp)) is not None
                and 0 < end - at <= GAP_MAX and self._probed.get(tp) != at}

    def _probe(self, gaps: Gaps) -> Mapping[str, Future[dict[TP, bool]]]:
        """Ask about ``gaps``; each is asked about once per committed offset (until answered)."""
        self._probed.update({tp: at for tp, (at, _) in gaps.items()})
        return {"gaps": self._gaps(gaps)}

    def _ask(self, kind: str, send: Callable[[GroupAdmin], Mapping[Any, Future[Any]]],
             at_once: bool = False) -> None:
        now = self._clock()
        if kind in self._pending or (not at_once and now - self._asked_at.get(kind, float("-inf"))
                                     < self.interval_s):
            return
        self._asked_at[kind] = now
        # At most one new client an interval: ends are asked again at once while some are unknown.
        if self._admin is None or (self._stale and now - self._made_at >= self.interval_s):
            if self._stale:
                log.debug("replacing the admin client: partition ends or the topics went unanswered")
            self._admin, self._stale = None, False  # the old one is destroyed here, on the loop's thread
            self._admin, self._made_at = self._make(), now
        self._pending[kind] = (now, send(self._admin))
        serve_client_log(self._admin)

    def _take(self) -> None:
        now = self._clock()
        for kind, (asked_at, futures) in list(self._pending.items()):
            if all(f.done() for f in futures.values()):
                del self._pending[kind]
                getattr(self, f"_take_{kind}")(futures)
            elif now - asked_at > self.timeout_s:
                del self._pending[kind]  # asked again on a later turn
                if kind == "gaps":
                    self._record(self._probing, Future())
                elif kind in ("ends", "topics"):
                    self._stale = True
                log.debug("where the group stands: no answer in time", extra={"request": kind})

    def _take_topics(self, answers: Mapping[str, Future[Any]]) -> None:
        for topic, fut in answers.items():
            try:
                self._known |= {(topic, p.id) for p in fut.result(0).partitions}
            except Exception as exc:  # a topic not there (yet): the consumer says so already
                log.debug("topic partitions unknown", extra={"topic": topic, "error": str(exc)})
                # "Failed while waiting for controller": the node this client's metadata names
                # as the controller is gone, and it spins connecting to it (STALE_LEADERS).
                self._stale = self._stale or _timed_out(exc)

    def _take_ends(self, answers: Mapping[str, Future[dict[TP, int]]]) -> None:
        try:
            ends = answers["ends"].result(0)
        except Exception as exc:  # asked again: the partitions stay unknown
            log.debug("partition ends unknown", extra={"error": str(exc)})
            ends = {}
        for tp, end in ends.items():
            self._ends.setdefault(tp, end)
        self._stale = self._stale or any(tp not in self._ends for tp in self._ends_asked)

    def _take_committed(self, answers: Mapping[str, Future[Committed]]) -> None:
        try:
            answer = answers["committed"].result(0)
        except Exception as exc:  # a busy coordinator, no answer in time: asked again
            log.debug("committed offsets unknown", extra={"error": str(exc)})
            return
        self._take_parts(answer)

    def _take_gaps(self, answers: Mapping[str, Future[dict[TP, bool]]]) -> None:
        self._record(self._probing, answers["gaps"])

    def _record(self, asked: Gaps, answer: Future[dict[TP, bool]]) -> None:
        """Take in the answer about ``asked``; a gap left unanswered is asked about again."""
        try:
            found = answer.result(0) if answer.done() else {}
        except Exception as exc:  # no broker answer
            log.debug("cannot tell whether the gaps hold records", extra={"error": str(exc)})
            found = {}
        for tp, (at, _) in asked.items():
            if tp not in found:
                self._probed.pop(tp, None)  # unknown: asked again
            elif found[tp]:
                self._empty[tp] = at

    def _take_parts(self, answer: Committed) -> None:
        self._committed = {tp: offset for tp, offset in answer.offsets.items() if self._wanted(tp[0])}
        self._names |= {t for t in answer.topics if self._wanted(t)}
        self._answers += 1


def _read_from(read_ends: Callable[[Mapping[TP, int]], Future[dict[TP, int]]],
               listed: Mapping[TopicPartition, Future[Any]]) -> Mapping[str, Future[dict[TP, int]]]:
    """The ends: once every ListOffsets answer is in, a reader from each answered offset to
    where the partition ends (``read_ends``); one Future for both steps.

    INVARIANT: nothing the admin client's threads call holds the GroupOffsets, which owns the
    client: were its last reference to go in one of those callbacks, the client would be
    destroyed on its own thread, which librdkafka prohibits. So this is not a method."""
    ends: Future[dict[TP, int]] = Future()
    left = [len(listed)]
    lock = threading.Lock()

    def read(_: Future[Any]) -> None:  # on the admin client's threads, once per answer
        with lock:
            left[0] -= 1
            if left[0]:
                return
        starts: dict[TP, int] = {}
        for tp, fut in listed.items():
            try:
                offset = fut.result(0).offset
            except Exception as exc:  # a leader moving: asked again, the partition stays unknown
                log.debug("partition end unknown", extra={
                    "topic": tp.topic, "partition": tp.partition, "error": str(exc)})
                continue
            if offset is not None and offset >= 0:
                starts[(tp.topic, tp.partition)] = offset
        if not starts:
            ends.set_result({})
            return
        try:
            read_ends(starts).add_done_callback(lambda f: _pass_on(f, ends))
        except Exception as exc:  # a reader that cannot be made: the ends stay unknown
            ends.set_exception(exc)

    if not listed:
        ends.set_result({})
    for fut in listed.values():
        fut.add_done_callback(read)
    return {"ends": ends}


def _pass_on(source: Future[Any], target: Future[Any]) -> None:
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())


def _timed_out(exc: BaseException) -> bool:
    """An admin request that waited for a broker until its timeout (not a refusal)."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return isinstance(err, KafkaError) and err.code() == KafkaError._TIMED_OUT
