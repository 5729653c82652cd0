"""The ring moves opaque frames in order, never overwrites unread bytes, and refuses
(rather than blocks) when full. Property-tested against a plain deque. The message pipe
delivers whole messages in order whatever the pipe's chunking."""

from __future__ import annotations

import os
import threading
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.errors import FrameTooLarge
from runtime.transport.ring import HEADER_BYTES, MessageReader, Ring, send_message


def make_ring(capacity: int) -> tuple[Ring, Ring]:
    region = memoryview(bytearray(HEADER_BYTES + capacity))
    return Ring(region), Ring(region)  # writer and reader views over the same memory


ops = st.lists(st.one_of(st.tuples(st.just("w"), st.integers(0, 700)), st.tuples(st.just("r"), st.just(0))),
               max_size=300)


@settings(max_examples=300, deadline=None)
@given(capacity=st.sampled_from([256, 1000, 4096]), script=ops)
def test_ring_matches_a_fifo(capacity: int, script: list[tuple[str, int]]) -> None:
    writer, reader = make_ring(capacity)
    model: deque[bytes] = deque()
    counter = 0
    for op, size in script:
        if op == "w":
            size = min(size, writer.max_frame)
            counter += 1
            payload = bytes([counter % 251]) * size
            before = writer.used_bytes()
            if writer.try_write(payload):
                model.append(payload)
            else:
                # A refusal changes nothing, and an empty ring never refuses a legal frame.
                assert writer.used_bytes() == before
                assert before > 0
        else:
            view = reader.peek()
            if not model:
                assert view is None
                continue
            assert view is not None and bytes(view) == model.popleft()
            view.release()
            reader.advance()
        assert 0 <= writer.used_bytes() <= writer.capacity
    # Drain: every accepted frame comes out, in order.
    while model:
        view = reader.peek()
        assert view is not None and bytes(view) == model.popleft()
        view.release()
        reader.advance()
    assert reader.peek() is None


def test_empty_ring_always_accepts_a_max_frame_wherever_the_writer_is() -> None:
    writer, reader = make_ring(1000)
    for shift in range(0, 1000, 24):
        assert writer.try_write(b"x" * (shift % 200))
        view = reader.peek()
        assert view is not None
        view.release()
        reader.advance()
        assert writer.try_write(b"y" * writer.max_frame), f"max frame refused at offset {shift}"
        view = reader.peek()
        assert view is not None and len(view) == writer.max_frame
        view.release()
        reader.advance()


def test_oversized_frame_is_an_error_not_a_hang() -> None:
    writer, _ = make_ring(1024)
    with pytest.raises(FrameTooLarge):
        writer.try_write(b"z" * (writer.max_frame + 1))


def test_full_ring_refuses_and_recovers_after_read() -> None:
    writer, reader = make_ring(1024)
    n = 0
    while writer.try_write(b"a" * 100):
        n += 1
    assert n > 0 and writer.fill() > 0.8
    view = reader.peek()
    assert view is not None
    view.release()
    reader.advance()
    assert writer.try_write(b"a" * 100)


def test_message_pipe_delivers_whole_messages_in_order_and_sees_the_writer_go() -> None:
    r, w = os.pipe()
    reader = MessageReader(r)
    try:
        assert reader.read() == [] and not reader.eof, "nothing yet: returns at once"
        send_message(w, b"one")
        send_message(w, b"")
        big = os.urandom(200_000)  # larger than the pipe buffer and than one read

        def write_big() -> None:
            send_message(w, big)
            os.close(w)

        writer = threading.Thread(target=write_big)
        writer.start()
        got: list[bytes] = []
        while not reader.eof:
            got += reader.read()
        writer.join()
        assert got == [b"one", b"", big]
    finally:
        os.close(r)


def test_message_pipe_keeps_a_partial_message_for_the_next_read() -> None:
    r, w = os.pipe()
    reader = MessageReader(r)
    try:
        os.write(w, (5).to_bytes(4, "little") + b"ab")
        assert reader.read() == []
        os.write(w, b"cde" + (1).to_bytes(4, "little") + b"z")
        assert reader.read() == [b"abcde", b"z"]
    finally:
        os.close(r)
        os.close(w)


