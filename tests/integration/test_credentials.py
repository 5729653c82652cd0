"""Credentials and TLS for real: Apache Kafka that admits only SASL/SCRAM-SHA-512 over TLS,
with certificates made here (``ApacheKafkaBroker(scram=...)``, what ``ringmaster broker
--apache-kafka --sasl-scram`` runs). The daemon, the operator commands, ``redrive`` and
``produce``/``tail`` connect with ``[kafka.security]``; a wrong password and an untrusted CA
are one line and exit 14 within seconds and a handful of log lines, not a retry flood; the
password appears nowhere the runtime writes or serves (docs/security.md).

Its own broker, not the session's (which listens in plaintext), whatever
RINGMASTER_TEST_BROKER says."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from helpers import PLUGINS, ROOT, Ringmaster, base_config, to_toml, unique, wait_for

from runtime.dev.certificates import make_certificates
from runtime.dev.kafkabroker import ApacheKafkaBroker
from runtime.dev.tansu import free_port
from runtime.errors import KafkaAccessRefused
from runtime.kafka.admin import ensure_topics

pytestmark = [pytest.mark.integration, pytest.mark.kafka, pytest.mark.timeout(600)]

USER = "alice"
PASSWORD = "pw-" + os.urandom(6).hex()  # found nowhere but where the test put it
REFUSED = KafkaAccessRefused.exit_code


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApacheKafkaBroker]:
    tmp = tmp_path_factory.mktemp("sasl")
    with ApacheKafkaBroker(log_path=tmp / "broker.log", scram=(USER, PASSWORD), tls_dir=tmp / "tls") as b:
        yield b


def security(broker: ApacheKafkaBroker, **over: Any) -> dict[str, Any]:
    return {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": USER,
            "ca_location": str(broker.ca), **over}


def config(broker: ApacheKafkaBroker, tmp: Path, names: dict[str, str], **sec: Any) -> dict[str, Any]:
    c = base_config(broker.bootstrap, names["in"], names["group"], tmp)
    c["kafka"]["security"] = security(broker, **sec)
    c["kafka"]["connect_timeout_s"] = 20.0
    c["output"] = {"topic": names["out"]}
    c["dead_letter"] = {"topic": names["dlq"], "max_attempts": 2, "retry_backoff_s": 0.01}
    c["control"] = {"topic": names["control"]}
    return c


def cli(cfg: Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
        timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """``ringmaster <args> -c cfg`` as an operator types it."""
    full = dict(os.environ, **(env or {}), PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args, "-c", str(cfg)], input=stdin,
                          capture_output=True, text=True, env=full, cwd=ROOT, timeout=timeout_s)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def names() -> dict[str, str]:
    return {k: unique(f"sasl-{k}") for k in ("in", "out", "dlq", "control", "group")}


def test_every_command_connects_with_the_credentials_and_the_password_is_shown_nowhere(
        secure: ApacheKafkaBroker, tmp_path: Path) -> None:
    n = names()
    ensure_topics(secure.bootstrap, [n["in"], n["out"], n["dlq"]], partitions=2,
                  extra=secure.client_properties())
    secret = tmp_path / "kafka-password"
    secret.write_text(PASSWORD + "\n")
    port = free_port()
    cfg = config(secure, tmp_path, n, password_file=str(secret))
    cfg["admin"] = {"listen": f"127.0.0.1:{port}"}
    # The same group's config with the password in the environment instead of a file.
    by_env = tmp_path / "by-env.toml"
    by_env.write_text(to_toml(config(secure, tmp_path, n)))
    env = {"RINGMASTER__KAFKA__SECURITY__PASSWORD": PASSWORD}
    printed: list[str] = []

    def ok(r: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
        printed.append(r.stdout + r.stderr)
        assert r.returncode == 0, r.stderr[-3000:]
        return r

    values = [f"r{i}" for i in range(20)] + ["raise:bad"]
    ok(cli(by_env, "produce", "--topic", n["in"], env=env, stdin="\n".join(values) + "\n"))
    rm = Ringmaster(cfg, tmp_path)
    try:
        dead = ok(cli(rm.config_path, "tail", "--dead-letters", "--max", "1", "--timeout", "90"))
        assert "bad" in dead.stdout
        outs = ok(cli(rm.config_path, "tail", "--max", "20", "--timeout", "90"))
        assert len(outs.stdout.splitlines()) == 20
        ok(cli(by_env, "pause", "--topic", n["in"], "--reason", "credentials test", env=env))
        rm.wait_status(lambda s: s["partitions"] and all("operator" in p["pause_reasons"]
                                                         for p in s["partitions"]), 60, "the operator pause")
        ok(cli(rm.config_path, "resume", "--topic", n["in"]))
        served = get(f"http://127.0.0.1:{port}/status") + get(f"http://127.0.0.1:{port}/metrics")
        assert "ringmaster_records_processed_total" in served
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()
    redriven = ok(cli(rm.config_path, "redrive", "--to-source"))
    assert "redriven 1 to their source topics" in redriven.stdout, redriven.stdout
    printed.append(ok(cli(rm.config_path, "check", "--shallow")).stdout)
    # The control topic's records (the pause and the resume), as the broker keeps them.
    c = Consumer({"bootstrap.servers": secure.bootstrap, "group.id": unique("raw"),
                  **secure.client_properties()})
    records: list[bytes] = []
    try:
        c.assign([TopicPartition(n["control"], 0, OFFSET_BEGINNING)])

        def both() -> bool:
            records.extend((m.key() or b"") + (m.value() or b"") for m in c.consume(100, 0.5)
                           if m.error() is None)
            return len(records) >= 2
        wait_for(both, 60, "the pause and resume records")
    finally:
        c.close()
    written = {"the daemon's log": rm.log_path.read_text(errors="replace"),
               "the status file": rm.status_path.read_text(), "/status and /metrics": served,
               "the commands' output": "\n".join(printed), "control records": repr(records)}
    for where, text in written.items():
        assert text and PASSWORD not in text, f"the password is in {where}"


def test_a_share_group_connects_with_the_credentials(secure: ApacheKafkaBroker, tmp_path: Path) -> None:
    """The share consumer's properties once lacked [kafka.security]: on a cluster that asks for
    credentials, a share-group daemon could not read a record."""
    n = names()
    ensure_topics(secure.bootstrap, [n["in"], n["out"], n["dlq"]], partitions=1,
                  extra=secure.client_properties())
    cfg = config(secure, tmp_path, n)
    cfg["kafka"]["group_type"] = "share"
    cfg["kafka"]["consumer"] = {}  # the test groups' settings are a consumer group's
    cfg["workers"]["ordering"] = "unordered"
    env = {"RINGMASTER__KAFKA__SECURITY__PASSWORD": PASSWORD}
    values = [f"s{i}" for i in range(30)]
    by_env = tmp_path / "share.toml"
    by_env.write_text(to_toml(cfg))
    produced = cli(by_env, "produce", "--topic", n["in"], env=env, stdin="\n".join(values) + "\n")
    assert produced.returncode == 0, produced.stderr[-3000:]
    rm = Ringmaster(cfg, tmp_path, env=env)
    try:
        rm.wait_status(lambda s: ((s.get("share") or {}).get("accepted") or 0) >= len(values), 120,
                       "every record accepted by the share group")
        outs = cli(by_env, "tail", "--max", str(len(values)), "--timeout", "90", env=env)
        assert outs.returncode == 0 and len(outs.stdout.splitlines()) == len(values), outs.stderr[-3000:]
        assert rm.terminate() == 0, rm.log_tail()
    finally:
        rm.close()


@pytest.mark.parametrize("what", ["wrong password", "untrusted CA", "mechanism the broker lacks"])
def test_a_refused_login_is_one_line_and_exit_14_not_a_retry_flood(secure: ApacheKafkaBroker, tmp_path: Path,
                                                                  what: str) -> None:
    n = names()
    if what == "wrong password":
        cfg, says = config(secure, tmp_path, n, password="not-" + PASSWORD), "refused the credentials"
    elif what == "mechanism the broker lacks":
        cfg, says = config(secure, tmp_path, n, password=PASSWORD, sasl_mechanism="SCRAM-SHA-256"), "refused"
    else:
        other = make_certificates(tmp_path / "other-ca")
        cfg = config(secure, tmp_path, n, password=PASSWORD, ca_location=str(other.ca))
        says = "is not trusted"
    path = tmp_path / "c.toml"
    path.write_text(to_toml({**cfg, "supervisor": {**cfg["supervisor"], "control_socket": ""}}))
    commands = [["run", "--no-progress"], ["pause", "--topic", n["in"]], ["produce", "--topic", n["in"]],
                ["tail", "--topic", n["in"]], ["redrive"]]
    if importlib.util.find_spec("pyspark") is not None:  # refused before a JVM starts: no Java needed
        commands += [["spark", "run", "--until-caught-up"], ["spark", "backfill", "--parquet", str(tmp_path)]]
    for args in commands:
        # The bound is the subprocess timeout: a command that retried the login would run on.
        r = cli(path, *args, stdin="x\n", timeout_s=60)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ringmaster: error:")]
        assert r.returncode == REFUSED, (args, r.returncode, r.stderr[-3000:])
        assert len(errors) == 1 and says in errors[0] and "kafka.security" in errors[0], r.stderr
        assert len(r.stderr.splitlines()) <= 6, f"{args}: a flood of lines:\n{r.stderr}"
        assert PASSWORD not in r.stdout + r.stderr


@pytest.mark.spark
def test_spark_reads_and_writes_with_the_credentials(secure: ApacheKafkaBroker, tmp_path: Path) -> None:
    n = names()
    ensure_topics(secure.bootstrap, [n["in"], n["out"], n["dlq"]], partitions=2,
                  extra=secure.client_properties())
    cfg = config(secure, tmp_path, n)
    cfg["spark"] = {"master": "local[2]", "checkpoint_location": str(tmp_path / "checkpoint")}
    path = tmp_path / "spark.toml"
    path.write_text(to_toml(cfg))
    env = {"RINGMASTER__KAFKA__SECURITY__PASSWORD": PASSWORD}
    assert cli(path, "produce", "--topic", n["in"], env=env,
               stdin="".join(f"r{i}\n" for i in range(16))).returncode == 0
    r = cli(path, "spark", "run", "--until-caught-up", env=env, timeout_s=400)
    assert r.returncode == 0 and "spark run: 16 record(s) in" in r.stderr, r.stderr[-4000:]
    assert PASSWORD not in r.stdout + r.stderr
    outs = cli(path, "tail", "--max", "16", "--timeout", "60", env=env)
    assert len(outs.stdout.splitlines()) == 16, outs.stderr


def test_the_broker_command_prints_the_settings_a_client_connects_with(tmp_path: Path) -> None:
    port = free_port()
    tls = tmp_path / "tls"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "broker", "--apache-kafka", "--port", str(port),
         "--sasl-scram", f"{USER}:{PASSWORD}", "--tls-dir", str(tls)],
        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stderr is not None
        banner = ""
        while "password_file" not in banner:
            line = proc.stderr.readline()
            assert line, f"the broker stopped: {banner}"
            banner += line
        assert f'username = "{USER}"' in banner and f'ca_location = "{tls / "ca.pem"}"' in banner
        assert PASSWORD not in banner
        n = names()
        cfg = config(ApacheKafkaBroker(port, scram=(USER, PASSWORD)), tmp_path, n, password=PASSWORD)
        cfg["kafka"]["security"]["ca_location"] = str(tls / "ca.pem")
        path = tmp_path / "c.toml"
        path.write_text(to_toml(cfg))
        assert cli(path, "produce", "--topic", n["in"], stdin="one\n").returncode == 0
        assert cli(path, "tail", "--topic", n["in"], "--max", "1", "--timeout", "60").stdout == "one\n"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
