"""``ringmaster produce`` and ``tail``: write test records to a topic, and print what a topic
holds (runtime/dev/records.py). Never import the plugin."""

from __future__ import annotations

import sys

import click

from runtime.cli.loading import operator_settings, reach_cluster
from runtime.cli.outcome import fail
from runtime.errors import ConfigError, RingmasterError


@click.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--topic", default=None, help="Default: the config's input topic (when it has one).")
@click.option("--key-separator", default=None,
              help="Split each line at the first SEP: the key before it, the value after.")
@click.option("--partitions", type=int, default=4, show_default=True,
              help="When the topic does not exist yet, create it with this many partitions.")
@click.argument("values", nargs=-1)
def produce(config: str, topic: str | None, key_separator: str | None, partitions: int,
            values: tuple[str, ...]) -> None:
    """Write test records: each VALUE, or else each line of stdin, is one record's value,
    acknowledged by the broker. Uses the config's connection settings."""
    from runtime.dev import records

    settings = operator_settings(config)
    try:
        name = records.input_topic(settings, topic)
        # An outage is one line and exit 8, not a stream of client errors; the topics it reads
        # tell whether the topic must be created.
        topics = reach_cluster(settings)
        lines = values if values else sys.stdin
        count, created = records.produce_lines(settings, name, lines, key_separator, partitions, topics)
    except RingmasterError as exc:
        fail(exc)
        return
    made = f" (created it with {partitions} partition{'' if partitions == 1 else 's'})" if created else ""
    click.echo(f"produced {count} record(s) to {name!r}{made}", err=True)


@click.command()
@click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)
@click.option("--topic", default=None, help="Default: the config's [output] topic.")
@click.option("--dead-letters", is_flag=True, help="Read the [dead_letter] topic: each line says where "
              "the record came from and why it failed.")
@click.option("-n", "--lines", "last", type=click.IntRange(min=0), default=None, metavar="N",
              help="The last N records of each partition, partition by partition in offset order, "
                   "then exit (as Unix tail -n; with -f, go on following).")
@click.option("-f", "--follow", is_flag=True, help="With -n: after the last N, print what arrives.")
@click.option("--max", "max_records", type=click.IntRange(min=1), default=None, metavar="N",
              help="Stop after N records, waiting for them (from the beginning, or after -n's).")
@click.option("--timeout", "timeout_s", type=float, default=None,
              help="Give up (exit 1) when --max records have not come within this many seconds.")
@click.option("--keys", is_flag=True, help="Print the key, a tab, then the value.")
def tail(config: str, topic: str | None, dead_letters: bool, last: int | None, follow: bool,
         max_records: int | None, timeout_s: float | None, keys: bool) -> None:
    """Print a topic's records, one per line: by default what the plugin produced. Without -n,
    every record from the beginning, then as they come (Ctrl-C to leave). Joins no group,
    commits nothing. Kafka orders records within a partition only: records of different
    partitions come in an order that may differ from run to run, except with -n.

    It reads with the config's isolation level (kafka.consumer "isolation.level"; librdkafka's
    default, read_committed): records of aborted transactions, and of transactions still open,
    are not printed. To see them, set "isolation.level" = "read_uncommitted" in a copy of the
    config."""
    from runtime.dev import records

    if follow and last is None:
        fail(ConfigError("-f/--follow goes with -n N (without -n, tail follows from the beginning)"))
    settings = operator_settings(config)
    seen = 0
    try:
        name = records.output_topic(settings, topic, dead_letters)
        reach_cluster(settings)
        lines = records.tail_lines(settings, name, keys, max_records, timeout_s, last=last,
                                    follow=follow or last is None)
        for line in lines:
            click.echo(line)
            seen += 1
    except RingmasterError as exc:
        fail(exc)
    except KeyboardInterrupt:
        return
    following = follow or last is None
    if following and max_records is not None and seen < max_records:  # --timeout passed first
        fail(RingmasterError(f"only {seen} of {max_records} record(s) from {name!r} within {timeout_s:g} s"))
