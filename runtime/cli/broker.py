"""``ringmaster broker``: a development broker in the foreground, the embedded Tansu, a
single-node Apache Kafka or a replicated cluster of Apache Kafka nodes (runtime/dev/tansu.py,
kafkabroker.py, kafkacluster.py)."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

import click

from runtime.cli.outcome import fail
from runtime.errors import ConfigError, RingmasterError

if TYPE_CHECKING:  # the broker modules are imported when the command runs, not at the CLI's start
    from runtime.dev.kafkacluster import ApacheKafkaCluster


@click.command()
@click.option("--port", type=int, default=9092, show_default=True)
@click.option("--apache-kafka", "apache_kafka", is_flag=True,
              help="Run Apache Kafka itself (one KRaft node; Java 17+, resolved with Maven on first "
                   "use) instead of the embedded Tansu.")
@click.option("--nodes", type=click.IntRange(1, 9), default=1, show_default=True,
              help="With --apache-kafka: this many KRaft nodes, one quorum, clients on --port, --port + 1, "
                   "...: every topic (the internal ones too) with 3 replicas and min.insync.replicas 2, so "
                   "that killing or freezing one node shows failover.")
@click.option("--sasl-scram", "sasl_scram", default=None, metavar="USER:PASSWORD",
              help="With --apache-kafka: clients must log in with SCRAM-SHA-512 as this user over TLS "
                   "(SASL_SSL), with certificates made at start; prints the [kafka.security] to use.")
@click.option("--tls-dir", "tls_dir", type=click.Path(file_okay=False), default=None,
              help="With --sasl-scram: where the CA (ca.pem) and the broker's keystore are written "
                   "(default: in the broker's log dir, gone at stop).")
def broker(port: int, apache_kafka: bool, nodes: int, sasl_scram: str | None, tls_dir: str | None) -> None:
    """Run a development broker in the foreground: the embedded Tansu (memory-only), or with
    --apache-kafka a single-node Apache Kafka, or with --nodes N a cluster of N replicated nodes,
    their log dirs removed at stop."""
    import time

    from runtime.dev.kafkabroker import (
        KAFKA_VERSION,
        ApacheKafkaBroker,
        cache_dir,
        parse_scram_user,
        resolved,
    )
    from runtime.dev.kafkacluster import ApacheKafkaCluster
    from runtime.dev.tansu import FAST_JOIN, DevBroker

    # RACE: the handler goes in before the banner, which is what tells a caller it may stop us.
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))
    b: DevBroker | ApacheKafkaBroker | ApacheKafkaCluster
    try:
        if (sasl_scram or tls_dir) and not apache_kafka:
            raise ConfigError("--sasl-scram and --tls-dir need --apache-kafka")
        if nodes > 1 and not apache_kafka:
            raise ConfigError("--nodes needs --apache-kafka (the embedded broker is one node)")
        if tls_dir and not sasl_scram:
            raise ConfigError("--tls-dir needs --sasl-scram")
        scram = parse_scram_user(sasl_scram) if sasl_scram else None
        if apache_kafka:
            if not resolved():
                click.echo(f"resolving Apache Kafka {KAFKA_VERSION} with Maven into {cache_dir()} "
                           "(first run only)", err=True)
            if nodes > 1:
                b = ApacheKafkaCluster(nodes, port, scram=scram, tls_dir=tls_dir).start()
            else:
                b = ApacheKafkaBroker(port, scram=scram, tls_dir=tls_dir).start()
        else:
            b = DevBroker(port).start()
    except RingmasterError as exc:
        fail(exc)
        return
    except KeyboardInterrupt:
        sys.exit(130)
    if isinstance(b, ApacheKafkaCluster):
        _cluster_banner(b)
    elif apache_kafka:
        click.echo(f"Apache Kafka {KAFKA_VERSION} listening on {b.bootstrap} (one KRaft node; its log "
                   f"dir goes at stop; Ctrl-C stops it)\n"
                   f"Transactions, the consumer group protocol (KIP-848: group.protocol = \"consumer\") "
                   f"and share groups are on.", err=True)
    if apache_kafka:
        if scram is not None:
            assert isinstance(b, ApacheKafkaBroker | ApacheKafkaCluster)
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
        if isinstance(b, ApacheKafkaCluster):
            _watch_cluster(b, stop)
        else:
            while not stop and b.proc is not None and b.proc.poll() is None:
                time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()


def _cluster_banner(cluster: ApacheKafkaCluster) -> None:
    from runtime.dev.kafkabroker import KAFKA_VERSION
    from runtime.dev.kafkacluster import replication

    settings = replication(len(cluster.nodes))
    click.echo(f"Apache Kafka {KAFKA_VERSION}: {len(cluster.nodes)} KRaft nodes (broker and controller each, "
               f"one quorum); their log dirs go at stop; Ctrl-C stops them all", err=True)
    for n in cluster.nodes:
        click.echo(f"node {n.node_id}  {n.place.address}  pid {n.pid}", err=True)
    click.echo(f"bootstrap: {cluster.bootstrap}\n"
               f"Every topic, the offsets, transaction-state and share-group state topics too, has "
               f"{settings['default.replication.factor']} replicas and min.insync.replicas "
               f"{settings['min.insync.replicas']}. Try failover: kill -9 (or kill -STOP) a node's pid; the "
               f"others go on. Transactions, KIP-848 and share groups are on.", err=True)


def _watch_cluster(cluster: ApacheKafkaCluster, stop: list[int]) -> None:
    """Until Ctrl-C, SIGTERM or every node has exited: a node that exits (a user trying
    failover) is said once, and the others go on."""
    import time

    gone: set[int] = set()
    while not stop and len(gone) < len(cluster.nodes):
        for n in cluster.nodes:
            if n.node_id not in gone and not n.running:
                gone.add(n.node_id)
                code = n.proc.returncode if n.proc is not None else None
                left = len(cluster.nodes) - len(gone)
                click.echo(f"node {n.node_id} (pid {n.pid}) exited with {code}; {left} of "
                           f"{len(cluster.nodes)} nodes left", err=True)
        time.sleep(0.2)
