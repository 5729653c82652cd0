"""The operator's actions from the console, written as the CLI writes them: a pause or a resume
is the record ``ringmaster pause``/``resume`` writes to the control topic; a reload or a scale is
a command record on the same topic, for every member on every host (runtime/ops/
control_records.py); a redrive of a pick of dead letters runs the engine of ``ringmaster
redrive``, first as ``--dry-run`` (the plan), then for real once confirmed. Each returns the
Action the console follows the members' acknowledgements of. Runs in: the console's web server,
in a worker thread (each call blocks until the broker acknowledged, as the CLI does).
"""

from __future__ import annotations

import secrets
import time

from runtime.config import Settings
from runtime.console.state import Action, GroupState
from runtime.errors import ConfigError
from runtime.ops import control
from runtime.ops.control_records import Command, CommandKind, check_reason, describe_scope, pause_record
from runtime.redrive.command import Options, redrive_group, run_redrive
from runtime.redrive.engine import Stopper
from runtime.redrive.report import Summary

MAX_PICK = 1000  # letters redriven at once from the console


def new_id() -> str:
    return f"{int(time.time())}-{secrets.token_hex(4)}"


def _check_topic(settings: Settings, topic: str | None) -> None:
    if topic is not None and not control.group_reads(settings, topic):
        raise ConfigError(f"topic {topic!r} is not one of the group's topics "
                          f"({', '.join(settings.kafka.topics)})")


def pause(settings: Settings, state: GroupState, topic: str | None, partition: int | None, reason: str,
          by: str) -> Action:
    scope = control.checked_scope(topic, partition)
    _check_topic(settings, topic)
    check_reason(reason)
    p = pause_record(scope, reason, by, int(time.time() * 1000), None)
    members = state.live_members()
    offsets = control.write(settings, [p.record()])
    action = Action(new_id(), "pause", describe_scope(scope), by, time.time(), offsets, members, scope)
    state.add_action(action)
    return action


def resume(settings: Settings, state: GroupState, topic: str | None, partition: int | None,
           by: str) -> Action:
    """As ``ringmaster resume``: the pauses in that scope end (a wider one stays: the action says so)."""
    scope = control.checked_scope(topic, partition)
    pauses = control.OperatorPauses.for_settings(settings)
    try:
        pauses.load(settings.control.load_timeout_s, report=False)
    finally:
        pauses.close()
    plan = control.plan_resume(pauses, topic, partition, by, int(time.time() * 1000))
    members = state.live_members()
    offsets = control.write(settings, plan.records) if plan.records else []
    what = describe_scope(scope)
    if not plan.resumed:
        what += " (was not paused)"
    if plan.still:
        what += "; still paused by " + ", ".join(describe_scope(p.scope) for p in plan.still)
    action = Action(new_id(), "resume", what, by, time.time(), offsets, members, scope)
    state.add_action(action)
    return action


def command(settings: Settings, state: GroupState, kind: CommandKind, by: str, processes: int | None = None,
            change: int = 0) -> Action:
    """A reload or a scale for every member running now (each answers in its status record)."""
    if kind is CommandKind.SCALE and (processes is None) == (not change):
        raise ConfigError("scale needs a number of workers (N), or a change (+N or -N, not 0)")
    if processes is not None and not 1 <= processes <= 10_000:
        raise ConfigError(f"scale: {processes} workers is not a size (1 to workers.max_processes)")
    members = state.live_members()
    if not members:
        raise ConfigError("no member of the group is running: nobody would act on it")
    c = Command(new_id(), kind, processes, change, by, int(time.time() * 1000), tuple(members))
    offsets = control.write(settings, [c.record()])
    action = Action(c.id, kind.value, c.describe(), by, time.time(), offsets, members)
    state.add_action(action)
    return action


class _Quiet(Stopper):
    """No signal handlers: the redrive runs in a thread of the console, not the main one."""

    def install(self) -> None:
        pass

    def restore(self) -> None:
        pass


def _picked(picks: list[tuple[int, int]]) -> frozenset[tuple[int, int]]:
    if not picks:
        raise ConfigError("pick at least one letter")
    if len(picks) > MAX_PICK:
        raise ConfigError(f"{len(picks)} letters picked: at most {MAX_PICK} at once "
                          "(or `ringmaster redrive`)")
    return frozenset(picks)


def redrive_plan(settings: Settings, picks: list[tuple[int, int]], max_redrives: int = 3) -> Summary:
    """What a redrive of these letters would do: ``ringmaster redrive --dry-run`` over them."""
    options = Options(max_redrives=max_redrives, dry_run=True, picked=_picked(picks))
    return run_redrive(settings, options, stopper=_Quiet()).summary


def redrive(settings: Settings, state: GroupState, picks: list[tuple[int, int]], by: str,
            max_redrives: int = 3) -> tuple[Action, Summary]:
    """Redrive these letters to their source partitions, in a redrive group of their own (the
    console's pick is not the cursor of ``ringmaster redrive``'s group)."""
    picked = _picked(picks)
    action_id = new_id()
    group = f"{redrive_group(settings, None)}.console.{action_id}"
    summary = run_redrive(settings, Options(max_redrives=max_redrives, group=group, picked=picked),
                          stopper=_Quiet()).summary
    now = time.time()
    with state.lock:
        for p, o in picked:
            state.redriven[(p, o)] = now
    action = Action(action_id, "redrive", f"{len(picked)} letter(s)", by, now, [], [], result=summary.line())
    state.add_action(action)
    return action, summary
