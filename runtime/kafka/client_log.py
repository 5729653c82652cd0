"""librdkafka's own log lines, and the client errors it reports, into our structured logging.

Without a ``logger`` property librdkafka prints its lines raw on stderr from its own threads
(``%3|1795428288.320|FAIL|rdkafka#consumer-3| [thrd:...]: ... Connection refused``): every
50 ms per client while a broker is unreachable, and ``%6|...|BGQUEUE|`` or
``%5|...|REQTMOUT|`` in normal runs. Every client the runtime makes gets :data:`CLIENT_LOG`
instead (``with_logger``); confluent-kafka then hands each line to it from the calls that
serve the client's queue (``consume``, ``poll``, ``flush``), on the caller's thread.

Each line goes to the ``ringmaster.kafka.client`` logger with a ``throttle`` key (the line
with its varying numbers taken out), so ``runtime.ops.logs.Throttle`` lets the same line
through at most once per window, with a count of those held back. Runs in: every process
with a Kafka client (supervisor, workers, the CLI).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError as _CKError
from confluent_kafka import KafkaException

from runtime.errors import KafkaError

log = logging.getLogger("ringmaster.kafka.client")
call_log = logging.getLogger("runtime.kafka.consumer")  # the calls the supervisor makes on its consumer

# confluent-kafka maps librdkafka's syslog levels before calling log(): 0-2 CRITICAL, 3 ERROR,
# 4 WARNING, 5-6 INFO, 7 DEBUG. librdkafka's "errors" are mostly connections it retries by
# itself; what the client cannot recover from reaches the runtime as an exception or through
# error_cb. So errors and worse are taken one step down; notices and info (REQTMOUT, BGQUEUE)
# stay INFO: in the daemon's log, never on a terminal of their own.
_LEVELS = {logging.CRITICAL: logging.ERROR, logging.ERROR: logging.WARNING, logging.WARNING: logging.WARNING,
           logging.INFO: logging.INFO, logging.DEBUG: logging.DEBUG}

# What changes from one repetition of a line to the next: "(after 0ms in state CONNECT)",
# "(after 60123ms, timeout #0)", durations, counts, librdkafka's own "N identical error(s)
# suppressed". Addresses and names stay: two brokers down are two lines.
_VARYING = re.compile(r"\s*\(after .*$|\b[0-9]+(\.[0-9]+)?\s*(ms|s)\b"
                      r"|\b[0-9]+ (events?|messages?|requests?|ops?|partitions?)\b|timeout #[0-9]+")
_THREAD = re.compile(r"^\[thrd:[^\]]*\]:\s*")

# Error codes that mean "the cluster does not answer": the client keeps trying by itself.
UNREACHABLE = frozenset({_CKError._TRANSPORT, _CKError._ALL_BROKERS_DOWN, _CKError._RESOLVE,
                         _CKError._TIMED_OUT})


# Error codes that mean "the cluster answers but will not let this client in": retrying with
# the same settings cannot help (runtime.errors.KafkaAccessRefused).
REFUSED = frozenset({_CKError._AUTHENTICATION, _CKError._SSL, _CKError.SASL_AUTHENTICATION_FAILED})


def refused_access(err: _CKError, bootstrap: str) -> str | None:
    """One line saying why the cluster refused this client and which settings to check, or
    None when ``err`` is not such a refusal. librdkafka's text names the broker, the mechanism
    and the TLS failure; it never carries the password."""
    if err.code() not in REFUSED:
        return None
    text = _THREAD.sub("", err.str())
    if err.code() == _CKError._SSL:
        return (f"the Kafka cluster at {bootstrap} is not trusted: {same_line(text).strip()} "
                "(check kafka.security.ca_location and kafka.security.protocol)")
    return (f"the Kafka cluster at {bootstrap} refused the credentials: {same_line(text).strip()} "
            "(check kafka.security.username, the password and kafka.security.sasl_mechanism)")


def same_line(text: str) -> str:
    """The part of a client's line that stays the same when it repeats (the throttle key)."""
    return _VARYING.sub("", text)


class ClientLog:
    """The ``logger`` property of every client: confluent-kafka calls
    ``log(level, "%s [%s] %s", facility, client_name, message)``."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if len(args) == 3:
            facility, client, text = (str(a) for a in args)
        else:  # not the call confluent-kafka makes today: keep the line whatever it is
            facility, client, text = "", "", fmt % args if args else fmt
        text = _THREAD.sub("", text)
        log.log(_LEVELS.get(level, level), "librdkafka %s: %s", facility, text,
                extra={"client": client, "throttle": f"librdkafka {facility} {same_line(text)}"})


CLIENT_LOG = ClientLog()


def with_logger(props: Mapping[str, Any]) -> dict[str, Any]:
    """A client's properties with its log lines routed through :data:`CLIENT_LOG`."""
    return {**props, "logger": CLIENT_LOG}


def log_client_error(what: str, err: _CKError, bootstrap: str) -> None:
    """An error_cb report, throttled: "cannot reach the cluster at <bootstrap>" once per
    window while it lasts, any other error once per window per kind."""
    if err.code() in UNREACHABLE and not err.fatal():
        log.warning(f"{what}: cannot reach the Kafka cluster; the client keeps trying",
                    extra={"bootstrap": bootstrap, "error": err.str(),
                           "throttle": f"unreachable {what} {bootstrap}"})
    else:
        log.warning(f"{what} error", extra={"error": str(err),
                                            "throttle": f"error {what} {err.code()} {same_line(err.str())}"})


def raise_or_log(exc: KafkaException, what: str) -> None:
    """Every librdkafka error that reaches the loop is handled here: a fatal one becomes
    a KafkaError (exit 5, one line), anything else is logged and the loop goes on."""
    err = exc.args[0] if exc.args and isinstance(exc.args[0], _CKError) else None
    if err is not None and err.fatal():
        raise KafkaError(f"fatal Kafka client error during {what}: {err}") from None
    call_log.warning("kafka client call failed; carrying on", extra={
        "call": what, "error": str(exc), "throttle": f"call failed {what} {same_line(str(exc))}"})
