"""Regression tests from the audit and the fuzzing of the C speedups and the frame decoder
(issue 17): each input here once crashed, corrupted memory, or made C and Python disagree.
Whatever they are given, the C paths return what Python returns or raise."""

from __future__ import annotations

import msgpack
import pytest
from confluent_kafka import Message

from runtime.errors import FrameError, UnreadableRecord
from runtime.kafka.messages import bind_packer
from runtime.plugin import Record
from runtime.transport import speedups
from runtime.transport.frames import BATCH, Columns, decode_frame, encode_batch, peek_header
from runtime.transport.packing import _pack_run_py
from runtime.worker.decoding import _records_c, _records_py, _same_records

bind_packer()  # the packer packs confluent-kafka's messages, as the daemon's consumer has it

needs_c = pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")
HEAD = (BATCH, 1, 0, 1, "t", 0)


@needs_c
def test_bind_refuses_methods_copied_from_another_type() -> None:
    """A descriptor of Message's C method placed on another class would be called on objects
    of that class, reading a Message's struct out of them."""
    class Fake:
        offset, key, value, headers, timestamp = (Message.offset, Message.key, Message.value,
                                                  Message.headers, Message.timestamp)

    assert speedups.native is not None
    with pytest.raises(TypeError, match="not a C method of the type"):
        speedups.native.bind(Fake, UnreadableRecord)
    speedups.native.bind(Message, UnreadableRecord)  # a refused bind kept the previous one whole
    m = Message(topic="t", partition=0, offset=3, value=b"v", timestamp=(1, 2))
    assert speedups.native.pack_frame(HEAD, [m], 0, 1) == _pack_run_py(HEAD, [m], 0, 1)


@needs_c
def test_build_records_refuses_slots_copied_from_another_type() -> None:
    class Copied:
        topic, partition, offset, key, value, headers, timestamp = (
            Record.topic, Record.partition, Record.offset, Record.key, Record.value, Record.headers,
            Record.timestamp)

    assert speedups.native is not None
    with pytest.raises(TypeError, match="plain __slots__"):
        speedups.native.build_records(Copied, "t", 0, 0, None, [None], [b"v"], None, 0, [0])


@needs_c
@pytest.mark.parametrize("first", [2**63 - 2, 2**63 - 1, 2**64 + 5, -2**63, True])
def test_offsets_near_and_past_64_bits_are_pythons(first: int) -> None:
    """first + i overflowed a C long long (undefined behaviour, wrapped offsets in practice);
    a frame may hold any integer: the records get exactly Python's range()."""
    c = Columns(first, None, [None, None], [b"a", b"b"], None, 1, [0, 0])
    assert [r.offset for r in _records_c("t", 0, c)] == [r.offset for r in _records_py("t", 0, c)] \
        == [int(first), int(first) + 1]


@needs_c
def test_first_is_not_read_when_offsets_are_listed() -> None:
    """C parsed first as a 64-bit int even when the offsets column made it unused."""
    c = Columns("unused", [4, 9], [None, None], [b"a", b"b"], None, 1, [0, 0])  # type: ignore[arg-type]
    assert _same_records(_records_c("t", 0, c), _records_py("t", 0, c))


@pytest.mark.parametrize("bad", [
    dict(keys=[None]), dict(timestamps=[0, 0, 0]), dict(offsets=[1]), dict(headers=[None]),
    dict(ts_types=[1]), dict(ts_types=None), dict(values=(b"a", b"b")), dict(keys="ab")])
