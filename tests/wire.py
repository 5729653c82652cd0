"""A test-side Kafka producer that writes records byte for byte: what Go and C producers can
put on the wire and the Python clients cannot.

confluent-kafka and kafka-python both take header names as ``str`` and encode them as
UTF-8, so neither can write a header name that is not valid UTF-8 (librdkafka's C API and
franz-go can: a Kafka header name is bytes on the wire). This module speaks the protocol
directly, just enough for that:

* Metadata v1, to find each partition's leader;
* Produce v3 (acks=-1) carrying one uncompressed RecordBatch v2 per call, CRC-32C over the
  batch as the broker checks it (google-crc32c computes it);
* records with any key, value, header names and values (``bytes`` or None), header counts
  and timestamps (any int64; CreateTime, or the LogAppendTime attribute bit).

Only for tests: no retries, no idempotence, no compression, one request at a time.
The records it writes are read back with confluent-kafka in tests/integration/test_wire.py.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import google_crc32c

PRODUCE, METADATA = 0, 3
NO_TIMESTAMP = -1
LOG_APPEND_TIME = 0x08  # RecordBatch attributes bit 3


@dataclass(frozen=True)
class RawRecord:
    """One record as it goes on the wire; ``headers`` are (name, value) in bytes, names
    included (None as a name is not allowed by the protocol; a value may be None)."""

    value: bytes | None
    key: bytes | None = None
    headers: Sequence[tuple[bytes, bytes | None]] = field(default_factory=tuple)
    timestamp: int = 0  # ms since the epoch, any int64 (-1: "no timestamp")


class ProtocolError(Exception):
    pass


# ---------------------------------------------------------------------------- encoding
def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def varint(n: int) -> bytes:
    """A signed varint (zig-zag, as Kafka's records use for lengths, deltas and counts)."""
    u = _zigzag(n) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while True:
        if u < 0x80:
            out.append(u)
            return bytes(out)
        out.append((u & 0x7F) | 0x80)
        u >>= 7


def _varbytes(b: bytes | None) -> bytes:
    return varint(-1) if b is None else varint(len(b)) + b


def _string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_record(r: RawRecord, offset_delta: int, base_timestamp: int) -> bytes:
    body = b"".join([
        b"\x00",  # attributes (unused)
        varint(r.timestamp - base_timestamp),
        varint(offset_delta),
        _varbytes(r.key),
        _varbytes(r.value),
        varint(len(r.headers)),
        *(_varbytes(name) + _varbytes(value) for name, value in r.headers),
    ])
    return varint(len(body)) + body


def record_batch(records: Sequence[RawRecord], log_append_time: bool = False) -> bytes:
    """One uncompressed RecordBatch v2 (magic 2) of these records, base offset 0 (the broker
    assigns offsets). The CRC-32C covers everything from the attributes to the end."""
    if not records:
        raise ValueError("a record batch holds at least one record")
    base_ts = records[0].timestamp
    body = b"".join(encode_record(r, i, base_ts) for i, r in enumerate(records))
    attributes = LOG_APPEND_TIME if log_append_time else 0
    max_ts = max(r.timestamp for r in records)
    after_crc = struct.pack(">hiqqqhii", attributes, len(records) - 1, base_ts, max_ts,
                            -1, -1, -1, len(records)) + body
    crc = google_crc32c.value(after_crc)
    # batchLength counts from partitionLeaderEpoch to the end.
    head = struct.pack(">qiibI", 0, 4 + 1 + 4 + len(after_crc), -1, 2, crc)
    return head + after_crc


# ---------------------------------------------------------------------------- decoding
class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return values

    def int(self, fmt: str) -> int:
        return self.take(fmt)[0]

    def string(self) -> str | None:
        n = self.int(">h")
        if n < 0:
            return None
        s = self.data[self.at:self.at + n].decode()
        self.at += n
        return s


# ---------------------------------------------------------------------------- connection
class _Connection:
    def __init__(self, host: str, port: int, timeout_s: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.correlation = 0

    def request(self, api_key: int, version: int, body: bytes) -> _Reader:
        self.correlation += 1
        header = struct.pack(">hhi", api_key, version, self.correlation) + _string("ringmaster-wire")
        payload = header + body
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)
        size = struct.unpack(">i", self._read(4))[0]
        r = _Reader(self._read(size))
        if r.int(">i") != self.correlation:
            raise ProtocolError("response out of order")
        return r

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ProtocolError("the broker closed the connection")
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


class WireProducer:
    """``produce(topic, partition, records)`` writes one batch and returns its base offset.
    Use as a context manager."""

    def __init__(self, bootstrap: str, timeout_s: float = 10.0) -> None:
        host, port = bootstrap.split(",")[0].rsplit(":", 1)
        self.timeout_s = timeout_s
        self._bootstrap = _Connection(host, int(port), timeout_s)
        self._leaders: dict[int, _Connection] = {}

    def __enter__(self) -> WireProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in {id(c): c for c in [self._bootstrap, *self._leaders.values()]}.values():
            c.close()

    def leader(self, topic: str, partition: int) -> tuple[str, int, int]:
        """(host, port, node id) of the partition's leader, from a Metadata v1 request."""
        r = self._bootstrap.request(METADATA, 1, struct.pack(">i", 1) + _string(topic))
        brokers = {}
        for _ in range(r.int(">i")):
            node = r.int(">i")
            host, port, _rack = r.string(), r.int(">i"), r.string()
            brokers[node] = (host, port)
        r.int(">i")  # controller id
        for _ in range(r.int(">i")):
            err, name, _internal = r.int(">h"), r.string(), r.int(">b")
            for _ in range(r.int(">i")):
                perr, pid, leader = r.take(">hii")
                r.take(f">{r.int('>i')}i")  # replicas
                r.take(f">{r.int('>i')}i")  # isr
                if name == topic and pid == partition:
                    if err or perr or leader not in brokers:
                        raise ProtocolError(f"no leader for {topic}[{partition}] (errors {err}, {perr})")
                    host, port = brokers[leader]
                    return str(host), port, leader
        raise ProtocolError(f"{topic}[{partition}] is not in the metadata")

    def produce(self, topic: str, partition: int, records: Sequence[RawRecord],
                log_append_time: bool = False) -> int:
        """Write the records as one batch (acks=all); returns the offset of the first. A
        partition whose leader is not settled yet (just created: Apache Kafka answers
        NOT_LEADER_OR_FOLLOWER or LEADER_NOT_AVAILABLE for a moment) is asked again, its
        leader looked up anew, until timeout_s."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            err, base_offset = self._produce_once(topic, partition, records, log_append_time)
            if not err:
                return base_offset
            if err not in _LEADER_NOT_SETTLED or time.monotonic() > deadline:
                raise ProtocolError(f"produce to {topic}[{partition}] failed with error code {err}")
            stale = self._leaders.pop(partition, None)
            if stale is not None and stale is not self._bootstrap and stale not in self._leaders.values():
                stale.close()
            time.sleep(0.2)

    def _produce_once(self, topic: str, partition: int, records: Sequence[RawRecord],
                      log_append_time: bool) -> tuple[int, int]:
        conn = self._leaders.get(partition)
        if conn is None:
            host, port, _node = self.leader(topic, partition)
            conn = self._leaders[partition] = _Connection(host, port, self.timeout_s)
        batch = record_batch(records, log_append_time)
        body = (_string(None) + struct.pack(">hii", -1, int(self.timeout_s * 1000), 1) + _string(topic)
                + struct.pack(">iii", 1, partition, len(batch)) + batch)
        r = conn.request(PRODUCE, 3, body)
        for _ in range(r.int(">i")):
            name = r.string()
            for _ in range(r.int(">i")):
                pid, err, base_offset, _append_time = r.take(">ihqq")
                if name == topic and pid == partition:
                    return err, base_offset
        raise ProtocolError("the produce response does not name the partition")


# UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER: retriable by the protocol
_LEADER_NOT_SETTLED = frozenset({3, 5, 6})


def produce_raw(bootstrap: str, topic: str, partition: int, records: Sequence[RawRecord],
                log_append_time: bool = False) -> int:
    with WireProducer(bootstrap) as p:
        return p.produce(topic, partition, records, log_append_time)
