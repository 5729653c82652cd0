"""Apache Kafka itself as a development and test broker: a single KRaft node on loopback.

The reference broker for every guarantee (Tansu, runtime/dev/tansu.py, is the quick
embedded one). Resolved from Maven Central with Maven on first use and cached in
:func:`cache_dir`; each start formats a fresh log dir of its own, removed at stop, so like
Tansu it keeps nothing between runs. Used by ``ringmaster broker --apache-kafka``, the tests
and the benchmarks; never by the daemon itself. Starts processes: the broker's storage format
tool, then the broker (java).
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from runtime.dev import maven
from runtime.dev.certificates import DevCertificates, make_certificates
from runtime.dev.tansu import _die_with_parent, free_port
from runtime.errors import ConfigError, RingmasterError

# The newest 4.x on Maven Central when pinned. Changing it re-resolves into a new cache dir.
KAFKA_VERSION = "4.4.0"
SCALA = "2.13"
LOG4J = "2.25.5"  # the log4j-core that kafka_2.13 depends on

# Heartbeats and session timeouts of the KIP-848 protocol are the broker's: these make a dead
# member go in 6 s. The classic protocol's come from the client, and the broker only bounds
# them (group.min.session.timeout.ms), low enough for tests' 2 s.
FAST_GROUPS: dict[str, str] = {
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "500",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.share.session.timeout.ms": "6000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "100",
}

# Beside Spark's driver on a 24 GiB machine; the tests' traffic needs far less.
HEAP = ["-Xms256m", "-Xmx768m"]


def _artifacts(version: str) -> list[maven.Artifact]:
    """Kafka, and log4j-slf4j-impl: Kafka logs through SLF4J 1.7, which the distribution
    binds to log4j 2 with it."""
    return [maven.Artifact("org.apache.kafka", f"kafka_{SCALA}", version),
            maven.Artifact("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J, scope="runtime")]


_LOG4J = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""

_STARTED = "Kafka Server started"

SCRAM = "SCRAM-SHA-512"
# What StorageTool's --add-scram can carry: its value is "[name=...,password=...]", split on
# commas and "=", with no quoting.
_SCRAM_TEXT = re.compile(r"^[A-Za-z0-9._@+-]{1,128}$")


def parse_scram_user(text: str) -> tuple[str, str]:
    """``USER:PASSWORD`` (``ringmaster broker --sasl-scram``) -> (user, password)."""
    user, sep, password = text.partition(":")
    if not sep or not _SCRAM_TEXT.match(user) or not _SCRAM_TEXT.match(password):
        raise ConfigError("--sasl-scram: expected USER:PASSWORD, each 1-128 of letters, digits and ._@+-")
    return user, password


def secured_properties(port: int, advertised_port: int, controller_port: int, internal_port: int,
                       certs: DevCertificates, host: str = "127.0.0.1") -> dict[str, str]:
    """SASL_SSL with SCRAM-SHA-512 for clients on ``port``; the broker's own traffic (the
    inter-broker listener a KRaft node needs) on a plaintext loopback port: a client learns only
    the addresses of the listener it connected to, so it is never told of that one."""
    return {
        "listeners": (f"SASL_SSL://{host}:{port},INTERNAL://{host}:{internal_port},"
                      f"CONTROLLER://{host}:{controller_port}"),
        "advertised.listeners": f"SASL_SSL://{host}:{advertised_port},INTERNAL://{host}:{internal_port}",
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "sasl.enabled.mechanisms": SCRAM,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs.keystore),
    }


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the broker's jars are kept: ``$XDG_CACHE_HOME/kafka-ringmaster/kafka-VERSION``
    (``~/.cache/...`` without it)."""
    return maven.cache_root() / f"kafka-{version}"


def java() -> str:
    found = shutil.which("java")
    if found is None and os.environ.get("JAVA_HOME"):
        candidate = Path(os.environ["JAVA_HOME"]) / "bin" / "java"
        found = str(candidate) if os.access(candidate, os.X_OK) else None
    if found is None:
        raise RingmasterError("Apache Kafka needs Java 17 or newer and 'java' is not on PATH "
                              "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; or set JAVA_HOME)")
    return found