def test_both_record_builders_refuse_columns_of_other_lengths(bad: dict[str, object]) -> None:
    """Python's map() stopped at the shortest column and built fewer records than C refused."""
    fields = dict(first=0, offsets=None, keys=[None, None], values=[b"a", b"b"], headers=None, ts_types=1,
                  timestamps=[0, 0])
    c = Columns(**{**fields, **bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        _records_py("t", 0, c)
    if speedups.native is not None:
        with pytest.raises(ValueError):
            _records_c("t", 0, c)


@needs_c
def test_contiguity_is_judged_without_overflow() -> None:
    """offset[0] + i overflowed (undefined behaviour) for a run ending at the largest offset;
    no client returns such a run, and the compiler did not exploit it here, but it must not
    be there to exploit."""
    msgs = [Message(topic="t", partition=0, offset=o, value=b"v", timestamp=(1, 0))
            for o in (2**63 - 2, 2**63 - 1, 2**63 - 1)]
    assert speedups.native is not None
    assert speedups.native.pack_frame(HEAD, msgs, 0, 3) == _pack_run_py(HEAD, msgs, 0, 3)


@pytest.mark.parametrize("start, stop", [(0, 3), (-1, 1), (1, 1), (2, 1)])
def test_both_packers_refuse_a_run_out_of_range(start: int, stop: int) -> None:
    """A Python slice quietly clipped what C refused."""
    msgs = [Message(topic="t", partition=0, offset=o, value=b"v", timestamp=(1, 0)) for o in (0, 1)]
    with pytest.raises(IndexError):
        _pack_run_py(HEAD, msgs, start, stop)
    if speedups.native is not None:
        with pytest.raises(IndexError):
            speedups.native.pack_frame(HEAD, msgs, start, stop)


def _frame(**over: object) -> bytes:
    fields = [BATCH, 1, 0, 1, "t", 0, 5, None, [b"k"], [b"v"], None, 1, [7]]
    names = ["kind", "batch_id", "slot", "epoch", "topic", "partition", "first", "offsets", "keys", "values",
             "headers", "ts_types", "timestamps"]
    for k, v in over.items():
        fields[names.index(k)] = v
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize("data", [
    msgpack.packb({0: 1}), msgpack.packb({0: 2}), msgpack.packb([2, 1]), msgpack.packb("x"),
    msgpack.packb([]),
    _frame(keys="k"), _frame(values="v"), _frame(timestamps=b"t"), _frame(headers=[[1]]),
    _frame(headers=["ab"]), _frame(headers=[{"a": b"1"}]), _frame(headers="h"),
    _frame(batch_id="1"), _frame(topic=b"t"), _frame(first=None), _frame(ts_types="1"),
    _frame(offsets={"a": 1}), _frame(values=[]),
], ids=lambda d: d[:12].hex())
def test_hostile_frames_raise_frame_error_only(data: bytes) -> None:
    """[STOP, anything] decoded as STOP; a str or bytes where a column belongs was taken as
    one (its characters became records); a record's headers that are not a list, header
    fields and column types were not checked. (Each pair is made a tuple, not type-checked:
    the worker's hot path.) (The map and empty cases were already refused: kept as neighbours.)"""
    with pytest.raises(FrameError):
        decode_frame(data)


def test_a_good_frame_still_decodes() -> None:
    c = Columns(5, None, [b"k"], [b"v"], [[("h", b"1"), ("", None)]], 1, [7])
    frame = decode_frame(encode_batch(1, 0, 1, "t", 0, c))
    assert frame is not None and frame.columns == c


@pytest.mark.parametrize("head", [["1", 0, 1], [1, None, 1], [1, 0, 1.5]])
def test_peek_header_refuses_ids_that_are_not_integers(head: list[object]) -> None:
    with pytest.raises(FrameError):
        peek_header(_frame(batch_id=head[0], slot=head[1], epoch=head[2]))


@needs_c
def test_bind_requires_the_unreadable_error() -> None:
    """With a default (ValueError) an unreadable record read as a bug of C: the hot path
    fell back to Python, which touched the broken message again and crashed (seen when a
    test bound the packer without it)."""
    assert speedups.native is not None
    with pytest.raises(TypeError):
        speedups.native.bind(Message)
    speedups.native.bind(Message, UnreadableRecord)
