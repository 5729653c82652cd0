"""Waiting for the Kafka cluster before anything else. Runs in: the supervisor process at
start (before shared memory, workers or the consumer exist), the operator commands.

An unreachable cluster is an outage, not a bug, and not the client's fatal error. What each
caller does about it:

* ``ringmaster run`` (a daemon) waits as long as it takes, asking the cluster for its
  metadata about once a second, logging one line naming ``kafka.bootstrap_servers`` at
  once and then every ``REPORT_EVERY_S``; under systemd it extends its start timeout and
  says why in ``STATUS=``. SIGTERM/SIGINT while waiting stops it at once, with exit 0.
* ``ringmaster run --until-caught-up`` and ``ringmaster pause``/``resume`` give up after
  ``kafka.connect_timeout_s`` with one line naming the address and exit 8
  (KafkaUnreachable).

A cluster that answers but refuses the client (SASL authentication failed, a certificate not
trusted) is not an outage: every caller stops at once with KafkaAccessRefused (exit 14).

A cluster that answers but cannot give the configuration what it needs is said in one line
(``cluster_problem``): the daemon does not start (exit 2), ``check --connect`` says so.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from runtime.config import Settings
from runtime.errors import KafkaUnreachable
from runtime.kafka.admin import ClusterProbe
from runtime.kafka.properties import consumer_properties

log = logging.getLogger("ringmaster.cluster")

# The cluster id the embedded development broker (Tansu) answers with (docs/brokers.md).
TANSU_CLUSTER_ID = "tansu_cluster"
REPORT_EVERY_S = 30.0
ATTEMPT_S = 1.0  # one metadata request's wait; also the pause between attempts


def wait_for_cluster(settings: Settings, *, give_up_after_s: float | None,
                     stop: Callable[[], bool] = lambda: False,
                     notify: Callable[..., None] = lambda *lines: None,
                     probe: ClusterProbe | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], None] = time.sleep) -> dict[str, int] | None:
    """The cluster's topics (name -> partitions) once it answers. None when ``stop()``
    became true first; KafkaUnreachable once ``give_up_after_s`` passed (None: never).
    An answer that is an error (authentication, authorisation) is not an outage: its
    KafkaError is raised at once."""
    probe = probe or ClusterProbe(consumer_properties(settings))
    started = clock()
    next_report = started
    while True:
        waited = clock() - started
        attempt = ATTEMPT_S if give_up_after_s is None else max(0.1, min(ATTEMPT_S, give_up_after_s - waited))
        try:
            topics = probe.topics(attempt)
        except KafkaUnreachable as exc:
            last = exc
        else:
            if clock() - started >= ATTEMPT_S:
                log.info("the Kafka cluster answers", extra={"bootstrap": probe.bootstrap,
                                                              "waited_s": round(clock() - started, 1)})
            return topics
        waited = clock() - started
        if give_up_after_s is not None and waited >= give_up_after_s:
            raise KafkaUnreachable(
                f"cannot reach the Kafka cluster at {probe.bootstrap} (kafka.bootstrap_servers) within "
                f"{give_up_after_s:g} s (kafka.connect_timeout_s): is it up, and is the address right?")
        if give_up_after_s is None and clock() >= next_report:
            log.warning("cannot reach the Kafka cluster; waiting for it (SIGTERM stops)", extra={
                "bootstrap": probe.bootstrap, "waited_s": round(waited), "error": str(last)})
            notify(f"STATUS=waiting for the Kafka cluster at {probe.bootstrap}",
                   f"EXTEND_TIMEOUT_USEC={int(3 * REPORT_EVERY_S * 1e6)}")
            next_report += REPORT_EVERY_S
        pause_until = clock() + ATTEMPT_S
        while clock() < pause_until:
            if stop():
                return None
            sleep(0.1)
        if stop():
            return None


def refuse_early(settings: Settings, probe: ClusterProbe | None = None) -> None:
    """One question to the cluster, for commands that wait for it in their own way (redrive,
    Spark): KafkaAccessRefused (exit 14) if it refuses the credentials or the TLS handshake,
    so that they stop in one line instead of retrying the login for ever; nothing otherwise,
    an unreachable cluster included (theirs to handle)."""
    probe = probe or ClusterProbe(consumer_properties(settings))
    with contextlib.suppress(KafkaUnreachable):
        probe.topics(ATTEMPT_S)


def cluster_problem(settings: Settings, cluster_id: str | None) -> str | None:
    """What this cluster cannot give the configuration, in one line; None when nothing is known
    to be missing. Exactly-once needs ``read_committed`` readers that skip aborted records, which
    Tansu hands them (docs/brokers.md): a batch that ran again would be read twice downstream."""
    if settings.output.guarantee == "exactly-once" and cluster_id == TANSU_CLUSTER_ID:
        return ('output.guarantee = "exactly-once" needs a broker whose read_committed readers skip '
                f"aborted records; the cluster at {settings.kafka.bootstrap_servers} is Tansu, the "
                f"development broker (cluster id {cluster_id!r}), which hands them over: run Apache Kafka "
                '(ringmaster broker --apache-kafka) or set output.guarantee = "at-least-once"')
    return None
