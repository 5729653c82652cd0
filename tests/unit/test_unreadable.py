"""A record the Kafka client cannot read (issue 17: a header name that is not UTF-8) is the
input's fault: both packers raise UnreadableRecord naming it, never crash; the supervisor
packs the rest of its batch and dead-letters what can still be read of it. The messages
are real: written byte for byte (tests/wire.py) to librdkafka's mock cluster and consumed
with confluent-kafka (tests/unit/mockwire.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import fakes
import pytest
from fakes import TP0, assign, make
from mockwire import consumed
from wire import RawRecord

from runtime.errors import UnreadableRecord
from runtime.kafka.consumer import Fetched
from runtime.kafka.messages import bind_packer
from runtime.supervisor.datapath.intake import Unreadable
from runtime.transport import packing, speedups
from runtime.transport.frames import BATCH, decode_frame
from runtime.transport.packing import _pack_run_py, salvage

bind_packer()  # the packer packs confluent-kafka's messages, as the daemon's consumer has it

HEAD = (BATCH, 1, 0, 1, "t", 0)
BAD = b"\xff\xfebad"
needs_c = pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")


def run_with_bad(at: int = 2, n: int = 5) -> list[Any]:
    return consumed([RawRecord(f"v{i}".encode(), f"k{i}".encode(),
                               [(b"good", b"1"), (BAD, b"2"), (b"", None)] if i == at else [(b"h", b"x")],
                               1000 + i) for i in range(n)])


@needs_c
def test_the_c_packer_names_the_unreadable_record_instead_of_crashing() -> None:
    """Before the fix: SIGSEGV (exit 139) dereferencing the NULL header name."""
    assert speedups.native is not None
    msgs = run_with_bad(at=2)
    with pytest.raises(UnreadableRecord) as info:
        speedups.native.pack_frame(HEAD, msgs, 1, 5)
    assert (info.value.index, info.value.field) == (2, "headers")
    assert isinstance(info.value.__cause__, UnicodeDecodeError) and info.value.__cause__.object == BAD
    # Called again, the client returns the list it cached, a NULL inside and no error set:
    # still refused, never dereferenced.
    with pytest.raises(UnreadableRecord) as again:
        speedups.native.pack_frame(HEAD, msgs, 0, 5)
    assert again.value.index == 2 and "missing item" in again.value.cause


def test_the_python_packer_names_it_without_calling_headers_twice() -> None:
    """Before the fix: SystemError out of Message.headers() ended the daemon (exit 1)."""
    msgs = run_with_bad(at=3)
    with pytest.raises(UnreadableRecord) as info:
        _pack_run_py(HEAD, msgs, 1, 5)
    assert (info.value.index, info.value.field) == (3, "headers")
    assert info.value.cause.startswith("UnicodeDecodeError"), "the client's error, as C reports it"


@pytest.mark.parametrize("in_c", [True, False])
def test_both_packers_pack_the_records_around_it_alike(in_c: bool) -> None:
    if in_c and speedups.native is None:
        pytest.skip("no C speedups")
    msgs = run_with_bad(at=2)
    pack = speedups.native.pack_frame if in_c else _pack_run_py  # type: ignore[union-attr]
    with pytest.raises(UnreadableRecord):
        pack(HEAD, msgs, 0, 5)
    before, after = pack(HEAD, msgs, 0, 2), pack(HEAD, msgs, 3, 5)
    assert before == _pack_run_py(HEAD, msgs, 0, 2) and after == _pack_run_py(HEAD, msgs, 3, 5)
    frame = decode_frame(after)
    assert frame is not None and frame.columns.values == [b"v3", b"v4"] and frame.columns.first == 3


def test_an_unreadable_record_leaves_the_c_packer_in_use() -> None:
    """It is the input's fault: the hot path must not fall back to Python for good (and
    Python must never run over the same messages: that would touch the NULL)."""
    path = speedups.HotPath("demo", lambda i: (_ for _ in ()).throw(UnreadableRecord(i, "headers", "x")),
                            lambda i: pytest.fail("the Python twin ran"), input_faults=(UnreadableRecord,))
    with pytest.raises(UnreadableRecord):
        path.call(3)
    assert path.in_c and path.why_python is None


def test_salvage_keeps_what_can_be_read() -> None:
    (m,) = consumed([RawRecord(b"value", b"key", [(b"trace", b"t1"), (BAD, b"2"), (b"", None)], 5)])
    with pytest.raises(UnreadableRecord) as info:
        _pack_run_py(HEAD, [m], 0, 1)
    row, why = salvage(m, info.value)
    assert row == (0, b"key", b"value", [("trace", b"t1"), ("", None)])
    assert "header 2 of 3" in why and repr(BAD) in why and "other 2 kept" in why


@needs_c
def test_salvage_after_the_client_cached_its_broken_list() -> None:
    """The second packer call sees the cached list (a NULL name, no error): C refuses it, and
    salvage still reads the intact headers without touching the NULL."""
    assert speedups.native is not None
    (m,) = consumed([RawRecord(b"value", None, [(BAD, b"2"), (b"trace", b"t1")], 5)])
    for _ in range(2):
        with pytest.raises(UnreadableRecord) as info:
            speedups.native.pack_frame(HEAD, [m], 0, 1)
    row, why = salvage(m, info.value)
    assert row == (0, None, b"value", [("trace", b"t1")]) and "header 1 of 2" in why


def test_the_supervisor_dead_letters_it_and_processes_the_rest_of_the_batch() -> None:
    submitted: list[tuple[Any, ...]] = []

    class Desk:
        max_bytes = 1_000_000

        def submit(self, tp: Any, batch_id: int, row: Any, error_type: str, message: str,
                   attempts: int = 1, plugin_version: str | None = None,
                   delivery_count: int | None = None) -> None:
            submitted.append((tp, batch_id, row, error_type, message))

        def pending(self, tp: Any = None) -> int:
            return 0

    sup, consumer, _clock, _pool = make(desk=Desk())  # type: ignore[arg-type]
    assign(sup, consumer, [TP0])
    flow = sup.partitions[TP0]
    msgs = run_with_bad(at=2, n=6)
    sup.intake.take(Fetched(runs={TP0: msgs}, count=6))
    cut = sup.intake.cut(fakes.room(), drained=True)
    batches, parts = cut.batches, cut.set_aside
    sup.applier.apply(sup.results.set_aside(parts))
    assert [(b.first, b.last) for b in batches] == [(0, 1), (3, 5)], "the rest of the run is packed"
    assert len(parts) == 1 and isinstance(parts[0], Unreadable)
    ((tp, bid, row, error_type, message),) = submitted
    assert (tp, row[0], error_type) == (TP0, 2, "UnreadableRecord") and repr(BAD) in message
    # INVARIANT (1): nothing commits past it until its dead letter is acknowledged.
    for b in batches:
        flow.tracker.complete(b.batch_id)
    assert flow.tracker.committable == 2
    flow.tracker.complete(bid)
    assert flow.tracker.committable == 6


def test_without_a_dead_letter_topic_the_partition_stops_at_it() -> None:
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0])
    flow = sup.partitions[TP0]
    sup.intake.take(Fetched(runs={TP0: run_with_bad(at=1, n=3)}, count=3))
    sup.applier.apply(sup.results.set_aside(sup.intake.cut(fakes.room(), drained=True).set_aside))
    assert flow.blocked is not None and "offset 1: UnreadableRecord" in flow.blocked


def test_several_unreadable_records_in_one_run() -> None:
    msgs = consumed([RawRecord(f"v{i}".encode(), None, [(BAD, None)] if i in (0, 3, 4, 9) else [], i)
                     for i in range(10)])
    sup, consumer, _clock, _pool = make()
    assign(sup, consumer, [TP0])
    sup.intake.take(Fetched(runs={TP0: msgs}, count=10))
    cut = sup.intake.cut(fakes.room(), drained=True)
    batches = cut.batches
    assert [p.row[0] for p in cut.set_aside] == [0, 3, 4, 9]
    frames = [decode_frame(b.frame) for b in batches]
    assert [v for f in frames if f for v in f.columns.values] == [b"v1", b"v2", b"v5", b"v6", b"v7", b"v8"]


def test_without_the_extension_the_daemon_path_does_the_same() -> None:
    """RINGMASTER_NO_SPEEDUPS=1: the Python packer, in a process of its own."""
    code = ("import sys; sys.path[:0] = ['tests', 'tests/unit']; "
            "from runtime.kafka.messages import bind_packer; bind_packer(); "
            "from runtime.transport import packing, speedups; "
            "from mockwire import consumed; from wire import RawRecord; "
            "from runtime.errors import UnreadableRecord; "
            "ms = consumed([RawRecord(b'a'), RawRecord(b'b', None, [(b'\\xff', b'1')])]); "
            "assert speedups.native is None and not packing.PACK.in_c\n"
            "try:\n    packing.pack_run(1, 0, 1, 't', 0, ms, 0, 2)\n"
            "except UnreadableRecord as e:\n"
            "    print('index', e.index, packing.salvage(ms[e.index], e)[0])\n")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, RINGMASTER_NO_SPEEDUPS="1"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "index 1 (1, None, b'b', None)" in out.stdout


def test_the_packer_is_bound_with_the_unreadable_error() -> None:
    assert packing.PACK._input_faults == (UnreadableRecord,)
