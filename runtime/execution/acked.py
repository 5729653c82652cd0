"""The outputs the broker already acknowledged for a batch's records, so that running the
records again (a retry, bisection, a deferred batch run again on the same worker) does not
write them again.

A plugin call yields outputs for its records as a whole: an output cannot be tied to the
record that made it. What can be said is that it came from *some* record of the call, a
contiguous range ``lo..hi`` of the batch's records (their positions in it: bisection splits
the list into contiguous parts). So each acknowledged output is kept, as a
128-bit digest of what identifies it (``digest``), under the range of the call that wrote it
(a ``_Span``), and every output instance sits in exactly one span. For a new call over the
records ``lo..hi``, an output it yields is not written again when an identical one is known:

* in a span inside ``lo..hi`` (written by these records, in an earlier attempt of this call
  or of a part of it): matched once per attempt, as a multiset, so a plugin that yields two
  identical outputs gets both, and a third attempt matches them again;
* else in the smallest span around ``lo..hi`` (written by an earlier call over more records,
  before bisection split it): *claimed*, i.e. moved from that span to a span ``lo..hi`` of its
  own, so the other parts of the bisected range cannot match the same instance again.

INVARIANT: for each content, the copies written never fall below what the final attempts
yield (nothing is lost): a suppressed output is matched to one acknowledged instance that
came from records of this call (inside), or one no other part of its range will take
(claimed). Spans that overlap ``lo..hi`` only in part are not used: their outputs may come
from records outside the call. The rule judges content only: a plugin whose outputs differ
between attempts (a timestamp, a random id) gets them written again (at-least-once).

Cost: nothing is hashed until a call finds spans it may use: the first attempt of a batch,
with no failure, keeps only a reference to each call's outputs (which the caller holds
anyway). ``keep()`` turns them into digests (16 bytes each) so that a deferred batch's
knowledge outlives its outputs.
"""

from __future__ import annotations

import hashlib
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any, NoReturn

from runtime.errors import DeliveryFailed, OutputRejected
from runtime.plugin import Output

_LEN = struct.Struct(">q")


def digest(out: Output) -> bytes:
    """128 bits identifying an output by all its fields (topic, key, value, headers, in
    order): equal outputs, equal digests; the fields are length-prefixed (None apart from
    empty) so that no two different outputs are fed the same bytes."""
    h = hashlib.blake2b(digest_size=16)
    update = h.update

    def field(b: bytes | None) -> None:
        if b is None:
            update(b"\xff\xff\xff\xff\xff\xff\xff\xff")  # -1: None
        else:
            update(_LEN.pack(len(b)))
            update(b)

    field(None if out.topic is None else out.topic.encode("utf-8", "surrogatepass"))
    field(out.key)
    field(out.value)
    headers = out.headers
    if headers is None:
        update(b"N")
    else:
        update(b"H" + _LEN.pack(len(headers)))
        for name, value in headers:
            field(name.encode("utf-8", "surrogatepass"))
            field(value)
    return h.digest()


class _Span:
    __slots__ = ("_counts", "_outputs", "hi", "lo")

    def __init__(self, lo: int, hi: int, outputs: list[Output] | None = None,
                 counts: Counter[bytes] | None = None) -> None:
        self.lo, self.hi = lo, hi
        self._outputs = outputs  # not hashed yet (the common case: never needed)
        self._counts = counts

    def counts(self) -> Counter[bytes]:
        if self._counts is None:
            self._counts = Counter(map(digest, self._outputs or ()))
            self._outputs = None
        return self._counts

    def size(self) -> int:
        if self._counts is None:
            return len(self._outputs or ())
        return self._counts.total()


