from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runtime.config import is_secret_key, librdkafka_int, load_settings, redacted
from runtime.errors import ConfigError, PluginError
from runtime.kafka.properties import consumer_properties, effective_settings

GOOD = """
[kafka]
bootstrap_servers = "127.0.0.1:1"
group_id = "g"
topics = ["in"]
[kafka.consumer]
"sasl.password" = "hunter2"
[workers]
plugin = "workers.fingerprint"
processes = 2
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_good_config_and_defaults(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD), env={})
    assert s.workers.processes == 2
    assert s.workers.pause_above > s.workers.resume_below
    props = consumer_properties(s)
    assert props["enable.auto.commit"] is False
    assert props["partition.assignment.strategy"] == "cooperative-sticky"


def test_env_overrides(tmp_path: Path) -> None:
    env = {"RINGMASTER__WORKERS__PROCESSES": "5",
           "RINGMASTER__KAFKA__CONSUMER__FETCH_MAX_BYTES": "1048576",
           "RINGMASTER__OUTPUT__TOPIC": "out"}
    s = load_settings(write(tmp_path, GOOD), env=env)
    assert s.workers.processes == 5
    # librdkafka parses its own properties: the string is passed through as given
    assert s.kafka.consumer["fetch.max.bytes"] == "1048576"
    assert s.output.topic == "out"


@pytest.mark.parametrize("value", ["0x1F", "1_000", "007", "true", "1e3", "[a]", '"quoted"', "a = b"])
@pytest.mark.parametrize("var", ["RINGMASTER__SUPERVISOR__STATUS_FILE", "RINGMASTER__KAFKA__GROUP_ID",
                                 "RINGMASTER__KAFKA__PRODUCER__SASL_PASSWORD"])
def test_env_override_of_a_string_key_keeps_the_exact_string(tmp_path: Path, var: str, value: str) -> None:
    s = load_settings(write(tmp_path, GOOD), env={var: value})
    got = {"RINGMASTER__SUPERVISOR__STATUS_FILE": s.supervisor.status_file,
           "RINGMASTER__KAFKA__GROUP_ID": s.kafka.group_id,
           "RINGMASTER__KAFKA__PRODUCER__SASL_PASSWORD": s.kafka.producer.get("sasl.password")}[var]
    assert got == value


@pytest.mark.parametrize("value", ['["a", "b"]', "a,b", " a , b "])
def test_env_override_of_a_list_takes_a_toml_array_or_commas(tmp_path: Path, value: str) -> None:
    s = load_settings(write(tmp_path, GOOD), env={"RINGMASTER__KAFKA__TOPICS": value})
    assert s.kafka.topics == ["a", "b"]


def test_env_override_of_a_list_with_a_broken_array_names_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="RINGMASTER__KAFKA__TOPICS: expected a TOML array") as info:
        load_settings(write(tmp_path, GOOD), env={"RINGMASTER__KAFKA__TOPICS": '["a", '})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("var", "value", "needle"), [
    ("RINGMASTER__WORKERS__PROCESSES", "abc", "workers.processes: Input should be a valid integer"),
    ("RINGMASTER__WORKERS__PAUSE_ABOVE", "high", "workers.pause_above"),
    ("RINGMASTER__SUPERVISOR__STOP_WHEN_CAUGHT_UP", "maybe", "supervisor.stop_when_caught_up"),
])
def test_bad_env_override_is_one_line_naming_the_key(tmp_path: Path, var: str, value: str,
                                                      needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, GOOD), env={var: value})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


def test_env_overrides_of_numbers_and_booleans_are_validated_from_text(tmp_path: Path) -> None:
    env = {"RINGMASTER__WORKERS__PAUSE_ABOVE": "0.9",
           "RINGMASTER__SUPERVISOR__STOP_WHEN_CAUGHT_UP": "true",
           "RINGMASTER__DEAD_LETTER__MAX_ATTEMPTS": "7",
           "RINGMASTER__SPARK__CONF__SPARK_EXECUTOR_MEMORY": "2g"}
    s = load_settings(write(tmp_path, GOOD), env=env)
    assert s.workers.pause_above == 0.9
    assert s.supervisor.stop_when_caught_up is True
    assert s.dead_letter.max_attempts == 7
    assert s.spark.conf == {"spark.executor.memory": "2g"}


def test_plugin_settings_from_the_environment_are_toml_when_they_parse(tmp_path: Path) -> None:
    env = {"RINGMASTER__WORKERS__SETTINGS__THRESHOLD": "0.8",
           "RINGMASTER__WORKERS__SETTINGS__TOKEN": '"0x1F"',  # quoted: a string
           "RINGMASTER__WORKERS__SETTINGS__MODE": "fast",
           "RINGMASTER__WORKERS__SETTINGS__RAW": "0x1F"}
    s = load_settings(write(tmp_path, GOOD), env=env)
    assert s.workers.settings == {"threshold": 0.8, "token": "0x1F", "mode": "fast", "raw": 31}


@pytest.mark.parametrize(("value", "expected"), [(1048576, 1048576), ("1048576", 1048576), (" 42 ", 42),
                                                 (None, 7)])
def test_librdkafka_int_takes_an_int_or_its_string(value: object, expected: int) -> None:
    props = {} if value is None else {"message.max.bytes": value}
    assert librdkafka_int(props, "message.max.bytes", 7) == expected


@pytest.mark.parametrize("value", ["1_000", "0x10", "1e6", "", True, 1.5])
def test_librdkafka_int_rejects_what_librdkafka_would(value: object) -> None:
    with pytest.raises(ConfigError, match=r"message\.max\.bytes: expected an integer"):
        librdkafka_int({"message.max.bytes": value}, "message.max.bytes", 7)


def test_secrets_are_redacted(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD), env={})
    assert redacted(effective_settings(s))["kafka"]["consumer"]["sasl.password"] == "***"
    assert "hunter2" not in str(redacted(effective_settings(s)))


SECRETS = [
    # librdkafka (CONFIGURATION.md)
    "sasl.password", "ssl.key.password", "ssl.key.pem", "ssl_key", "ssl.keystore.password",
    "sasl.oauthbearer.config", "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.assertion.private.key.passphrase", "sasl.oauthbearer.assertion.private.key.pem",
    # Java clients, schema registry, Spark/Hadoop conf
    "sasl.jaas.config", "ssl.keystore.key", "ssl.truststore.password", "basic.auth.user.info",
    "schema.registry.basic.auth.user.info", "spark.hadoop.fs.s3a.access.key",
    "spark.hadoop.fs.s3a.secret.key", "spark.hadoop.fs.s3a.session.token",
    "spark.hadoop.fs.azure.account.key.acct.blob.core.windows.net", "spark.authenticate.secret",
    "spark.ssl.keyPassword",
    # plugin settings
    "password", "db_password", "secret", "client_secret", "token", "auth_token", "accessToken",
    "api_key", "apikey", "API-Key", "credential", "credentials", "passphrase", "private_key",
    "privateKey", "aws_access_key_id",
]
NOT_SECRETS = [
    "ssl.key.location", "ssl.keystore.location", "ssl.certificate.location", "ssl.ca.location",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.assertion.jwt.template.file",
    "sasl.oauthbearer.assertion.file", "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.client.id", "sasl.oauthbearer.client.credentials.client.id", "sasl.username",
    "sasl.kerberos.keytab", "sasl.mechanisms", "security.protocol", "api.version.request",
    "ssl.endpoint.identification.algorithm", "fetch.max.bytes", "model_path", "tokenizer",
    "max_tokens", "threshold", "private_key_file",
]


@pytest.mark.parametrize("key", SECRETS)
def test_secret_keys_are_redacted(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize("key", NOT_SECRETS)
def test_paths_ids_and_plain_settings_stay_visible(key: str) -> None:
    assert not is_secret_key(key)


def test_redacted_hides_secrets_in_every_section(tmp_path: Path) -> None:
    text = GOOD + """[workers.settings]
