from __future__ import annotations

import msgpack
import pytest

from runtime.errors import FrameError
from runtime.plugin import Output, Record, Reject, normalize_output
from runtime.transport.frames import (
    DONE,
    STOP_FRAME,
    Columns,
    Result,
    decode_frame,
    decode_result,
    encode_batch,
    encode_result,
    peek_header,
)


def test_batch_roundtrip_and_header_peek() -> None:
    cols = Columns(5, [5, 7], [b"k", None], [b"v", None], [[("h", b"x")], None], [1, 0], [123, -1])
    data = encode_batch(9, 3, 7, "topic", 2, cols)
    assert peek_header(data) == (9, 3, 7)
    f = decode_frame(data)
    assert f is not None and (f.topic, f.partition) == ("topic", 2)
    assert f.columns == cols, "headers come back as (name, value) pairs, as confluent-kafka gives them"
    assert f.columns.row(1) == (7, None, None, None) and f.columns.last == 7
    assert decode_frame(STOP_FRAME) is None
    assert peek_header(STOP_FRAME)[1] == -1


def test_columns_slices_keep_offsets_exact_and_canonical() -> None:
    gappy = Columns(10, [10, 11, 12, 20, 21], [None] * 5, [b"v"] * 5, None, 1, [0] * 5)
    head, tail = gappy.slice(0, 3), gappy.slice(3, 5)
    assert (head.first, head.offsets, head.last) == (10, None, 12), "contiguous: no offset list"
    assert (tail.first, tail.offsets, tail.last) == (20, None, 21)
    assert list(gappy.slice(2, 4).offset_list()) == [12, 20]
    plain = Columns(3, None, [None] * 4, [b"v"] * 4, None, [0, 1, 0, 1], [0] * 4)
    assert list(plain.slice(1, 3).offset_list()) == [4, 5] and plain.slice(1, 3).ts_types == [1, 0]


def test_frame_with_columns_of_different_lengths_is_rejected() -> None:
    bad = msgpack.packb([1, 1, 0, 1, "t", 0, 0, None, [b"k"], [b"a", b"b"], None, 0, [0, 0]],
                        use_bin_type=True)
    with pytest.raises(FrameError):
        decode_frame(bad)


def test_result_roundtrip() -> None:
    r = Result(DONE, 1, 2, 3, 10, 9, 1, "")
    assert decode_result(encode_result(r)) == r


def test_malformed_frame_is_a_clear_error() -> None:
    with pytest.raises(FrameError):
        decode_frame(b"\xc1garbage")
    with pytest.raises(FrameError):
        decode_frame(msgpack.packb([1, "x"]))


def test_output_forms() -> None:
    rec = Record("t", 0, 1, None, b"v", None, (0, 0))
    assert normalize_output(b"v", None) == Output(b"v")
    assert normalize_output((b"k", "v"), None) == Output(b"v", b"k")
    assert isinstance(normalize_output(Reject(rec, "bad"), None), Reject)
    with pytest.raises(TypeError):
        normalize_output(42, None)
