"""The consumer group's metadata in shared memory, for exactly-once (docs/exactly-once.md).

A worker commits its batch's offsets inside its own transaction with the metadata of the
supervisor's group membership (librdkafka's serialised ConsumerGroupMetadata: group, member
id, generation), so that the broker refuses them once this member no longer owns the
partition (KIP-447). The supervisor writes it whenever it changes (every rebalance); workers
read it at each commit.

A sequence lock: the writer makes the sequence odd, writes, makes it even; a reader that saw
an odd sequence, or a different one after copying, copies again. The writer is the
supervisor's thread alone.
"""

from __future__ import annotations

from runtime.errors import FrameError
from runtime.transport.ordered import ordered_access

GROUP_METADATA_BYTES = 4096
_SEQ, _LEN = 0, 1
_HEAD = 16  # two 8-byte words: the sequence, the length


class GroupMetadataCell:
    def __init__(self, region: memoryview) -> None:
        self._buf = region[:GROUP_METADATA_BYTES]
        self._w = self._buf[:_HEAD].cast("q")
        self._acquire, self._publish = ordered_access(self._w)

    def write(self, data: bytes) -> None:
        """Runs in: supervisor."""
        if len(data) > GROUP_METADATA_BYTES - _HEAD:
            raise FrameError(f"group metadata of {len(data)} bytes does not fit the "
                             f"{GROUP_METADATA_BYTES - _HEAD} bytes kept for it")
        seq = self._w[_SEQ]
        self._publish(_SEQ, seq + 1)
        self._w[_LEN] = len(data)
        self._buf[_HEAD:_HEAD + len(data)] = data
        self._publish(_SEQ, seq + 2)

    def read(self) -> bytes | None:
        """Runs in: a worker. None: nothing written yet (no assignment so far)."""
        while True:
            seq = self._acquire(_SEQ)
            if seq % 2:
                continue
            n = self._w[_LEN]
            data = bytes(self._buf[_HEAD:_HEAD + max(0, min(n, GROUP_METADATA_BYTES - _HEAD))])
            if self._acquire(_SEQ) == seq:
                return data if seq else None

    def release(self) -> None:
        self._w.release()
        self._buf.release()
