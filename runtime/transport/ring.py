"""A single-producer single-consumer byte ring in shared memory, its doorbell, and the
message pipe that carries results back.

    supervisor (writer)                         worker (reader)
    try_write(frame) ──▶ [len|payload|pad]... ──▶ peek() → memoryview, advance()
         └── doorbell.ring() ─────── pipe ───────▶ doorbell.wait(timeout)
    MessageReader.read() ◀──── pipe: [len|payload]... ◀──── send_message(fd, payload)

Layout of the region handed to the ring: a 128-byte header with two 8-byte positions on
separate cache lines (``write_pos`` owned by the writer, ``read_pos`` by the reader; both
are byte counts that only grow), then the data area. A frame is a 4-byte length and the
payload, padded to 8 bytes; a frame that does not fit before the end of the data area
is preceded by a wrap marker (or by a tail too short to hold one) and starts at 0.

The ring knows nothing of Kafka; it moves opaque frames.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Any

from runtime.errors import FrameTooLarge
from runtime.transport.ordered import ordered_access

HEADER_BYTES = 128
_WRITE = 0  # index in the header viewed as 8-byte words
_READ = 8  # 64 bytes later: a different cache line from _WRITE
_WRAP = 0xFFFFFFFF


def _align8(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    """One side of the ring over ``region`` (a writable memoryview of a shared segment)."""

    def __init__(self, region: memoryview) -> None:
        if len(region) < HEADER_BYTES + 64:
            raise ValueError("ring region too small")
        # Native 'Q' items are stored with one aligned 8-byte move, so the other process
        # never sees a torn position. The other side's position is read with acquire and ours
        # published with release ordering (ordered.py: what the CPU needs for it).
        self._pos = region[:HEADER_BYTES].cast("Q")
        self._acquire, self._publish = ordered_access(self._pos)
        self._data = region[HEADER_BYTES:]
        self.capacity = len(self._data) & ~7
        # Largest frame that always fits once the ring is empty, wherever the writer is.
        self.max_frame = self.capacity // 2 - 8
        self._w = self._acquire(_WRITE)
        self._r = self._acquire(_READ)
        self._peeked = 0

    # -- writer side (supervisor) -------------------------------------------------
    def used_bytes(self) -> int:
        return self._w - self._acquire(_READ)

    def fill(self) -> float:
        return self.used_bytes() / self.capacity

    def try_write(self, payload: bytes | memoryview) -> bool:
        """Append one frame; False when there is no room now (the caller keeps it)."""
        n = len(payload)
        if n > self.max_frame:
            raise FrameTooLarge(f"frame of {n} bytes exceeds the ring's limit of {self.max_frame}")
        need = _align8(4 + n)
        w = self._w
        # Acquire: the reader released this room after it was done with the bytes in it.
        used = w - self._acquire(_READ)
        off = w % self.capacity
        tail = self.capacity - off
        if need > tail:
            if used + tail + need > self.capacity:
                return False
            if tail >= 4:
                self._data[off:off + 4] = _WRAP.to_bytes(4, "little")
            w += tail
            off = 0
        elif used + need > self.capacity:
            return False
        self._data[off:off + 4] = n.to_bytes(4, "little")
        self._data[off + 4:off + 4 + n] = payload
        self._w = w + need
        # INVARIANT: the position is published only after the payload is written, with
        # release ordering, so a reader that sees it (acquire) sees the frame's bytes, on any
        # CPU; a reader spinning on the ring never waits for the doorbell's syscalls to order
        # memory for it.
        self._publish(_WRITE, self._w)
        return True

    def write_position(self) -> int:
        return self._w

    def reader_reached(self, position: int) -> bool:
        """Has the reader taken every frame written before ``position``? Then it may be
        asleep on its doorbell. RACE: asked after publishing the frames written since
        ``position``; a reader that has not reached it yet will read them on its way without
        sleeping (it compares positions before it sleeps), so no wake-up is needed."""
        return self._acquire(_READ) >= position

    def reset(self) -> None:
        """Forget every frame. Only when no reader is attached (its worker is dead)."""
        self._publish(_READ, 0)
        self._publish(_WRITE, 0)
        self._w = 0

    # -- reader side (worker) -----------------------------------------------------
    def peek(self) -> memoryview | None:
        """The next frame's payload without consuming it, or None when empty."""
        r = self._r
        if r == self._acquire(_WRITE):  # acquire: a frame's bytes are seen with its position
            return None
        off = r % self.capacity
        tail = self.capacity - off
        if tail < 4 or int.from_bytes(self._data[off:off + 4], "little") == _WRAP:
            r += tail
            off = 0
        n = int.from_bytes(self._data[off:off + 4], "little")
        self._peeked = (r - self._r) + _align8(4 + n)
        return self._data[off + 4:off + 4 + n]

    def advance(self) -> None:
        """Release the frame returned by the last peek (its view must no longer be used)."""
        self._r += self._peeked
        self._peeked = 0
        # Release: the writer may reuse the room only after every read of the frame is done.
        self._publish(_READ, self._r)

    def release(self) -> None:
        self._pos.release()
        self._data.release()


