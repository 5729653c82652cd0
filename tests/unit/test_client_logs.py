"""librdkafka's own lines never reach the terminal raw: every client the runtime makes routes
them into the structured log, where the same line passes at most once per window with a
count of those held back (runtime.kafka.client_log, runtime.ops.logs.Throttle). And an
unreachable cluster is KafkaUnreachable (exit 8) with one line naming the address, from
every call an operator command or the start makes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from runtime.errors import KafkaUnreachable
from runtime.kafka.admin import ClusterProbe, create_topic
from runtime.kafka.client_log import CLIENT_LOG, same_line
from runtime.kafka.consumer import GroupConsumer
from runtime.kafka.producer import OutputProducer, write_acknowledged
from runtime.kafka.topic_reader import TopicReader
from runtime.ops.logs import TextFormatter, Throttle

NOWHERE = "127.0.0.1:1"  # nothing listens: connections are refused at once


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def record(key: str | None, msg: str = "m") -> logging.LogRecord:
    r = logging.LogRecord("x", logging.WARNING, __file__, 1, msg, None, None)
    if key is not None:
        r.throttle = key
    return r


# ---------------------------------------------------------------------------- the throttle
def test_the_same_key_passes_once_per_window_then_says_how_many_were_held_back() -> None:
    clock = Clock()
    t = Throttle(window_s=30, clock=clock)
    assert t.filter(record("k"))
    assert not any(t.filter(record("k")) for _ in range(40))
    clock.t += 29.9
    assert not t.filter(record("k"))
    clock.t += 0.1
    r = record("k")
    assert t.filter(r) and r.suppressed == 41  # type: ignore[attr-defined]
    assert "throttle" not in TextFormatter().format(r), "the key is not printed as a field"
    assert t.filter(record("other")), "another key passes"


def test_every_handler_judges_a_record_by_its_key() -> None:
    """Two handlers on one logger (a terminal and a file, or a test's capture): the first
    handler's throttle must not take the key away from the second's."""
    first, second = Throttle(), Throttle()
    r = record("k")
    assert first.filter(r) and second.filter(r)
    again = record("k")
    assert not first.filter(again) and not second.filter(again)


def test_other_keys_and_records_without_a_key_are_not_held_back() -> None:
    t = Throttle(window_s=30, clock=Clock())
    assert t.filter(record("a")) and t.filter(record("b"))
    assert all(t.filter(record(None)) for _ in range(10))


def test_the_throttle_remembers_a_bounded_number_of_keys() -> None:
    t = Throttle(window_s=30, clock=Clock(), max_keys=10)
    for i in range(1000):
        t.filter(record(f"k{i}"))
    assert len(t._seen) == 10


def test_repetitions_of_a_client_line_share_one_key() -> None:
    a = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
         "(after 0ms in state CONNECT)")
    b = ("127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 13ms in state "
         "CONNECT, 30 identical error(s) suppressed)")
    assert same_line(a) == same_line(b)
    assert same_line("kafka:9092/1: Timed out FetchRequest in flight (after 60123ms, timeout #0)") == \
        same_line("kafka:9092/1: Timed out FetchRequest in flight (after 60023ms, timeout #1)")
    other = a.replace("127.0.0.1:1", "10.0.0.2:9092")
    assert same_line(a) != same_line(other), "another broker, another line"


def test_client_lines_go_to_the_structured_log_a_level_down(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="ringmaster.kafka.client"):
        CLIENT_LOG.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1",
                       "[thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect failed")
        CLIENT_LOG.log(logging.INFO, "%s [%s] %s", "BGQUEUE", "rdkafka#producer-2", "Purging queue")
    fail, bgqueue = caplog.records
    assert fail.levelno == logging.WARNING and fail.getMessage() == \
        "librdkafka FAIL: 127.0.0.1:1/bootstrap: Connect failed"
    assert fail.client == "rdkafka#consumer-1"  # type: ignore[attr-defined]
    assert bgqueue.levelno == logging.INFO


# ---------------------------------------------------------------------------- every client, for real
@pytest.fixture
def client_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="ringmaster.kafka"):
        yield caplog


def consumer() -> None:
    c = GroupConsumer({"bootstrap.servers": NOWHERE, "group.id": "g"})
    c.subscribe(["t"], lambda tps: None, lambda tps: None, lambda tps: None)
    for _ in range(6):
        c.consume(10, 0.2)
    c.close(5)


def producer() -> None:
    p = OutputProducer({"bootstrap.servers": NOWHERE})
    for _ in range(6):
        p.poll(0.2)


def reader() -> None:
    with pytest.raises(KafkaUnreachable, match=NOWHERE):
        TopicReader("ctl", {"bootstrap.servers": NOWHERE, "group.id": "g"}).read_to_end(
            lambda k, v, o: None, 1.0, "control topic")


def probe() -> None:
    with pytest.raises(KafkaUnreachable, match=NOWHERE):
        ClusterProbe({"bootstrap.servers": NOWHERE}).topics(1.0)


def admin() -> None:
    with pytest.raises(KafkaUnreachable, match=NOWHERE):
        create_topic({"bootstrap.servers": NOWHERE}, "t", timeout_s=1.0, what="control topic")


def writer() -> None:
    with pytest.raises(KafkaUnreachable, match=NOWHERE):
        write_acknowledged({"bootstrap.servers": NOWHERE}, "t", [(b"k", b"v")], timeout_s=1.0)


@pytest.mark.parametrize("use", [consumer, producer, reader, probe, admin, writer], ids=lambda f: f.__name__)
def test_no_client_prints_raw_librdkafka_lines(use: Callable[[], Any], capfd: pytest.CaptureFixture[str],
                                               client_log: pytest.LogCaptureFixture) -> None:
    use()
    err = capfd.readouterr().err
    assert "%3|" not in err and "|FAIL|" not in err, err[:500]
    if use in (consumer, producer):
        assert any(r.getMessage().startswith("librdkafka FAIL") for r in client_log.records), \
            "the lines went to the structured log instead"
        assert any("cannot reach the Kafka cluster" in r.getMessage() and r.bootstrap == NOWHERE  # type: ignore[attr-defined]
                   for r in client_log.records), "error_cb reports name the address"
