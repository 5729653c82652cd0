"""tests/wire.py, the byte-for-byte test producer, against the real broker: what it writes
is what confluent-kafka reads back, field by field, including what the Python clients
cannot write (a header name that is not UTF-8)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import TEST_BROKER, make_topics, read_all
from wire import ProtocolError, RawRecord, WireProducer, produce_raw, record_batch, varint

pytestmark = pytest.mark.integration


def test_varints_are_zigzag_encoded() -> None:
    assert [varint(n) for n in (0, -1, 1, -64, 64, 300)] == \
        [b"\x00", b"\x01", b"\x02", b"\x7f", b"\x80\x01", b"\xd8\x04"]
    with pytest.raises(ValueError):
        record_batch([])


def test_what_it_writes_is_what_a_consumer_reads(broker: Any, names: dict[str, str]) -> None:
    make_topics(broker.bootstrap, 2, names["in"])
    # Tansu stores any int64 timestamp; Apache Kafka refuses one more than
    # log.message.timestamp.after.max.ms (1 h) ahead with INVALID_TIMESTAMP (32), as asserted.
    extreme = 2**62 if TEST_BROKER != "kafka" else 0  # the epoch: in range on both
    records = [
        RawRecord(b"v0", b"k0", [(b"a", b"1"), (b"", None), (b"a", b"")], 1_700_000_000_000),
        RawRecord(None, None, [], -1),
        RawRecord(b"", b"", [(b"h%d" % i, b"x" * i) for i in range(500)], extreme),
        RawRecord(b"v3", bytes(range(256)), [("é".encode(), bytes(range(256)))], -5),
    ]
    with WireProducer(broker.bootstrap) as p:
        if TEST_BROKER == "kafka":
            with pytest.raises(ProtocolError, match="error code 32"):
                p.produce(names["in"], 0, [RawRecord(b"v", None, [], 2**62)])
        assert p.produce(names["in"], 1, records) == 0
        assert p.produce(names["in"], 1, [RawRecord(b"appended", None, [], 0)], log_append_time=True) == 4
    got = sorted(read_all(broker.bootstrap, names["in"]), key=lambda m: m.offset())
    assert [m.partition() for m in got] == [1] * 5
    for m, r in zip(got, records, strict=False):
        assert (m.value(), m.key(), m.timestamp()) == (r.value, r.key, (1, r.timestamp))
        assert m.headers() == ([(n.decode(), v) for n, v in r.headers] or None)
    # Tansu stores the producer's LogAppendTime bit; Apache Kafka takes the type from the topic's
    # message.timestamp.type (CreateTime here), whatever the producer says.
    append_type = 1 if TEST_BROKER == "kafka" else 2
    assert got[4].value() == b"appended" and got[4].timestamp()[0] == append_type, "the timestamp type"


def test_a_header_name_that_is_not_utf8_reaches_the_consumer(broker: Any, names: dict[str, str]) -> None:
    """The reproduction of issue 17: confluent-kafka cannot give the headers of such a
    record (SystemError from headers(), the client's UnicodeDecodeError as its cause)."""
    make_topics(broker.bootstrap, 1, names["in"])
    produce_raw(broker.bootstrap, names["in"], 0, [RawRecord(b"v", None, [(b"\xff\xfe", b"x")], 1)])
    (m,) = read_all(broker.bootstrap, names["in"])
    with pytest.raises(SystemError) as info:
        m.headers()
    assert isinstance(info.value.__cause__, UnicodeDecodeError) and info.value.__cause__.object == b"\xff\xfe"


def test_a_refused_produce_is_an_error(broker: Any, names: dict[str, str]) -> None:
    make_topics(broker.bootstrap, 1, names["in"])
    with WireProducer(broker.bootstrap) as p, pytest.raises(ProtocolError):
        p.produce(names["in"], 7, [RawRecord(b"v")])  # no such partition


def test_two_members_stay_alive_through_unreadable_records(broker: Any, names: dict[str, str],
                                                         tmp_path: Any) -> None:
    """Issue 17's 'done': records whose header name is not UTF-8, in every partition, read by
    two members of one group (one with the C speedups, one without): both stay alive, every
    other record is processed once, each bad one is dead-lettered, every offset committed."""
    from helpers import Ringmaster, committed, daemon_config, wait_for
    from wire import WireProducer

    make_topics(broker.bootstrap, 4, names["in"], names["out"], names["dlq"])
    bad = {(p, i) for p in range(4) for i in (0, 7, 8, 19)}
    cfg = daemon_config(broker, names, tmp_path, processes=2, batch_max_records=5)
    members = [Ringmaster(cfg, tmp_path, "a"),
               Ringmaster(cfg, tmp_path, "b", env={"RINGMASTER_NO_SPEEDUPS": "1"})]
    try:
        # Both members hold partitions before the records arrive: each meets bad records.
        wait_for(lambda: all((m.status() or {}).get("partitions") for m in members)
                 and sum(len(m.status()["partitions"]) for m in members) == 4,  # type: ignore[index]
                 60, "the group to spread its partitions over both members", interval_s=0.2)
        with WireProducer(broker.bootstrap) as w:
            for p in range(4):
                w.produce(names["in"], p, [
                    RawRecord(f"p{p}-{i}".encode(), b"k%d" % i,
                              [(b"trace", b"t"), *([(b"\xff\xfe", b"x")] if (p, i) in bad else [])], i)
                    for i in range(20)])
        wait_for(lambda: committed(broker.bootstrap, names["group"], names["in"], 4)
                 == dict.fromkeys(range(4), 20), 120, "every offset committed", interval_s=0.3)
        assert all(m.proc.poll() is None for m in members), [m.log_tail() for m in members]
        assert all(m.terminate(60) == 0 for m in members)
        assert all(m.status()["dead_letters"] > 0 for m in members), "each member dead-lettered some"  # type: ignore[index]
    finally:
        for m in members:
            m.close()
    outputs = read_all(broker.bootstrap, names["out"])
    dead = read_all(broker.bootstrap, names["dlq"])
    seen = sorted(json.loads(m.value())["id"] for m in outputs)
    assert seen == sorted(f"p{p}-{i}" for p in range(4) for i in range(20) if (p, i) not in bad), "once each"
    assert sorted(m.value().decode() for m in dead) == sorted(f"p{p}-{i}" for p, i in bad)
    assert all(dict(m.headers())["ringmaster.error.type"] == b"UnreadableRecord" for m in dead)