api_key = "k-123"
model_path = "/m"
[workers.settings.db]
password = "p-456"
[spark.conf]
"spark.hadoop.fs.s3a.secret.key" = "s-789"
"""
    text = text.replace('"sasl.password" = "hunter2"', '"sasl.password" = "hunter2"\n'
                        '"sasl.oauthbearer.assertion.private.key.passphrase" = "pp-0"\n'
                        '"ssl.key.location" = "/etc/key.pem"')
    out = redacted(effective_settings(load_settings(write(tmp_path, text), env={})))
    for leaked in ("hunter2", "pp-0", "k-123", "p-456", "s-789"):
        assert leaked not in str(out)
    assert out["kafka"]["consumer"]["ssl.key.location"] == "/etc/key.pem"
    assert out["workers"]["settings"]["model_path"] == "/m"


@pytest.mark.parametrize(("text", "needle"), [
    (GOOD.replace('group_id = "g"\n', ""), "kafka.group_id: required key is missing"),
    (GOOD.replace("processes = 2", 'processes = "two"'), "workers.processes"),
    (GOOD + "colour = 'blue'\n", "workers.colour: unknown key"),
    (GOOD.replace('"workers.fingerprint"', '"no.such.module"'), "cannot import 'no.such.module'"),
    ("this is [not toml", "is not valid TOML"),
    (GOOD.replace("processes = 2", "processes = 2\npause_above = 0.3\nresume_below = 0.5"), "hysteresis"),
    (GOOD.replace('"sasl.password" = "hunter2"', '"enable.auto.commit" = true'), "managed by ringmaster"),
    (GOOD + '[admin]\nlisten = "0.0.0.0:9464"\n', "admin.listen: 0.0.0.0 is not loopback"),
    (GOOD + '[admin]\nlisten = "host:port"\n', "admin.listen: 'host:port' is not HOST:PORT"),
    (GOOD.replace("processes = 2", "processes = 2\nmax_processes = 1"),
     "workers: max_processes (1) must be at least processes (2)"),
    # A configured topic no broker accepts would fail every record alike (issue 29): refused at start.
    (GOOD + '[output]\ntopic = "no such topic!"\n', "output.topic: String should match pattern"),
    (GOOD + f'[dead_letter]\ntopic = "{"t" * 250}"\n', "dead_letter.topic: String should match pattern"),
])
def test_bad_config_names_the_problem(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises((ConfigError, PluginError)) as info:
        load_settings(write(tmp_path, text), env={})
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", [
    GOOD.replace('topics = ["in"]\n', ""),
    GOOD.replace('"workers.fingerprint"', '"workers.nope"'),
    "[kafka\n",
])
def test_cli_bad_config_one_line_nonzero_exit_before_kafka(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "-c", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ringmaster: error: ")
    assert "Traceback" not in r.stderr
    assert time.monotonic() - t0 < 30  # the broker 127.0.0.1:1 was never contacted


def _topics(topics: str, extra: str = "") -> str:
    return GOOD.replace('topics = ["in"]', f"topics = {topics}") + extra


@pytest.mark.parametrize(("text", "needles"), [
    (_topics('["in", "other"]', '[output]\ntopic = "in"\n'), ["output.topic 'in' is also an input topic"]),
    (_topics('["in"]', '[dead_letter]\ntopic = "in"\n'), ["dead_letter.topic 'in' is also an input topic"]),
    (_topics('["^rx\\\\..*"]', '[output]\ntopic = "rx.out"\n[dead_letter]\ntopic = "rx.dlq"\n'),
     ["output.topic 'rx.out' matches the subscription pattern '^rx\\..*'",
      "dead_letter.topic 'rx.dlq' matches the subscription pattern"]),
    (_topics('["^.*"]'), ["the control topic '_ringmaster.control.g'",
                          "matches the subscription pattern '^.*'",
                          "the status topic '_ringmaster.status.g' (control.status_topic) matches"]),
    (_topics('["in", "st"]', '[control]\nstatus_topic = "st"\n'), ["the status topic 'st'"]),
    (_topics('["^_ringmaster"]'), ["the control topic '_ringmaster.control.g'"]),
    (_topics('["in", "ctl"]', '[control]\ntopic = "ctl"\n'), ["the control topic 'ctl' ([control] topic) is "
                                                               "also an input topic"]),
    (_topics('["in"]', '[output]\ntopic = "o"\n[dead_letter]\ntopic = "o"\n'),
     ["dead_letter.topic is output.topic ('o')"]),
    (_topics('["^rx.[*"]'), ["kafka.topics: '^rx.[*' is not a valid regular expression"]),
])
def test_a_config_that_feeds_the_daemon_its_own_writes_is_refused(tmp_path: Path, text: str,
                                                                  needles: list[str]) -> None:
    """Issue 17.7: an output, dead-letter or control topic the subscription takes in."""
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    for needle in needles:
        assert needle in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", [
    _topics('["^rx\\\\.in.*"]', '[output]\ntopic = "rx.out"\n[dead_letter]\ntopic = "rx.dlq"\n'),
    _topics('["^.*"]', '[control]\nenabled = false\nstatus_interval_s = 0\n'),
    _topics('["in"]', '[output]\ntopic = "in.out"\n[dead_letter]\ntopic = "in.dlq"\n'),
    _topics('["^in$"]', '[output]\ntopic = "in2"\n'),
])
def test_outputs_outside_the_subscription_are_fine(tmp_path: Path, text: str) -> None:
    load_settings(write(tmp_path, text), env={})


def test_a_loop_through_an_environment_override_is_refused_too(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"output\.topic 'in' is also an input topic"):
        load_settings(write(tmp_path, GOOD), env={"RINGMASTER__OUTPUT__TOPIC": "in"})


@pytest.mark.parametrize("command", ["check", "run"])
def test_cli_refuses_a_loop_in_one_line_before_kafka(tmp_path: Path, command: str) -> None:
    path = write(tmp_path, _topics('["^rx\\\\..*"]', '[output]\ntopic = "rx.out"\n'))
    r = subprocess.run([sys.executable, "-m", "runtime.cli", command, "-c", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "ringmaster: error: output.topic 'rx.out' matches the subscription pattern '^rx\\..*' "
        "(kafka.topics): the daemon would consume its own outputs forever; write them to a topic the "
        "group does not read, or narrow the pattern"]


def test_cli_check_prints_effective_config_redacted(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", "-c", str(write(tmp_path, GOOD))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert '"sasl.password": "***"' in r.stdout and "hunter2" not in r.stdout


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", env={})


def test_a_plugin_next_to_where_ringmaster_runs_is_found_like_gunicorn(tmp_path: Path) -> None:
    """Issue 9.12: the console script's sys.path[0] is its own bin directory, not the
    current one; `ringmaster` puts the current directory first, as gunicorn does."""
    (tmp_path / "localplugin.py").write_text("def process(batch):\n    return None\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(GOOD.replace('"workers.fingerprint"', '"localplugin"'))
    script = Path(sys.executable).with_name("ringmaster")
    ok = subprocess.run([str(script), "check", "-c", str(cfg)], capture_output=True, text=True, timeout=60,
                        cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    cfg.write_text(GOOD.replace('"workers.fingerprint"', '"missingplugin"'))
    bad = subprocess.run([str(script), "check", "-c", str(cfg)], capture_output=True, text=True, timeout=60,
                         cwd=tmp_path)
    assert bad.returncode == 3 and "current directory" in bad.stderr and len(bad.stderr.splitlines()) == 1


@pytest.mark.parametrize(("section", "prop", "needle"), [
    ("kafka.consumer", '"fetch.wait.max.msec" = 10', "kafka.consumer: No such configuration property"),
    ("kafka.producer", '"linger.ms" = "soon"', "kafka.producer: "),
])
def test_a_librdkafka_property_librdkafka_refuses_is_a_config_error_before_kafka(
        tmp_path: Path, section: str, prop: str, needle: str) -> None:
    text = GOOD.replace('[kafka.consumer]\n"sasl.password" = "hunter2"\n', "") + f"[{section}]\n{prop}\n"
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", "-c", str(write(tmp_path, text))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize(("text", "env", "needle"), [
    (GOOD.replace("processes = 2", "proceses = 2"), {},
     "workers.proceses: unknown key (did you mean processes?)"),
    (GOOD.replace("[workers]", "[worker]"), {}, "worker: unknown key (did you mean workers?)"),
    (GOOD + "[supervisor]\nstatus_fil = 'x'\n", {}, "did you mean status_file?"),
    (GOOD, {"RINGMASTER__WORKERS__BATCH_MAX_RECORD": "5"},
     "workers.batch_max_record: unknown key (did you mean batch_max_records?) (set by "
     "RINGMASTER__WORKERS__BATCH_MAX_RECORD)"),
    (GOOD + "[admin]\nzzz = 1\n", {}, "admin.zzz: unknown key (admin: listen, allow_remote,"),
])
def test_an_unknown_key_gets_the_nearest_known_one_or_the_list(tmp_path: Path, text: str, env: dict[str, str],
                                                              needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env=env)
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("plugin", "needle"), [
    ("scorer.py", "workers.plugin: 'scorer.py' is a file name; use the module name 'scorer'"),
    ("plugins/scorer.py", "use the module name 'scorer', with 'plugins' on the import path"),
    ("./scorer.py", "use the module name 'scorer'"),
    ("mypkg/scorer", "use the module name 'scorer', with 'mypkg' on the import path"),
])
def test_a_file_name_where_the_module_belongs_is_one_line_naming_the_module(
        tmp_path: Path, plugin: str, needle: str) -> None:
    (tmp_path / "scorer.py").write_text("def process(batch):\n    return None\n")
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, GOOD.replace('"workers.fingerprint"', f'"{plugin}"')), env={})
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("env", [{}, {"RINGMASTER__KAFKA__CONSUMER__GROUP_PROTOCOL": "consumer"}])
def test_the_kip848_consumer_protocol_gets_no_client_side_assignor(
        tmp_path: Path, env: dict[str, str]) -> None:
    """librdkafka refuses partition.assignment.strategy under group.protocol = "consumer":
    the default cooperative-sticky is the classic protocol's only."""
    text = GOOD if env else GOOD.replace('"sasl.password" = "hunter2"', '"group.protocol" = "consumer"')
    props = consumer_properties(load_settings(write(tmp_path, text), env=env))
    assert props["group.protocol"] == "consumer"
    assert not {"partition.assignment.strategy", "session.timeout.ms", "heartbeat.interval.ms"} & props.keys()
    classic = GOOD.replace('"sasl.password" = "hunter2"', '"group.protocol" = "classic"')
    props = consumer_properties(load_settings(write(tmp_path, classic), env={}))
    assert props["partition.assignment.strategy"] == "cooperative-sticky"


