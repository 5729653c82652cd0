"""``ringmaster redrive`` from Settings: measure the dead-letter topic's ends, read the redrive
group's cursor, and run the engine with the action the options ask for; release every client on
every exit path. Runs in: the CLI."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from runtime.config import Settings, max_message_bytes
from runtime.errors import ConfigError, KafkaError, PluginError
from runtime.execution.run import RetryPolicy
from runtime.kafka.consumer import GroupConsumer
from runtime.kafka.producer import OutputProducer
from runtime.kafka.properties import consumer_properties, producer_properties
from runtime.kafka.topic_reader import RecordFetcher, partition_bounds
from runtime.ops.cluster import refuse_early
from runtime.ops.control_records import shown
from runtime.plugin import Context, Plugin, load_plugin, plugin_version
from runtime.redrive.actions import Action, Count, ThroughPlugin, ToSource
from runtime.redrive.engine import Redrive, Stopper
from runtime.redrive.letters import MAX_REDRIVE_COUNT
from runtime.redrive.pacing import TokenBucket
from runtime.redrive.report import Ending, Mode, Summary
from runtime.redrive.selection import OffsetBound, Selection, parse_bound

log = logging.getLogger("ringmaster.redrive")

# Waiting for the group to hand this run its partitions; past it, another redrive of the same
# group holds them (the summary says so).
ASSIGN_TIMEOUT_S = 60.0
BOUNDS_TIMEOUT_S = 30.0
# Reading an assignment's committed offsets, inside the rebalance callback: well within the
# consumer's max.poll.interval.ms (60 s at least), well past a coordinator's move (seconds).
START_TIMEOUT_S = 15.0
MAX_RATE = 1e9  # records per second: far above any broker's; inf and nan are not rates


@dataclass(frozen=True)
class Options:
    start: str | None = None  # --from
    end: str | None = None  # --to
    error_types: tuple[str, ...] = ()
    rate: float | None = None  # records per second; None: no limit
    max_redrives: int = 3
    through_plugin: bool = False
    dry_run: bool = False
    group: str | None = None
    # Only these letters, by (partition, offset) of the dead-letter topic (``ringmaster console``'s
    # pick, redriven in a group of its own); the run reads only from the first to the last of them.
    picked: frozenset[tuple[int, int]] | None = None


@dataclass
class RedriveResult:
    summary: Summary
    consumer_abandoned: bool = False


def redrive_group(settings: Settings, group: str | None) -> str:
    """The redrive's own consumer group (its cursor through the dead-letter topic)."""
    return group or f"{settings.kafka.group_id}.redrive"


def selection_for(settings: Settings, options: Options, now_ms: int) -> Selection:
    if not 1 <= options.max_redrives <= MAX_REDRIVE_COUNT:
        raise ConfigError(f"--max-redrives must be from 1 to {MAX_REDRIVE_COUNT}, not "
                          f"{shown(str(options.max_redrives), 24)}")
    if options.rate is not None and not 0 < options.rate <= MAX_RATE:
        raise ConfigError(f"--rate must be a number of records per second above 0 and at most "
                          f"{MAX_RATE:g} (leave it out for no limit), not {options.rate!r}")
    start = None if options.start is None else parse_bound(options.start, "--from", now_ms)
    end = None if options.end is None else parse_bound(options.end, "--to", now_ms)
    if options.picked is not None:
        if start is not None or end is not None:
            raise ConfigError("a pick of letters is its own window: no --from or --to with it")
        by_partition: dict[int, list[int]] = {}
        for p, o in options.picked:
            by_partition.setdefault(p, []).append(o)
        start = OffsetBound(partitions={p: min(o) for p, o in by_partition.items()})
        end = OffsetBound(every=0, partitions={p: max(o) + 1 for p, o in by_partition.items()})
    return Selection(
        topics=tuple(settings.kafka.topics),
        start=start, end=end, picked=options.picked,
        error_types=frozenset(options.error_types), max_redrives=options.max_redrives,
        through_plugin=options.through_plugin)


