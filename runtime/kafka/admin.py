"""Client checks, cluster metadata and topic administration. Runs in: the CLI (checking
properties before anything connects; the operator commands), the daemon (waiting for the
cluster at start), the demo, tests and benchmarks (creating topics), the control topic."""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import KafkaError as _CKError
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.errors import ConfigError, KafkaAccessRefused, KafkaError, KafkaUnreachable
from runtime.kafka.client_log import UNREACHABLE, refused_access, with_logger


def check_client_properties(consumer_props: Mapping[str, Any], producer_props: Mapping[str, Any]) -> None:
    """Let librdkafka judge every property (a typo, a bad value) before anything connects: a
    client made without bootstrap.servers never touches the network. Raises ConfigError
    naming the section."""
    for section, client_type, props in (("kafka.consumer", Consumer, consumer_props),
                                        ("kafka.producer", Producer, producer_props)):
        # log_level 3: errors only (no notice that there is no bootstrap.servers: on purpose).
        # The logger keeps librdkafka's configuration warnings off the terminal: the real
        # clients made later log them (CONFWARN), once, through the structured log.
        offline = with_logger({k: v for k, v in props.items() if k != "bootstrap.servers"} | {"log_level": 3})
        try:
            client = client_type(offline)
        except KafkaException as exc:
            err = exc.args[0]
            raise ConfigError(f"{section}: {err.str() if isinstance(err, _CKError) else err}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{section}: {exc}") from None
        if isinstance(client, Consumer):
            client.close()
        else:
            client.flush(0)


def create_topic(props: Mapping[str, Any], topic: str, partitions: int = 1, replication_factor: int = -1,
                 config: Mapping[str, str] | None = None, timeout_s: float = 30.0,
                 what: str = "topic") -> bool:
    """Create a topic unless it exists; True if this call created it. ``props``: connection
    and security properties (admin_properties). Raises KafkaUnreachable when the cluster
    does not answer within timeout_s, KafkaError naming ``what`` when it refuses."""
    new = NewTopic(topic, num_partitions=partitions, replication_factor=replication_factor,
                   config=dict(config or {}))

    def ask(admin: AdminClient, attempt_s: float) -> bool:
        # A topic that exists is found by a metadata request, which any node answers.
        if _listed(admin, topic, attempt_s):
            return False
        futures = admin.create_topics([new], operation_timeout=attempt_s, request_timeout=attempt_s)
        try:
            answer(futures[topic], attempt_s)
        except KafkaException as exc:
            if _code(exc) == _CKError.TOPIC_ALREADY_EXISTS:
                return False
            raise
        return True

    try:
        return ask_anew(props, timeout_s, ask)
    except KafkaException as exc:
        doing, err = f"cannot create the {what} {topic!r}", exc.args[0]
        raise unanswered(props, exc, doing, timeout_s) or KafkaError(
            f"{doing}: {err.str() if isinstance(err, _CKError) else err}") from None


# CONTROLLER_WAIT: CreateTopics, and the alteration of a group's config, go to the node a client's
# metadata names as the controller. For seconds after a node dies, until the cluster fences it, a
# new client can be told that node, and librdkafka (2.16) waits for it until the request times
# out. Measured on a three-node cluster (tests/cluster/test_topic_creation.py): asked within 2 s
# of a node's kill, a create of a topic that existed, or a share group's config set, failed after
# its whole timeout: a daemon starting then would go without its status topic, or not start at all
# (its control topic, its share group). So each such ask is made by a new client each attempt of
# at most _ATTEMPT_S, whose metadata names a live node once the dead one is fenced, until the
# ask's own timeout. A broker's REQUEST_TIMED_OUT (a topic made, not yet everywhere) is asked
# again too: the next look finds the topic.
_ATTEMPT_S = 5.0
_RETRY_AFTER_S = 1.0
ASK_AGAIN = UNREACHABLE | {_CKError.REQUEST_TIMED_OUT}
T = TypeVar("T")


def ask_anew(props: Mapping[str, Any], timeout_s: float, ask: Callable[[AdminClient, float], T]) -> T:
    """``ask(client, attempt_s)`` with a new admin client each attempt (CONTROLLER_WAIT), until it
    returns, or raises a KafkaException whose error is not one to ask again (ASK_AGAIN); that,
    or the last one once timeout_s has passed, is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        began = time.monotonic()
        admin = AdminClient(with_logger(admin_properties(props)))
        try:
            return ask(admin, min(max(0.1, deadline - began), _ATTEMPT_S))
        except KafkaException as exc:
            if _code(exc) not in ASK_AGAIN or time.monotonic() >= deadline:
                raise
        finally:
            admin.poll(0)  # the client's log lines (CLIENT_LOG), served here
        # An answer that came at once (every node refused) is not asked again at once.
        time.sleep(max(0.0, min(began + _RETRY_AFTER_S, deadline) - time.monotonic()))


def answer(future: concurrent.futures.Future[T], timeout_s: float) -> T:
    """An admin request's answer: its KafkaException, or one with a local _TIMED_OUT when none
    came within timeout_s (and the second librdkafka may take past it)."""
    try:
        return future.result(timeout_s + 1.0)
    except concurrent.futures.TimeoutError:
        raise KafkaException(_CKError(_CKError._TIMED_OUT)) from None


def unanswered(props: Mapping[str, Any], exc: KafkaException, doing: str,
               timeout_s: float) -> KafkaUnreachable | None:
    """The KafkaUnreachable to raise when ``exc`` (from ask_anew) says the cluster did not
    answer within timeout_s; None when it answered."""
    return _unreachable(props, doing, timeout_s, exc.args[0]) if _code(exc) in ASK_AGAIN else None


def _code(exc: KafkaException) -> int | None:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, _CKError) else None


def _listed(admin: AdminClient, topic: str, timeout_s: float) -> bool:
    """Whether the cluster's metadata lists the topic; False when nobody answered (the
    create that follows says why). Every topic is asked for: asking for one by name lets a
    broker with auto.create.topics.enable create it, without the topic's config."""
    try:
        topics = admin.list_topics(timeout=timeout_s).topics
    except KafkaException:
        return False
    return topic in topics and topics[topic].error is None


