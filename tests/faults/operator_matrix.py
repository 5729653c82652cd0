"""The control plane's and the operator surface's fault matrix: every way a control record, an
operator command or an unreachable cluster can hurt a running group, and what must happen.
One row per fault, in the spirit of matrix.py.

Each row runs against the real broker and real `ringmaster run` members
(tests/faults/operator_drive.py) and is judged (test_operator_matrix.py) on: every member
alive until it is stopped, every exit status (members and commands), no record lost, no
duplicate beyond the design's bound (none: the group is stable and a pause fences without
re-running finished work), every offset committed, and `ringmaster pause` then `resume`
working afterwards. docs/operations.md's "When the control plane goes wrong" table is generated
from the ``when``/``then`` columns (tests/faults/table.py).

Records are (key, value) as written raw to the group's control topic; ``{in}`` in a key,
value or command stands for the group's input topic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

Record = tuple[bytes | None, bytes | None]


def rec(key: str | None, value: Any) -> Record:
    """A control record; a dict or list value is JSON, bytes as they are, None a tombstone."""
    raw = value if isinstance(value, bytes) or value is None else json.dumps(value).encode()
    return (None if key is None else key.encode(), raw)


@dataclass(frozen=True)
class Command:
    args: tuple[str, ...]
    exit: int = 0
    says: tuple[str, ...] = ()  # in its output (stdout + stderr)
    says_not: tuple[str, ...] = ()
    stores: bool | None = None  # whether it may write to the control topic (None: not judged)


@dataclass(frozen=True)
class OperatorFault:
    id: str
    group: str  # table section (docs/operations.md)
    when: str
    then: str
    before: tuple[Record, ...] = ()  # in the control topic before the members start
    during: tuple[Record, ...] = ()  # written while they run
    effect: str = "none"  # what before/during/commands do to the group: none | pauses | resumes
    commands: tuple[Command, ...] = ()  # run while the members run, before records are produced
    plugin: str | None = None  # the operator commands' config names this plugin (members: probe)
    members: int = 2
    logged: tuple[tuple[str, int], ...] = ()  # (text, times) each member's log has exactly
    max_status_bytes: int = 256 * 1024
    driver: str = "members"
    timeout_s: float = 180.0
    protocol: str | None = None  # the members' group protocol (None: the session's, tests/helpers.py)
    # The control topic's cleanup.policy as the row creates it before the members start (the
    # daemon and the operator commands create it compacted when it is missing).
    control_policy: str = "compact"


PAUSE = {"paused": True, "reason": "maintenance", "by": "op@host", "at_ms": 1_700_000_000_000}
IGNORED = "ignoring"  # both the load's summary line and the follow line start so


def hostile(id: str, when: str, record: Record, problem: str) -> OperatorFault:
    """A record that is not a valid pause or resume, in the topic at start and again while
    running: ignored, logged once at load and once when it arrives, nothing paused."""
    return OperatorFault(id, "control records", when,
                         "ignored (it neither pauses nor resumes); each member logs it once, with what is "
                         "wrong",
                         before=(record,), during=(record,), logged=((problem, 2),))


CONTROL_RECORDS: list[OperatorFault] = [
    hostile("until-ms-1e400", '`until_ms` is `1e400`', rec("*", b'{"paused": true, "until_ms": 1e400}'),
            "until_ms: Input should be a valid integer"),
    hostile("until-ms-float", '`until_ms` is `1e20` (a float)',
            rec("*", b'{"paused": true, "until_ms": 1e20}'),
            "until_ms: Input should be a valid integer"),
    hostile("until-ms-out-of-range", "`until_ms` is an integer past the year 9999",
            rec("*", {"paused": True, "until_ms": 10**20}), "until_ms: Input should be less than or equal"),
    hostile("at-ms-negative", "`at_ms` is negative", rec("*", {"paused": True, "at_ms": -5}),
            "at_ms: Input should be greater than or equal to 0"),
    hostile("paused-string-true", '`paused` is the string `"true"`', rec("*", {"paused": "true"}),
            "paused: Input should be a valid boolean"),
    hostile("reason-wrong-type", "`reason` is a number", rec("*", {"paused": True, "reason": 42}),
            "reason: Input should be a valid string"),
    hostile("value-not-json", "the value is not JSON", rec("*", b"\xff\xfe{paused"), "value: Invalid JSON"),
    hostile("value-not-an-object", "the value is a JSON list", rec("*", [True]),
            "value: Input should be an object"),
    hostile("value-deeply-nested", "the value nests 100,000 lists", rec("*", b"[" * 100_000),
            "recursion limit"),
    hostile("unknown-scope", "the key is not a scope (`everything`)", rec("everything", PAUSE),
            "is not a scope"),
    hostile("partition-not-canonical", "the key names partition `01` (not plain decimal)",
            rec("partition:{in}:01", PAUSE), "is not a scope"),
    # A compacted topic takes no record without a key on Apache Kafka (Tansu stores one), so a
    # keyless record reaches a group only through a control topic made without compaction
    # (by hand, a platform's automation, auto-creation): the row makes its topic so.
    replace(hostile("no-key", "the record has no key", rec(None, PAUSE), "has no key"),
            control_policy="delete"),
    hostile("key-not-utf8", "the key is not UTF-8", (b"topic:\xff\xfe", json.dumps(PAUSE).encode()),
            "the key is not UTF-8"),
    OperatorFault("paused-string-false", "control records",
                  '`"paused": "false"` (a string) arrives while the group is paused',
                  "ignored: the group stays paused until a valid resume",
                  before=(rec("*", PAUSE),), during=(rec("*", {"paused": "false"}),), effect="pauses",
                  logged=(("paused: Input should be a valid boolean", 1),)),
    OperatorFault("reason-900kb", "control records", "a pause's reason is 900 KB",
                  "a pause, its reason cut to 1 KiB: status and /metrics stay small",
                  before=(rec("*", {**PAUSE, "reason": "r" * 900_000}),), effect="pauses",
                  max_status_bytes=64 * 1024),
    OperatorFault("pause-of-a-missing-partition", "control records",
                  "a pause names a partition the topic does not have",
                  "it covers nothing; every partition goes on",
                  before=(rec("partition:{in}:99", PAUSE),)),
    OperatorFault("tombstone-resumes", "control records", "a tombstone arrives for a paused scope",
                  "the scope is resumed", before=(rec("*", PAUSE),), during=(rec("*", None),),
                  effect="resumes"),
    OperatorFault("tombstone-unknown-key", "control records",
                  "a tombstone arrives for a key that is not a scope",
                  "nothing happens, nothing is logged", before=(rec("bogus", PAUSE),),
                  during=(rec("bogus", None),), logged=(("is not a scope", 1),)),
    OperatorFault("twenty-thousand-records", "control records",
                  "the control topic holds 20,000 records, 2,000 of them invalid",
                  "read in linear time at start; one line per kind of problem",
                  before=tuple(rec(f"partition:{{in}}:{i % 4}",
                                   {**PAUSE, "paused": i % 2 == 1 and i < 17_000}) for i in range(18_000))
                  + tuple(rec(f"topic:t{i}", {"paused": "yes"}) for i in range(2_000)),
                  logged=(("ignoring 2000 control record(s)", 1),)),
]

BROKEN_PLUGIN_COMMANDS = (
    Command(("pause", "--reason", "bad deploy"), says=("paused every topic of the group",), stores=True),
    Command(("status",), says=("bad deploy",)),
    Command(("top",), says=("operator pauses",)),
)

OPERATOR_COMMANDS: list[OperatorFault] = [
    OperatorFault("plugin-fails-to-import", "operator commands",
                  "the plugin fails to import (a bad deploy) and the operator runs pause, status, top, "
                  "resume",
                  "each works as usual: operator commands never import the plugin",
                  plugin="broken_import", commands=BROKEN_PLUGIN_COMMANDS, effect="pauses"),
    OperatorFault("plugin-hangs-at-import", "operator commands",
                  "the plugin hangs at import and the operator runs pause, status, top, resume",
                  "the same: each finishes promptly", plugin="hangs_import",
                  commands=BROKEN_PLUGIN_COMMANDS, effect="pauses"),
    OperatorFault("pause-partition-out-of-range", "operator commands",
                  "`pause --topic T --partition 99` on a 4-partition topic",
                  "exit 2, one line saying T has 4 partitions; nothing stored", members=1,
                  commands=(Command(("pause", "--topic", "{in}", "--partition", "99"), exit=2,
                                    says=("has 4 partition(s), 0 to 3",), stores=False),)),
    OperatorFault("pause-for-zero", "operator commands", "`pause --for 0s`",
                  "exit 2, one line with the bounds (1 s to 366 days); nothing stored", members=1,
                  commands=(Command(("pause", "--for", "0s"), exit=2, says=("1 s to 366 days",),
                                    stores=False),)),
    OperatorFault("pause-for-absurd", "operator commands", "`pause --for 1000000000000d`",
                  "the same", members=1,
                  commands=(Command(("pause", "--for", "1000000000000d"), exit=2, says=("1 s to 366 days",),
                                    stores=False),)),
    OperatorFault("pause-unknown-topic", "operator commands",
                  "`pause --topic` names a topic the group does not read",
                  "exit 2, one line listing the group's topics; nothing stored", members=1,
                  commands=(Command(("pause", "--topic", "nope"), exit=2,
                                    says=("not one of the group's topics",), stores=False),)),
    OperatorFault("pause-reason-too-long", "operator commands", "`pause --reason` is longer than 1 KiB",
                  "exit 2, one line; nothing stored", members=1,
                  commands=(Command(("pause", "--reason", "x" * 2000), exit=2, says=("at most 1024",),
                                    stores=False),)),
    OperatorFault("resume-not-paused", "operator commands", "`resume` when nothing is paused",
                  "exit 0, it says nothing was paused; no log line before its output", members=1,
                  commands=(Command(("resume",), says=("nothing to resume",), says_not=("ringmaster:",),
                                    stores=False),)),
    OperatorFault("resume-over-invalid-records", "operator commands",
                  "`resume` with invalid records in the control topic",
                  "it works, and overwrites them so they are not logged again", members=1,
                  before=(rec("*", b'{"paused": true, "until_ms": 1e400}'),
                          rec("topic:{in}", {"paused": "no"})),
                  commands=(Command(("resume",), says=("overwrote 2 control record(s)",), stores=True),
                            Command(("resume",), says=("nothing to resume",), says_not=("overwrote",),
                                    stores=False))),
]

CLUSTER: list[OperatorFault] = [
    OperatorFault("cluster-unreachable-daemon", "unreachable cluster",
                  "the cluster is unreachable when the daemon starts",
                  "it waits, one line naming the address every 30 s (no raw client lines, no traceback), "
                  "and goes on once the cluster answers",
                  driver="unreachable_daemon", members=1),
    OperatorFault("cluster-unreachable-batch", "unreachable cluster",
                  "the cluster is unreachable for `run --until-caught-up`",
                  "exit 8 after `kafka.connect_timeout_s`, one line naming the address",
                  driver="unreachable_batch", members=0),
    *[OperatorFault(f"cluster-unreachable-{cmd}", "unreachable cluster",
                    f"the cluster is unreachable for `ringmaster {cmd}`",
                    "exit 8 after `kafka.connect_timeout_s`, one line naming the address",
                    driver="unreachable_command", members=0, commands=(Command((cmd,), exit=8),))
      for cmd in ("pause", "resume")],
]

OPERATOR_FAULTS = [*CONTROL_RECORDS, *OPERATOR_COMMANDS, *CLUSTER]
# Pauses across the group's rebalances (members joining a paused group; a pause and a resume
# of a group of two): on Apache Kafka each runs again under the other group protocol
# (tests/faults/protocols.py).
REBALANCE_ROWS = ("paused-string-false", "tombstone-resumes", "plugin-fails-to-import")
BY_ID = {f.id: f for f in OPERATOR_FAULTS}
assert len(BY_ID) == len(OPERATOR_FAULTS), "row ids must be unique"