class Acknowledged:
    """The acknowledged outputs of one batch's records (one partition), kept by one worker for
    the time it handles them. See the module docstring for the rule."""

    def __init__(self) -> None:
        self._spans: list[_Span] = []

    def sieve(self, lo: int, hi: int, outputs: list[Output]) -> list[Output]:
        """The outputs of a call over offsets ``lo..hi`` that must still be written: those
        with no identical output acknowledged for these records before."""
        if not self._spans:
            return outputs  # the hot path: nothing written before for these records
        inside: Counter[bytes] = Counter()
        around: list[_Span] = []
        for s in self._spans:
            if lo <= s.lo and s.hi <= hi:
                inside.update(s.counts())
            elif s.lo <= lo and hi <= s.hi:
                around.append(s)
        if not inside and not around:
            return outputs
        around.sort(key=lambda s: s.hi - s.lo)  # the smallest range first: the closest knowledge
        claimed: Counter[bytes] = Counter()
        keep: list[Output] = []
        for out in outputs:
            d = digest(out)
            if inside[d] > 0:
                inside[d] -= 1
                continue
            for s in around:
                counts = s.counts()
                if counts[d] > 0:
                    counts[d] -= 1
                    claimed[d] += 1
                    break
            else:
                keep.append(out)
        if claimed:
            self._spans.append(_Span(lo, hi, counts=claimed))
        return keep

    def record(self, lo: int, hi: int, outputs: list[Output]) -> None:
        """``outputs`` of a call over ``lo..hi`` were acknowledged by the broker."""
        if outputs:  # not copied: the caller does not change the list after delivering it
            self._spans.append(_Span(lo, hi, outputs=outputs))

    def deliver(self, lo: int, hi: int, outputs: list[Output],
                deliver: Callable[[list[Output]], None]) -> None:
        """Deliver the outputs of a call over ``lo..hi`` not acknowledged before, and remember
        what the broker acknowledged, also when ``deliver`` raises: an exception carrying
        ``acknowledged`` (indices into the list it was given; see runtime/errors.py) tells
        which; without it nothing is assumed written."""
        fresh = self.sieve(lo, hi, outputs)
        if not fresh:
            return
        try:
            deliver(fresh)
        except BaseException as exc:
            acked = getattr(exc, "acknowledged", None)
            if acked:
                self.record(lo, hi, [fresh[i] for i in sorted(acked)])
            raise
        self.record(lo, hi, fresh)

    def size(self) -> int:
        """How many acknowledged outputs are known."""
        return sum(s.size() for s in self._spans)

    def keep(self) -> None:
        """Hash what is not hashed yet and drop empty spans, so that what is kept holds no
        output's bytes (16 bytes and a counter slot per output)."""
        for s in self._spans:
            s._counts = +s.counts()  # unary plus: without the slots claimed down to zero
        self._spans = [s for s in self._spans if s.counts()]


# -- what a failed delivery wrote (the local worker and the redrive deliver alike) ---------------

def acknowledged(outputs: list[Output], undelivered: list[Any] | None,
                 default_topic: str | None) -> frozenset[int] | None:
    """Which of ``outputs`` (all queued, in order, since the producer's last delivery) the
    broker acknowledged, given the producer's ``undelivered`` messages (OutputProducer): all
    but those, matched by topic, key and value (a failed message does not bring its headers
    back), so every output that shares them with an undelivered one counts as not written.
    None when unknown (messages still in flight, or one that matches no output): nothing is
    then assumed written, which is at worst a duplicate, never a loss. An output without a
    topic (none of its own, no ``default_topic``) was discarded: nothing to write."""
    if undelivered is None:
        return None
    if not undelivered:
        return frozenset(range(len(outputs)))
    failed = {(m.topic(), m.key(), m.value()) for m in undelivered}
    acked, matched = set(), set()
    for i, out in enumerate(outputs):
        sent = (out.topic or default_topic, out.key, out.value)
        if sent[0] is not None and sent in failed:
            matched.add(sent)
        else:
            acked.add(i)
    return frozenset(acked) if matched == failed else None


def raise_settled(queued: list[Output], exc: OutputRejected | DeliveryFailed, flush: Callable[[], None],
                  undelivered: Callable[[], list[Any] | None], default_topic: str | None) -> NoReturn:
    """``exc`` stopped producing before the output after ``queued`` was queued (refused for
    what it is, or the local queue stayed full): wait for the broker on those queued, so
    that the exception raised says which of them were written (``acknowledged``). An outage
    wins over a refusal, as in OutputProducer.deliver."""
    try:
        flush()
    except (OutputRejected, DeliveryFailed) as later:
        later.acknowledged = acknowledged(queued, undelivered(), default_topic)
        if isinstance(later, DeliveryFailed) or isinstance(exc, OutputRejected):
            raise later from None
        exc.acknowledged = later.acknowledged
        raise exc from None
    exc.acknowledged = frozenset(range(len(queued)))
    raise exc