def _unreachable(props: Mapping[str, Any], doing: str, timeout_s: float,
                 err: _CKError | None = None) -> KafkaUnreachable:
    why = f": {err.str()}" if err is not None else ""
    return KafkaUnreachable(f"{doing}: the Kafka cluster at {props.get('bootstrap.servers', '?')} "
                            f"(kafka.bootstrap_servers) did not answer within {timeout_s:g} s{why}")


class ClusterProbe:
    """Asks the cluster for its topics (a metadata request): the one question every start and
    every operator command needs answered first. One client, reused across attempts, so
    librdkafka's reconnect back-off applies between them."""

    def __init__(self, props: Mapping[str, Any]) -> None:
        self.props = dict(props)
        self.bootstrap = str(props.get("bootstrap.servers", "?"))
        # A refused login or TLS handshake reaches us only through error_cb: to list_topics()
        # it looks like a broker that went away (_TRANSPORT), which the daemon would wait out.
        # Kept apart from the probe: a bound method of the probe as error_cb was a cycle
        # (probe -> client -> probe), so a probe let go kept its client, threads and broker
        # connection until the cyclic garbage collector ran, which a daemon seldom does.
        self._refusals = _Refusals(self.bootstrap)
        self.cluster_id: str | None = None  # as the last answer named it
        self._admin = AdminClient(with_logger(admin_properties(props))
                                  | {"error_cb": self._refusals.on_error})

    @property
    def refused(self) -> str | None:
        return self._refusals.first

    def topics(self, timeout_s: float) -> dict[str, int]:
        """Topic -> partition count. KafkaUnreachable when nothing answers within timeout_s;
        KafkaAccessRefused when the cluster refuses the credentials or the TLS handshake
        fails; KafkaError when the cluster answers with another error (authorisation)."""
        try:
            meta = self._admin.list_topics(timeout=timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            self._admin.poll(0)  # error_cb: why the broker "went away"
            if self.refused is not None:
                raise KafkaAccessRefused(self.refused) from None
            if isinstance(err, _CKError) and err.code() in UNREACHABLE:
                raise KafkaUnreachable(f"no metadata from {self.bootstrap} within {timeout_s:g} s: "
                                       f"{err.str()}") from None
            raise KafkaError(f"cannot read the cluster's metadata from {self.bootstrap}: {err}") from None
        finally:
            self._admin.poll(0)
        self.cluster_id = meta.cluster_id
        return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


class _Refusals:
    """What a ClusterProbe's client said through error_cb: the first refusal of access."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.first: str | None = None

    def on_error(self, err: _CKError) -> None:
        self.first = self.first or refused_access(err, self.bootstrap)


# STALE_LEADERS: an admin client asked for a partition's offsets sends the request to the
# leader its metadata names. When that node was killed (its port refuses at once), librdkafka
# (2.16) connects to it again and again until the request times out (as its source reads, a
# connection asked for on a waiting request's behalf skips the reconnect back-off), and the
# client's metadata keeps naming the dead node after the partition has moved: every later ask
# spins again. Measured on a three-node cluster: 3.2-3.8 s of CPU in each 5 s ask; in the cluster
# matrix's batch rows each supervisor logged ~12,000 refused connects a second for as long as
# the row lasted, and one row failed. So an admin client whose ask of partition offsets came
# back short is replaced before the next ask: a new one reads the cluster's metadata afresh
# (runtime/kafka/group_offsets.py, runtime/kafka/watermarks.py). The same holds for the node an
# admin client's metadata names as the controller, which DescribeTopics waits for ("Failed
# while waiting for controller"): on the whole cluster matrix, with the ends all known, a batch
# run's admin client spun at ~12,000 refused connects a second for as long as a killed node
# stayed down (minutes: beside two such clients, the node's own restart crawled on 2 cores). So
# an ask of the topics that timed out replaces the client too, and it waits half as long.


def serve_client_log(client: object) -> None:
    """Hand the client's queued log lines to the structured log (``with_logger``): an admin
    client has no consume() or flush() that would. Fakes without poll() are left alone."""
    poll = getattr(client, "poll", None)
    if poll is not None:
        poll(0)


def admin_properties(props: Mapping[str, Any]) -> dict[str, Any]:
    """Connection and security properties apply to an admin client; consumer- or producer-only
    ones don't (librdkafka warns about each). An admin client's own notices (such as events
    left unserved when a short-lived one is destroyed) are not worth a line: warnings and up."""
    return {"log_level": 4} | {k: v for k, v in props.items()
                               if k == "bootstrap.servers" or k.startswith(
                                   ("security.", "sasl.", "ssl.", "client.", "socket.", "broker.",
                                    "api.version", "metadata.", "log_level"))}


def ensure_topics(bootstrap: str, topics: Iterable[str], partitions: int = 1,
                  extra: Mapping[str, Any] | None = None, timeout_s: float = 30.0) -> None:
    """Create topics that do not exist (used by the demo, tests and bench)."""
    for topic in topics:
        create_topic({"bootstrap.servers": bootstrap, **(extra or {})}, topic, partitions, 1,
                     timeout_s=timeout_s)
