"""[kafka.security]: one place for credentials and TLS, mapped onto every Kafka client the
runtime makes, the password kept out of everything it prints (docs/security.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import KafkaError as CKError

from runtime.config import load_settings, redacted
from runtime.errors import ConfigError
from runtime.kafka.admin import admin_properties
from runtime.kafka.client_log import refused_access
from runtime.kafka.properties import (
    consumer_properties,
    effective_settings,
    producer_properties,
    share_consumer_properties,
)

PASSWORD = "pw-9f3a-secret"


def config(tmp_path: Path, security: str, consumer: str = "") -> Path:
    ca = tmp_path / "ca.pem"
    ca.write_text("not read by these tests\n")
    p = tmp_path / "c.toml"
    p.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["in"]\n'
                 f"[kafka.consumer]\n{consumer}\n"
                 f'[kafka.security]\nca_location = "{ca}"\n{security}\n'
                 '[workers]\nplugin = "workers.fingerprint"\nprocesses = 1\n'
                 '[output]\ntopic = "out"\n[dead_letter]\ntopic = "dlq"\n')
    return p


SCRAM = 'protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\nusername = "alice"\n'


def test_the_section_sets_the_same_properties_in_every_client(tmp_path: Path) -> None:
    s = load_settings(config(tmp_path, SCRAM), env={"RINGMASTER__KAFKA__SECURITY__PASSWORD": PASSWORD},
                      check_plugin=False)
    want = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice",
            "sasl.password": PASSWORD, "ssl.ca.location": str(tmp_path / "ca.pem")}
    # The share consumer was missing from this list, and so were its credentials.
    for props in (consumer_properties(s), producer_properties(s), admin_properties(consumer_properties(s)),
                  share_consumer_properties(s)):
        assert {k: props.get(k) for k in want} == want


def test_the_password_can_come_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text(PASSWORD + "\n")
    s = load_settings(config(tmp_path, SCRAM + f'password_file = "{secret}"'), env={}, check_plugin=False)
    assert producer_properties(s)["sasl.password"] == PASSWORD
    with pytest.raises(ConfigError, match=r"kafka\.security\.password_file: '.*missing' cannot be read"):
        load_settings(config(tmp_path, SCRAM + f'password_file = "{tmp_path / "missing"}"'), env={},
                      check_plugin=False)


@pytest.mark.parametrize(("security", "consumer", "problem"), [
    (SCRAM, "", "username and a password"),
    ('username = "alice"\npassword = "x"\n', "", "a username needs protocol"),
    ('protocol = "SASL_SSL"\n', "", "needs sasl_mechanism"),
    (SCRAM + 'password = "x"\npassword_file = "/x"\n', "", "not both"),
    ('protocol = "SSL"\n', '"security.protocol" = "SSL"', "kafka.consumer sets security.protocol"),
    ('protocol = "SSL"\nca_location = "/nowhere/ca.pem"\n', "", "is not a file"),
])
def test_inconsistent_settings_are_one_line_naming_the_key(tmp_path: Path, security: str, consumer: str,
                                                           problem: str) -> None:
    path = config(tmp_path, security.replace('"/x"', f'"{tmp_path / "ca.pem"}"'), consumer)
    if "/nowhere" in security:  # ca_location given twice in one table is not TOML: drop ours
        path.write_text(path.read_text().replace(f'ca_location = "{tmp_path / "ca.pem"}"\n', ""))
    with pytest.raises(ConfigError, match="kafka") as err:
        load_settings(path, env={}, check_plugin=False)
    assert problem in str(err.value) and "\n" not in str(err.value)


def test_the_password_is_in_no_printed_form_of_the_settings(tmp_path: Path) -> None:
    s = load_settings(config(tmp_path, SCRAM + f'password = "{PASSWORD}"'), env={}, check_plugin=False)
    assert PASSWORD not in json.dumps(redacted(effective_settings(s)))  # what `ringmaster check` prints
    assert PASSWORD not in repr(s) and PASSWORD not in str(s.kafka.security)
    assert redacted(effective_settings(s))["kafka"]["consumer"]["sasl.password"] == "***"


def test_a_bad_password_file_from_the_environment_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RINGMASTER__KAFKA__SECURITY__PASSWORD_FILE"):
        load_settings(config(tmp_path, SCRAM), env={"RINGMASTER__KAFKA__SECURITY__PASSWORD_FILE": "/nope"},
                      check_plugin=False)


def test_spark_gets_the_same_properties(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from runtime.spark.job import SPARK_REDACTION, sink_options, source_options

    s = load_settings(config(tmp_path, SCRAM + f'password = "{PASSWORD}"'), env={}, check_plugin=False)
    s = s.model_copy(update={"control": s.control.model_copy(update={"enabled": False})})
    source = json.loads(source_options(s)["kafka"])
    sink = json.loads(sink_options(s)["kafka_producer"])
    for props in (source, sink):
        assert props["sasl.username"] == "alice" and props["sasl.password"] == PASSWORD
        assert props["security.protocol"] == "SASL_SSL"
    # Spark redacts an option whose name or value matches: the JSON carrying the password does.
    import re
    assert re.search(SPARK_REDACTION, source_options(s)["kafka"])


@pytest.mark.parametrize(("code", "text", "says"), [
    (CKError._AUTHENTICATION, "sasl_ssl://127.0.0.1:9/bootstrap: SASL authentication error: Authentication "
     "failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512 "
     "(after 320ms in state AUTH_REQ)", "refused the credentials"),
    (CKError._SSL, "sasl_ssl://127.0.0.1:9/bootstrap: SSL handshake failed: error:0A000086:SSL routines::"
     "certificate verify failed (after 17ms in state SSL_HANDSHAKE)", "is not trusted"),
])
def test_a_refused_login_or_handshake_is_one_line_naming_the_settings(code: int, text: str,
                                                                      says: str) -> None:
    line = refused_access(CKError(code, text), "127.0.0.1:9")
    assert line is not None and says in line and "kafka.security" in line and "\n" not in line
    assert "after" not in line  # the varying part of librdkafka's text is left out
    assert refused_access(CKError(CKError._TRANSPORT, "Connection refused"), "127.0.0.1:9") is None


def test_librdkafka_debug_lines_we_forward_never_carry_the_password(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Even with every debug context on, librdkafka prints the configuration with the
    password redacted; the lines reach the structured log through CLIENT_LOG."""
    import logging
    import time

    from confluent_kafka import Producer

    from runtime.kafka.client_log import with_logger

    plaintext = SCRAM.replace("SASL_SSL", "SASL_PLAINTEXT")  # no TLS context: the CA file is not read
    s = load_settings(config(tmp_path, plaintext + f'password = "{PASSWORD}"'), env={}, check_plugin=False)
    with caplog.at_level(logging.DEBUG, logger="ringmaster.kafka.client"):
        p = Producer(with_logger({**producer_properties(s), "debug": "all"}))
        deadline = time.monotonic() + 30
        while "sasl.password = [redacted]" not in caplog.text and time.monotonic() < deadline:
            p.poll(0.1)
        p.flush(0)
    assert "sasl.password = [redacted]" in caplog.text
    assert PASSWORD not in caplog.text


@pytest.mark.parametrize("args", [["--sasl-scram", "alice:pw"], ["--apache-kafka", "--sasl-scram", "alice"],
                                  ["--apache-kafka", "--sasl-scram", "alice:pw,x=y"],
                                  ["--apache-kafka", "--tls-dir", "/tmp/x"]])
def test_the_broker_command_refuses_a_bad_scram_option_before_starting_anything(args: list[str]) -> None:
    from click.testing import CliRunner

    from runtime.cli import main

    result = CliRunner().invoke(main, ["broker", "--port", "1", *args])
    assert result.exit_code == 2 and result.output.count("ringmaster: error:") == 1, result.output
