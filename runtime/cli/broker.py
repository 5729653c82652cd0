"""``ringmaster broker``: a development broker in the foreground, the embedded Tansu or a
single-node Apache Kafka (runtime/dev/tansu.py, kafkabroker.py)."""

from __future__ import annotations

import signal
import sys

import click

from runtime.cli.outcome import fail
from runtime.errors import ConfigError, RingmasterError


@click.command()
@click.option("--port", type=int, default=9092, show_default=True)
@click.option("--apache-kafka", "apache_kafka", is_flag=True,
              help="Run Apache Kafka itself (one KRaft node; Java 17+, resolved with Maven on first "
                   "use) instead of the embedded Tansu.")
@click.option("--sasl-scram", "sasl_scram", default=None, metavar="USER:PASSWORD",
              help="With --apache-kafka: clients must log in with SCRAM-SHA-512 as this user over TLS "
                   "(SASL_SSL), with certificates made at start; prints the [kafka.security] to use.")
@click.option("--tls-dir", "tls_dir", type=click.Path(file_okay=False), default=None,
              help="With --sasl-scram: where the CA (ca.pem) and the broker's keystore are written "
                   "(default: in the broker's log dir, gone at stop).")
def broker(port: int, apache_kafka: bool, sasl_scram: str | None, tls_dir: str | None) -> None:
    """Run a development broker in the foreground: the embedded Tansu (memory-only), or with
    --apache-kafka a single-node Apache Kafka with a log dir removed at stop."""
    import time

    from runtime.dev.kafkabroker import (
        KAFKA_VERSION,
        ApacheKafkaBroker,
        cache_dir,
        parse_scram_user,
        resolved,
    )
    from runtime.dev.tansu import FAST_JOIN, DevBroker

    # RACE: the handler goes in before the banner, which is what tells a caller it may stop us.
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    b: DevBroker | ApacheKafkaBroker
    try:
        if (sasl_scram or tls_dir) and not apache_kafka:
            raise ConfigError("--sasl-scram and --tls-dir need --apache-kafka")
        if tls_dir and not sasl_scram:
            raise ConfigError("--tls-dir needs --sasl-scram")
        scram = parse_scram_user(sasl_scram) if sasl_scram else None
        if apache_kafka:
            if not resolved():
                click.echo(f"resolving Apache Kafka {KAFKA_VERSION} with Maven into {cache_dir()} "
                           "(first run only)", err=True)
            b = ApacheKafkaBroker(port, scram=scram, tls_dir=tls_dir).start()
        else:
            b = DevBroker(port).start()
    except RingmasterError as exc:
        fail(exc)
        return
    except KeyboardInterrupt:
        sys.exit(130)
    if apache_kafka:
        click.echo(f"Apache Kafka {KAFKA_VERSION} listening on {b.bootstrap} (one KRaft node; its log "
                   f"dir goes at stop; Ctrl-C stops it)\n"
                   f"Transactions, the consumer group protocol (KIP-848: group.protocol = \"consumer\") "
                   f"and share groups are on.", err=True)
        if scram is not None:
            assert isinstance(b, ApacheKafkaBroker)
            click.echo(f"Clients log in over TLS (SASL_SSL, SCRAM-SHA-512). In the config of what you run "
                       f"against it:\n[kafka.security]\nprotocol = \"SASL_SSL\"\n"
                       f"sasl_mechanism = \"SCRAM-SHA-512\"\nusername = \"{scram[0]}\"\n"
                       f"ca_location = \"{b.ca}\"\n"
                       "# and the password: RINGMASTER__KAFKA__SECURITY__PASSWORD, or password_file",
                       err=True)
    else:
        fast = "\n".join(f'  "{k}" = {v}' for k, v in FAST_JOIN.items())
        click.echo(f"embedded broker listening on {b.bootstrap} (memory-only; Ctrl-C stops it)\n"
                   f"It forms a consumer group in about session.timeout.ms / 2: "
                   f"22 s with librdkafka's default.\n"
                   f"For joins in about 3 s, put in the config of what you run against it:\n"
                   f"[kafka.consumer]\n{fast}", err=True)
    try:
        while not stop and b.proc is not None and b.proc.poll() is None:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
