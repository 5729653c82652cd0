"""``ringmaster pause`` and ``resume``: group-wide pauses, written to the group's control
topic (runtime/ops/control.py). Never import the plugin."""

from __future__ import annotations

from typing import Any

import click

from runtime.cli.loading import operator_settings, reach_cluster
from runtime.cli.outcome import fail
from runtime.errors import ConfigError, RingmasterError


def _scope_option(fn: Any) -> Any:
    fn = click.option("--partition", type=int, default=None, help="One partition of --topic.")(fn)
    fn = click.option("--topic", default=None, help="One of the group's topics (default: all of them).")(fn)
    return click.option("-c", "--config", "config", type=click.Path(dir_okay=False), required=True)(fn)


@click.command()
@_scope_option
@click.option("--reason", default="",
              help="Shown in status and logs of every member (at most 1 KiB, one line).")
@click.option("--for", "duration", default=None,
              help="The pause ends by itself after this duration: 90s, 10m, 1h30m, 2d, 1w (1 s to 366 "
                   "days).")
def pause(config: str, topic: str | None, partition: int | None, reason: str, duration: str | None) -> None:
    """Pause processing group-wide and durably: every member on every host stops within about
    2 s (batches in progress finish and commit), across rebalances, restarts and new members,
    until `ringmaster resume` (or --for) ends it. Stored in the group's control topic.

    Never imports the plugin. Exit status: 0 paused; 2 a wrong option (a topic the group does
    not read, a partition the topic does not have, --for or --reason out of bounds), nothing
    stored; 8 the cluster did not answer within kafka.connect_timeout_s; 5 it refused."""
    import time as _time

    from runtime.ops import control
    from runtime.ops.control_records import check_reason, describe_scope, parse_duration, pause_record

    settings = operator_settings(config)
    try:
        scope = control.checked_scope(topic, partition)
        if topic is not None and not control.group_reads(settings, topic):
            raise ConfigError(f"--topic {topic!r} is not one of the group's topics "
                              f"({', '.join(settings.kafka.topics)})")
        for_s = None if duration is None else parse_duration(duration)
        check_reason(reason)
        topics = reach_cluster(settings)
        if topic is not None and partition is not None:
            if topic not in topics:
                raise ConfigError(f"--topic {topic!r} does not exist on the cluster, so it has no partition "
                                  f"{partition}")
            if partition >= topics[topic]:
                raise ConfigError(f"--partition {partition}: topic {topic!r} has {topics[topic]} "
                                  f"partition(s), 0 to {topics[topic] - 1}")
        p = pause_record(scope, reason, control.who(), int(_time.time() * 1000), for_s)
        control.write(settings, [p.record()])
    except RingmasterError as exc:
        fail(exc)
        return
    said = f": {p.reason}" if p.reason else ""
    click.echo(f"group {settings.kafka.group_id!r}: paused {describe_scope(scope)} {p.provenance()}{said}; "
               "every member stops processing it within about 2 s")


@click.command()
@_scope_option
def resume(config: str, topic: str | None, partition: int | None) -> None:
    """End pauses. Without --topic, every pause of the group; with --topic (and --partition),
    that scope only (a wider pause still in force is reported). Works whatever the control
    topic holds: records that are not valid pauses are overwritten in the scope resumed.

    Never imports the plugin. Exit status: 0 resumed, and also when nothing in the scope was
    paused (it says so: resuming is safe to repeat in scripts); 2 a wrong option; 8 the
    cluster did not answer within kafka.connect_timeout_s; 5 it refused."""
    import time as _time

    from runtime.ops import control
    from runtime.ops.control_records import describe_scope

    settings = operator_settings(config)
    group = settings.kafka.group_id
    try:
        scope = control.checked_scope(topic, partition)
        reach_cluster(settings)
        state = control.OperatorPauses.for_settings(settings)
        try:
            state.load(settings.control.load_timeout_s, report=False)
        finally:
            state.close()
        plan = control.plan_resume(state, topic, partition, control.who(), int(_time.time() * 1000))
        if plan.records:
            control.write(settings, plan.records)
    except RingmasterError as exc:
        fail(exc)
        return
    cleared = f"; overwrote {plan.cleared} control record(s) that were not valid" if plan.cleared else ""
    if plan.resumed:
        shown = ", ".join(describe_scope(k) for k in plan.resumed[:10])
        more = f" and {len(plan.resumed) - 10} more" if len(plan.resumed) > 10 else ""
        click.echo(f"group {group!r}: resumed {shown}{more}{cleared}")
    else:
        click.echo(f"group {group!r}: nothing to resume, {describe_scope(scope)} is not paused{cleared}")
    if topic is not None and not control.group_reads(settings, topic):
        click.echo(f"note: {topic!r} is not one of the group's topics ({', '.join(settings.kafka.topics)})",
                   err=True)
    for p in plan.still:
        click.echo(f"note: {describe_scope(p.scope)} is still paused ({p.describe()})", err=True)
    if plan.invalid_elsewhere:
        click.echo(f"note: {plan.invalid_elsewhere} other control record(s) are not valid pauses or resumes "
                   "(`ringmaster resume` without --topic overwrites them; the daemon's log says what "
                   "is wrong)",
                   err=True)