def test_the_writer_knows_when_the_reader_may_be_asleep_and_needs_its_doorbell() -> None:
    """The supervisor rings a worker's doorbell only when the worker had taken every frame
    before the new ones (it may be asleep); a worker still behind reads them on its way."""
    region = memoryview(bytearray(HEADER_BYTES + 4096))
    writer, reader = Ring(region), Ring(region)
    start = writer.write_position()
    assert writer.try_write(b"a")
    assert writer.reader_reached(start), "an empty ring: the reader may be asleep"
    start = writer.write_position()
    assert writer.try_write(b"b")
    assert not writer.reader_reached(start), "the reader has not taken 'a' yet: it will find 'b'"
    view = reader.peek()
    assert view is not None and bytes(view) == b"a"
    view.release()
    reader.advance()
    assert not writer.reader_reached(start + 8 + 8), "still before 'b''s end"
    assert writer.reader_reached(start)


class OrderSpy:
    """Stands in for the C speedups' ordered words: plain accesses that note, at each
    publication, what the ring's data held at that moment."""

    def __init__(self, data: memoryview) -> None:
        self.data = data
        self.published: list[tuple[int, int, bytes]] = []  # (word, value, data at that moment)
        self.acquired: list[int] = []

    def load_acquire(self, words: memoryview, index: int) -> int:
        self.acquired.append(index)
        return int(words[index])

    def store_release(self, words: memoryview, index: int, value: int) -> None:
        self.published.append((index, value, bytes(self.data)))
        words[index] = value


def test_positions_are_published_with_release_after_the_frame_and_read_with_acquire(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The invariant the C ordering serves (ordered.py): a writer publishes its position
    (release) only once the frame's bytes are in the ring, and every position of the other
    side is read with acquire; the reader publishes its position only after the frame."""
    from runtime.transport import speedups
    region = memoryview(bytearray(HEADER_BYTES + 256))
    spy = OrderSpy(region[HEADER_BYTES:])
    monkeypatch.setattr(speedups, "native", spy)
    writer, reader = Ring(region), Ring(region)
    assert writer.try_write(b"frame-1")
    [(word, value, data)] = spy.published
    assert (word, value) == (0, 16) and data[4:11] == b"frame-1", "published after the bytes"
    spy.acquired.clear()
    view = reader.peek()
    assert view is not None and bytes(view) == b"frame-1"
    assert spy.acquired == [0], "the writer's position read with acquire"
    reader.advance()
    assert spy.published[-1][:2] == (8, 16), "the reader's position published with release"
    spy.acquired.clear()
    assert writer.used_bytes() == 0 and spy.acquired == [8]


def test_a_boards_phase_and_batch_are_published_after_the_words_they_vouch_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runtime.transport import speedups
    from runtime.transport.board import BOARD_BYTES, PHASE_CALL, PHASE_DELIVER, Board
    region = memoryview(bytearray(BOARD_BYTES))
    words = region.cast("q")
    spy = OrderSpy(region)
    monkeypatch.setattr(speedups, "native", spy)
    board = Board(region)
    board.begin(batch_id=7, slot=3)
    (_, batch, at_batch), = [p for p in spy.published if p[0] == 0]
    seen = memoryview(at_batch).cast("q")
    assert batch == 7 and seen[1] == 3 and seen[8] > 0 and seen[7] == PHASE_CALL, \
        "slot, the phase and its start time are in place when the batch is published"
    board.set_phase(PHASE_DELIVER)
    index, phase, at_phase = spy.published[-1]
    assert (index, phase) == (7, PHASE_DELIVER) and memoryview(at_phase).cast("q")[8] == words[8] > 0
    spy.acquired.clear()
    assert board.phase == PHASE_DELIVER and spy.acquired == [0, 7]