class Doorbell:
    """Wakes the reader when frames are written: one end of a pipe each. ``ring`` never
    blocks (a full pipe means a wake-up is already pending); ``wait`` spins briefly (cheap
    when frames come back to back) before sleeping in select(). A pipe, not a named
    semaphore: nothing in /dev/shm to leak when a process is SIGKILLed. Spurious wake-ups
    are harmless: the reader always re-checks the ring."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.closed = False  # reader side: every writer is gone (the supervisor died)

    def ring(self) -> None:
        # A full pipe means a wake-up is already pending; a broken one, that the reader is
        # gone (the supervisor reaps it elsewhere).
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.fd, b"\0")

    def wait(self, ring: Ring, timeout: float, spin_s: float = 0.00005) -> bool:
        """Return True when the ring has a frame, False on timeout."""
        deadline = time.monotonic() + spin_s
        while time.monotonic() < deadline:
            if ring.peek() is not None:
                return True
        # Drain pending wake-ups first, then re-check: a write after the re-check makes the
        # pipe readable again, so no wake-up is lost.
        self._drain()
        if ring.peek() is not None:
            return True
        if self.closed:
            return False
        select.select([self.fd], [], [], timeout)
        return ring.peek() is not None

    def _drain(self) -> None:
        try:
            while True:
                if not os.read(self.fd, 4096):
                    # End of file: the writing end is closed for good, so the supervisor is
                    # gone (whatever process is our parent: with forkserver it is not the
                    # supervisor, so getppid() cannot tell).
                    self.closed = True
                    return
        except BlockingIOError:
            pass

    def check_closed(self) -> bool:
        self._drain()
        return self.closed


_LEN = 4  # message pipe: a 4-byte little-endian length before each payload


def send_message(fd: int, payload: bytes) -> None:
    """Write one length-prefixed message to a blocking pipe (the worker's result pipe).
    Runs in: a worker, its only writer."""
    view = memoryview(len(payload).to_bytes(_LEN, "little") + payload)
    while view:
        view = view[os.write(fd, view):]


class MessageReader:
    """The reading end of a message pipe, never blocking: ``read()`` returns the complete
    messages that have arrived (keeping a partial one for next time) and sets ``eof`` once
    every writer has gone. One non-blocking read per call instead of a selector per poll:
    ``multiprocessing``'s ``Connection.poll()`` cost the supervisor ~70 ns per record.
    Runs in: supervisor."""

    _CHUNK = 1 << 16

    def __init__(self, fd: int, owner: Any = None) -> None:
        """``owner``: the object that holds ``fd`` open (a ``Connection``), closed with it."""
        self.fd = fd
        self._owner = owner
        os.set_blocking(fd, False)
        self.eof = False
        self._pending = b""

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self._owner is not None:
            self._owner.close()
        else:
            os.close(self.fd)

    def read(self) -> list[bytes]:
        chunks = []
        while True:
            try:
                data = os.read(self.fd, self._CHUNK)
            except BlockingIOError:
                break
            except OSError:  # the pipe was closed under us: the same as end of file
                data = b""
            if not data:
                self.eof = True
                break
            chunks.append(data)
            if len(data) < self._CHUNK:
                break
        if not chunks:
            return []
        buf = self._pending + b"".join(chunks) if self._pending else b"".join(chunks)
        out, pos, end = [], 0, len(buf)
        while end - pos >= _LEN:
            n = int.from_bytes(buf[pos:pos + _LEN], "little")
            if end - pos - _LEN < n:
                break
            out.append(buf[pos + _LEN:pos + _LEN + n])
            pos += _LEN + n
        self._pending = buf[pos:]
        return out
