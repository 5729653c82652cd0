"""runtime.ops.cluster.wait_for_cluster: a daemon waits for an unreachable cluster as long as
it takes, saying so in one line naming the address at once and then every 30 s (and to
systemd); a batch run and the operator commands give up after kafka.connect_timeout_s with
KafkaUnreachable (exit 8); SIGTERM ends the wait; an answer that is an error is not waited
out."""

from __future__ import annotations

import gc
import logging
import weakref
from typing import Any

import pytest

from runtime.config import Settings
from runtime.errors import KafkaAccessRefused, KafkaError, KafkaUnreachable
from runtime.kafka.admin import ClusterProbe
from runtime.ops.cluster import REPORT_EVERY_S, refuse_early, wait_for_cluster

BOOTSTRAP = "kafka-1.internal:9092"


class Time:
    """A clock that only moves when someone waits (the probe's timeout, a sleep)."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class Probe:
    """Unreachable for ``down_s`` (each attempt takes its whole timeout), then answers."""

    bootstrap = BOOTSTRAP

    def __init__(self, time: Time, down_s: float = float("inf"), error: KafkaError | None = None) -> None:
        self.time = time
        self.down_s = down_s
        self.error = error
        self.attempts = 0

    def topics(self, timeout_s: float) -> dict[str, int]:
        self.attempts += 1
        if self.error is not None:
            raise self.error
        if self.time.t < self.down_s:
            self.time.t += timeout_s
            raise KafkaUnreachable("Broker transport failure")
        return {"events": 4}


def settings() -> Settings:
    kafka = {"bootstrap_servers": BOOTSTRAP, "group_id": "g", "topics": ["events"]}
    return Settings.model_validate({"kafka": kafka, "workers": {"plugin": "x"}})


def wait(probe: Probe, time: Time, **kw: Any) -> dict[str, int] | None:
    return wait_for_cluster(settings(), probe=probe, clock=time, sleep=time.sleep, **kw)  # type: ignore[arg-type]


def test_a_daemon_waits_as_long_as_it_takes_and_says_so_every_30_s(caplog: pytest.LogCaptureFixture) -> None:
    time = Time()
    probe = Probe(time, down_s=200)
    notified: list[tuple[str, ...]] = []
    with caplog.at_level(logging.INFO, logger="ringmaster.cluster"):
        assert wait(probe, time, give_up_after_s=None, notify=lambda *lines: notified.append(lines)) == \
            {"events": 4}
    waiting = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 200 / REPORT_EVERY_S <= len(waiting) <= 200 / REPORT_EVERY_S + 1, len(waiting)
    assert waiting[0].waited_s <= 1 and all(r.bootstrap == BOOTSTRAP for r in waiting)  # type: ignore[attr-defined]
    assert "cannot reach the Kafka cluster" in waiting[0].getMessage()
    assert notified and any(line.startswith("EXTEND_TIMEOUT_USEC=") for line in notified[0])
    assert probe.attempts >= 90, "it keeps asking, about once a second"
    assert caplog.records[-1].getMessage() == "the Kafka cluster answers"


def test_a_batch_run_or_a_command_gives_up_after_the_bound_naming_the_address() -> None:
    time = Time()
    with pytest.raises(KafkaUnreachable) as info:
        wait(Probe(time), time, give_up_after_s=5)
    assert BOOTSTRAP in str(info.value) and "kafka.connect_timeout_s" in str(info.value)
    assert 5 <= time.t <= 7, "within about the bound"
    assert info.value.exit_code == 8


def test_a_cluster_that_answers_at_once_costs_one_request() -> None:
    time = Time()
    probe = Probe(time, down_s=0)
    assert wait(probe, time, give_up_after_s=None) == {"events": 4} and probe.attempts == 1


def test_a_stop_request_ends_the_wait() -> None:
    time = Time()
    assert wait(Probe(time), time, give_up_after_s=None, stop=lambda: time.t > 10) is None
    assert time.t < 13


def test_an_answer_that_is_an_error_is_not_waited_out() -> None:
    time = Time()
    probe = Probe(time, error=KafkaError("SASL authentication failed"))
    with pytest.raises(KafkaError, match="SASL") as info:
        wait(probe, time, give_up_after_s=None)
    assert not isinstance(info.value, KafkaUnreachable) and probe.attempts == 1


@pytest.mark.parametrize("give_up", [None, 30.0])
def test_a_refused_login_is_not_waited_out(give_up: float | None) -> None:
    time = Time()
    probe = Probe(time, error=KafkaAccessRefused("the Kafka cluster at x refused the credentials"))
    with pytest.raises(KafkaAccessRefused):
        wait(probe, time, give_up_after_s=give_up)
    assert probe.attempts == 1


def test_refuse_early_raises_only_for_a_refusal() -> None:
    """redrive and Spark wait for an unreachable cluster in their own way: one question."""
    time = Time()
    down = Probe(time)
    refuse_early(settings(), probe=down)  # type: ignore[arg-type]  # the probe's interface
    assert down.attempts == 1
    with pytest.raises(KafkaAccessRefused):
        refuse_early(settings(), probe=Probe(time, error=KafkaAccessRefused("refused")))  # type: ignore[arg-type]


def test_a_probe_let_go_takes_its_client_with_it_without_the_garbage_collector() -> None:
    """The daemon's start waits for the cluster with a probe and drops it (run.py); were the
    probe and its client a reference cycle (error_cb a bound method of the probe), the client's
    threads and broker connection would live until the cyclic collector ran, which a daemon
    seldom does: the idle supervisor held a fourth librdkafka client for its whole life."""
    probe = ClusterProbe({"bootstrap.servers": "127.0.0.1:1"})
    client = weakref.ref(probe._admin)
    enabled = gc.isenabled()
    gc.disable()
    try:
        del probe
        assert client() is None, "the probe's client outlived it"
    finally:
        if enabled:
            gc.enable()