def run_redrive(settings: Settings, options: Options, clock: Callable[[], float] = time.monotonic,
                stopper: Stopper | None = None) -> RedriveResult:
    """Everything ``ringmaster redrive`` does. Raises RingmasterError (config, plugin, Kafka)."""
    topic = settings.dead_letter.topic
    if topic is None:
        raise ConfigError("redrive needs [dead_letter] topic: the topic to read dead letters from")
    selection = selection_for(settings, options, int(time.time() * 1000))
    group = redrive_group(settings, options.group)
    mode = Mode.THROUGH_PLUGIN if options.through_plugin else Mode.TO_SOURCE
    summary = Summary(topic, group, mode, options.dry_run)
    result = RedriveResult(summary)
    props = {**consumer_properties(settings), "group.id": group, "enable.partition.eof": True,
             # A redrive group without a cursor starts at the first letter, whatever the
             # daemon's own reset policy.
             "auto.offset.reset": "earliest"}
    refuse_early(settings)  # a refused login: one line and exit 14, not a login retried for ever
    try:
        bounds = partition_bounds(topic, props, BOUNDS_TIMEOUT_S)
    except KafkaError as exc:
        raise KafkaError(f"cannot read the dead-letter topic ([dead_letter] topic): {exc}") from None
    # Released on every exit path, the last taken first: the refetcher, the action (its
    # producer), the plugin (teardown), and the group left last.
    with contextlib.ExitStack() as release:
        consumer = GroupConsumer(props)
        release.callback(_leave, consumer, result)
        cursor = consumer.committed([(topic, p) for p in bounds], timeout_s=BOUNDS_TIMEOUT_S, ask_again=True)
        to_do = set()
        for p, (first, end) in bounds.items():
            start = max(cursor.get((topic, p)) or first, first)
            stop = selection.end_offset(p)
            if start < (end if stop is None else min(end, stop)):
                to_do.add(p)
        log.info("redrive starting", extra={
            "topic": topic, "group": group, "mode": mode.value, "dry_run": options.dry_run,
            "letters_at_most": sum(max(0, end - max(cursor.get((topic, p)) or first, first))
                                   for p, (first, end) in bounds.items())})
        if not to_do:
            summary.ending = Ending.NOTHING
            return result
        stopper = stopper or Stopper()
        # The plugin's Backoff waits through the engine (which keeps the group served while
        # it waits); the engine is made after its action, hence this late binding.
        engine_wait: list[Callable[[float], bool]] = []
        action: Action
        if options.dry_run:
            action = Count()
        elif options.through_plugin:
            plugin = _start_plugin(settings)
            release.callback(_teardown, plugin)
            dl = settings.dead_letter
            action = ThroughPlugin(
                plugin, RetryPolicy(dl.max_attempts, dl.retry_backoff_s, dl.retry_backoff_max_s),
                lambda: OutputProducer(producer_properties(settings),
                                       own_topics=(settings.output.topic, topic)),
                settings.output.topic, topic,
                max_message_bytes(settings), settings.output.delivery_timeout_s,
                settings.workers.batch_max_records, settings.output.retry_backoff_s,
                wait=lambda s: engine_wait[0](s), version=plugin_version(settings.workers.plugin))
        else:
            action = ToSource(OutputProducer(producer_properties(settings)),
                              settings.output.delivery_timeout_s)
        release.callback(action.close)
        fetcher = RecordFetcher(props)
        release.callback(fetcher.close)
        engine = Redrive(
            consumer, action, selection, summary, {p: end for p, (_, end) in bounds.items()}, clock, stopper,
            bucket=None if options.rate is None or options.dry_run else TokenBucket(options.rate, clock),
            refetch=fetcher,
            commit_interval_s=settings.supervisor.commit_interval_ms / 1000,
            delivery_timeout_s=settings.output.delivery_timeout_s, assign_timeout_s=ASSIGN_TIMEOUT_S,
            max_records=settings.workers.batch_max_records, to_do=to_do)
        engine_wait.append(engine.wait)
        if options.dry_run:
            # A look that must not disturb a redrive in progress: no group membership, no commits.
            tps = [(topic, p) for p in sorted(bounds)]
            consumer.assign(tps, timeout_s=ASSIGN_TIMEOUT_S)
            engine.on_assign(tps)
        else:
            consumer.subscribe([topic], engine.on_assign, engine.on_revoke, engine.on_lost,
                               read_start_s=START_TIMEOUT_S)
        engine.run()
        if isinstance(action, ThroughPlugin):
            summary.outputs, summary.discarded = action.outputs, action.discarded
        return result


def _leave(consumer: GroupConsumer, result: RedriveResult) -> None:
    result.consumer_abandoned = not consumer.close(5.0)


def _teardown(plugin: Plugin) -> None:
    if plugin.teardown is not None:
        try:
            plugin.teardown()
        except Exception:
            log.exception("plugin teardown failed")


def _start_plugin(settings: Settings) -> Plugin:
    """Import the plugin and run its setup here, as a worker would (PluginError: exit 3)."""
    name = settings.workers.plugin
    plugin = load_plugin(name)
    if plugin.setup is not None:
        try:
            plugin.setup(Context(f"redrive-{os.getpid()}", dict(settings.workers.settings),
                                 settings.output.topic, logging.getLogger(f"ringmaster.plugin.{name}")))
        except BaseException as exc:  # SystemExit too, as in a worker
            raise PluginError(f"plugin {name!r} setup() failed: {type(exc).__name__}: {exc}") from exc
    return plugin