def resolved(version: str = KAFKA_VERSION) -> bool:
    return maven.resolved(cache_dir(version), _marker(version))


def _marker(version: str) -> str:
    return f"kafka_{SCALA}-{version}.jar"


def resolve(version: str = KAFKA_VERSION) -> Path:
    """The directory of the broker's jars, resolved with Maven the first time
    (runtime/dev/maven.py)."""
    if not resolved(version):
        java()
    return maven.resolve(cache_dir(version), _artifacts(version), _marker(version),
                         f"Apache Kafka {version}")


def cluster_id() -> str:
    """A new KRaft cluster id (the storage tool's format: a UUID in URL-safe base64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def scram_format_arguments(user: tuple[str, str]) -> list[str]:
    """The storage tool's arguments that put a SCRAM credential into the metadata log at format
    time: the broker knows the user from its first start, with no admin call (which would need
    a login itself)."""
    return ["--add-scram", f"{SCRAM}=[name={user[0]},password={user[1]}]"]


def write_config(data: Path, props: Mapping[str, str], log: Path) -> Path:
    """``server.properties`` and the log4j configuration that sends the node's log to ``log``,
    in ``data``; the path of the first."""
    conf = data / "server.properties"
    conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    (data / "log4j2.properties").write_text(_LOG4J.format(path=log))
    return conf


def jvm_command(jvm: str, libs: Path, data: Path, heap: Sequence[str]) -> list[str]:
    """``java`` with the heap, the log4j configuration written in ``data`` and Kafka's jars."""
    return [jvm, *heap, f"-Dlog4j2.configurationFile={data / 'log4j2.properties'}", "-cp", f"{libs}/*"]


def format_log_dir(cmd: Sequence[str], conf: Path, cluster: str, log: Path,
                   extra: Sequence[str] = ()) -> None:
    """Format the KRaft log dir of ``conf`` for cluster ``cluster``, share groups on; its output
    goes to ``log``. RingmasterError with the tool's last error when it fails."""
    since = log.stat().st_size if log.exists() else 0
    with open(log, "ab") as out:
        fmt = subprocess.run(
            # One argument: an id that starts with "-" (1 in 64) is not read as an option.
            [*cmd, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(conf),
             "--feature", "share.version=1", "--ignore-formatted", *extra],
            stdout=out, stderr=subprocess.STDOUT, check=False, preexec_fn=_die_with_parent)
    if fmt.returncode != 0:
        raise RingmasterError(f"formatting the Apache Kafka log dir failed (exit {fmt.returncode}): "
                              f"{_last_error(log, since)}")


def launch(cmd: Sequence[str], conf: Path, log: Path, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """``kafka.Kafka`` over ``conf``, in a session of its own (signals reach the whole JVM as a
    process group), dying with whoever started it; its output appended to ``log``. ``prefix``
    runs it through another command (``ip netns exec NAME``: in a network namespace)."""
    with open(log, "ab") as out:
        return subprocess.Popen([*prefix, *cmd, "kafka.Kafka", str(conf)], stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_die_with_parent)  # one syscall: safe before exec


def wait_started(proc: subprocess.Popen[bytes], log: Path, since: int, host: str, port: int,
                 timeout_s: float, what: str) -> None:
    """Until the node's log (written after byte ``since``) says it started and ``host:port``
    takes connections. RingmasterError when it exits first or ``timeout_s`` passes; the process
    is left as it is (the caller stops it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RingmasterError(f"{what} exited with {proc.returncode} while starting: "
                                  f"{_last_error(log, since)}")
        if _STARTED in _tail(log, since) and _listening(port, host):
            return
        time.sleep(0.2)
    raise RingmasterError(f"{what} did not start in {timeout_s:.0f} s: {_last_error(log, since)}")


def server_properties(port: int, controller_port: int, advertised_port: int, data: Path,
                      overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """One node in combined mode: broker and controller, replication factors of 1, the
    KIP-848 and share-group protocols on, transactions usable with one replica."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{advertised_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data / "logs"),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "8",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "share.coordinator.state.topic.num.partitions": "4",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        **FAST_GROUPS,
    }
    props.update(overrides or {})
    return props


