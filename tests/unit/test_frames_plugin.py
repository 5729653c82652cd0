from __future__ import annotations

import msgpack
import pytest

from runtime.errors import FrameError
from runtime.frames import (
    DONE,
    STOP_FRAME,
    Result,
    decode_frame,
    decode_result,
    encode_batch,
    encode_result,
    peek_header,
)
from runtime.plugin import Output, Record, Reject, normalize_output


def test_batch_roundtrip_and_header_peek() -> None:
    rows = [[5, b"k", b"v", [("h", b"x")], 1, 123], [6, None, None, None, 0, -1]]
    data = encode_batch(9, 3, 7, "topic", 2, rows)
    assert peek_header(data) == (9, 3, 7)
    f = decode_frame(data)
    assert f is not None and f.records[0][:3] == [5, b"k", b"v"] and f.records[1][1] is None
    assert decode_frame(STOP_FRAME) is None
    assert peek_header(STOP_FRAME)[1] == -1


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