@pytest.mark.parametrize(("key", "owner"), [
    ("session.timeout.ms", "group.consumer.session.timeout.ms"),
    ("heartbeat.interval.ms", "group.consumer.heartbeat.interval.ms"),
    ("partition.assignment.strategy", "group.remote.assignor"),
])
def test_a_client_side_group_setting_under_kip848_is_one_line_naming_the_brokers(
        tmp_path: Path, key: str, owner: str) -> None:
    text = GOOD.replace('"sasl.password" = "hunter2"', f'"group.protocol" = "consumer"\n"{key}" = "1"')
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    msg = str(info.value)
    assert f"remove {key}" in msg and owner in msg and "\n" not in msg


def test_an_unknown_group_protocol_is_one_line(tmp_path: Path) -> None:
    text = GOOD.replace('"sasl.password" = "hunter2"', '"group.protocol" = "streams"')
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, text), env={})
    assert 'expected "classic" or "consumer"' in str(info.value) and "\n" not in str(info.value)


def test_check_shows_the_librdkafka_properties_the_clients_really_get(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "check", "--shallow", "-c",
                        str(write(tmp_path, GOOD))], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    effective = json.loads(r.stdout)
    consumer, producer = effective["kafka"]["consumer"], effective["kafka"]["producer"]
    assert consumer["fetch.queue.backoff.ms"] == 10 and consumer["fetch.wait.max.ms"] == 100
    assert consumer["partition.assignment.strategy"] == "cooperative-sticky"
    assert consumer["enable.auto.commit"] is False and consumer["group.id"] == "g"
    assert consumer["sasl.password"] == "***" and "hunter2" not in r.stdout
    assert producer["enable.idempotence"] is True and producer["message.timeout.ms"] == 30000