class ApacheKafkaBroker:
    """``with ApacheKafkaBroker() as b: b.bootstrap`` – Apache Kafka on a free loopback port.

    The same interface as :class:`runtime.dev.tansu.DevBroker`. ``overrides`` replace
    server properties (tests shorten the KIP-848 session timeout with them). ``scram`` (user,
    password) makes the listener SASL_SSL with SCRAM-SHA-512 and that one user, its TLS
    certificates made at start in ``tls_dir`` (default: in the log dir); ``ca`` is then the
    certificate clients must trust."""

    def __init__(self, port: int | None = None, log_path: str | os.PathLike[str] | None = None,
                 advertised_port: int | None = None,
                 overrides: Mapping[str, str] | None = None,
                 scram: tuple[str, str] | None = None,
                 tls_dir: str | os.PathLike[str] | None = None) -> None:
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.bootstrap = f"127.0.0.1:{self.advertised_port}"
        self._log_path = Path(log_path) if log_path else None
        self._overrides = dict(overrides or {})
        self.data: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.scram = scram
        self._tls_dir = Path(tls_dir) if tls_dir else None
        self.ca: Path | None = None

    def client_properties(self) -> dict[str, str]:
        """The librdkafka properties a client of this broker needs besides bootstrap.servers."""
        if self.scram is None:
            return {}
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM, "sasl.username": self.scram[0],
                "sasl.password": self.scram[1], "ssl.ca.location": str(self.ca)}

    @property
    def log_path(self) -> Path | None:
        if self._log_path is not None:
            return self._log_path
        return self.data / "server.log" if self.data else None

    def start(self, timeout_s: float = 120.0) -> ApacheKafkaBroker:
        try:
            return self._start(timeout_s)
        except BaseException:
            self.stop()  # Ctrl-C while starting: no JVM and no log dir stay behind
            raise

    def _start(self, timeout_s: float) -> ApacheKafkaBroker:
        libs = resolve()
        jvm = java()
        # Beside the log when there is one (a test's tmp dir: gone with it even when the run is
        # killed before stop()), else in the system's temporary directory.
        self.data = Path(tempfile.mkdtemp(prefix="ringmaster-kafka-",
                                          dir=self._log_path.parent if self._log_path else None))
        log = self.log_path
        assert log is not None
        controller = free_port()
        overrides = dict(self._overrides)
        scram: list[str] = []
        if self.scram is not None:
            certs = make_certificates(self._tls_dir or self.data / "tls")
            self.ca = certs.ca
            secured = secured_properties(self.port, self.advertised_port, controller, free_port(), certs)
            overrides = {**secured, **overrides}
            scram = scram_format_arguments(self.scram)
        props = server_properties(self.port, controller, self.advertised_port, self.data, overrides)
        conf = write_config(self.data, props, log)
        cmd = jvm_command(jvm, libs, self.data, HEAP)
        since = log.stat().st_size if log.exists() else 0  # a log of earlier runs is appended to
        # A failure from here on is cleaned up by start(): the JVM stopped, the log dir removed.
        format_log_dir(cmd, conf, cluster_id(), log, scram)
        self.proc = launch(cmd, conf, log)
        wait_started(self.proc, log, since, "127.0.0.1", self.port, timeout_s, "Apache Kafka")
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (the broker's own orderly shutdown), SIGKILL after ``timeout_s``; then the
        log dir goes."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._cleanup()

    def _cleanup(self) -> None:
        if self.data is not None:
            shutil.rmtree(self.data, ignore_errors=True)
            self.data = None

    def __enter__(self) -> ApacheKafkaBroker:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _tail(path: Path, since: int, size: int = 1 << 20) -> str:
    """The log written after byte ``since`` (at most its last ``size`` bytes)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _last_error(path: Path, since: int) -> str:
    lines = [ln.strip() for ln in _tail(path, since).splitlines() if ln.strip()]
    errors = [ln for ln in lines if " ERROR " in ln or "Exception" in ln]
    return (errors or lines or ["no output"])[-1][:300]


def _listening(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), 0.5):
            return True
    except OSError:
        return False
