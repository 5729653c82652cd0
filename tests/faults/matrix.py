"""The fault matrix: every way a record, a plugin, the outputs or the deployment can hurt
the daemon, and what must happen. One row per fault; a new row is one entry here.

Each row runs against the real broker and the real `ringmaster run` (tests/faults/drive.py)
and is checked (tests/faults/test_fault_matrix.py) for its outcome: the exit status, every
good record output, exactly the bad ones dead-lettered with their error type, every offset
committed (or, for a stop, nothing committed past the failing record), and the log line a
user would look for. The README's "What happens when…" table is generated from the
``when``/``then`` columns (tests/faults/table.py) and checked against this file.

Record values follow tests/plugins/probe.py: ``command[=arg]:id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Rows = Callable[[int], list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]]]


@dataclass(frozen=True)
class Fault:
    id: str
    group: str  # README table section
    when: str  # "What happens when..."
    then: str  # ... what the runtime does
    values: Mapping[int, str] = field(default_factory=dict)  # record index -> value (others: r<i>)
    rows: Rows | None = None  # custom (key, value, headers) rows instead of values
    n: int = 40
    partitions: int = 1
    workers: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the probe plugin's settings
    sections: Mapping[str, Any] = field(default_factory=dict)  # other config, deep-merged
    dead_letter: bool = True
    output: bool = True
    exit: int = 0
    dead: Mapping[str, str] = field(default_factory=dict)  # record id -> ringmaster.error.type
    no_output: frozenset[str] = frozenset()  # good ids whose output goes elsewhere
    log: tuple[str, ...] = ()
    driver: str = "batch"  # tests/faults/drive.py: how the scenario runs
    check: str | None = None  # extra assertions: a function name in test_fault_matrix.py
    timeout_s: float = 120.0


def values(**at: str) -> dict[int, str]:
    """values(r5="raise") -> {5: "raise:r5"}"""
    return {int(k[1:]): f"{v}:{k}" for k, v in at.items()}


BIG_PRODUCER = {"message.max.bytes": 4_000_000}  # what the test producer may write

FAULTS: list[Fault] = [
    # ------------------------------------------------------------------ records
    Fault("null-keys-and-values", "records",
          "records have null or empty keys and values",
          "processed like any other",
          rows=lambda n: [(None if i % 3 == 0 else b"" if i % 3 == 1 else b"k",
                           None if i == 5 else b"" if i == 6 else f"r{i}".encode(), None) for i in range(n)],
          check="null_and_empty"),
    Fault("huge-keys", "records",
          "a record has a huge key (200 KB)",
          "processed; its output keeps the key",
          rows=lambda n: [(b"k" * 200_000 if i == 3 else b"k", f"r{i}".encode(), None) for i in range(n)],
          sections={"kafka": {"producer": BIG_PRODUCER}}),
    Fault("many-and-binary-headers", "records",
          "records carry thousands of headers, or header values that are not UTF-8",
          "processed; a failing one is dead-lettered with its original headers",
          rows=lambda n: [(b"k", (b"raise:r4" if i == 4 else f"r{i}".encode()),
                           [(f"h{j}", b"\xff\xfe\x00" + bytes([j % 256]))
                            for j in range(2000 if i in (2, 4) else 3)]) for i in range(n)],
          dead={"r4": "ValueError"}, check="dead_letter_keeps_headers"),
    Fault("record-larger-than-ring", "records",
          "a record is larger than half a ring",
          "dead-lettered by the supervisor as `RecordTooLarge`; the rest goes on",
          values={7: "big:r7#" + "z" * 70_000}, workers={"ring_bytes": 65536},
          dead={"r7": "RecordTooLarge"}),
    Fault("failing-record-larger-than-message-max", "records",
          "a failing record is larger than the producer's `message.max.bytes`",
          "its dead letter is truncated to fit, with `ringmaster.value.truncated` = the original size",
          values={5: "raise:r5#" + "y" * 300_000},
          sections={"kafka": {"producer": {"message.max.bytes": 100_000}}},
          dead={"r5": "ValueError"}, check="dead_letter_truncated"),
    Fault("too-large-for-ring-and-message-max", "records",
          "a record fits neither a ring nor `message.max.bytes`",
          "dead-lettered truncated by the supervisor, without blocking its loop",
          values={9: "big:r9#" + "z" * 90_000}, workers={"ring_bytes": 65536},
          sections={"kafka": {"producer": {"message.max.bytes": 50_000}}},
          dead={"r9": "RecordTooLarge"}, check="dead_letter_truncated"),
    Fault("output-larger-than-message-max", "records",
          "the plugin returns an output larger than `message.max.bytes`",
          "the record is dead-lettered as `OutputRejected`; the others' outputs go out",
          values={6: "bigout=150000:r6"}, sections={"kafka": {"producer": {"message.max.bytes": 100_000}}},
          dead={"r6": "OutputRejected"}),
    # ------------------------------------------------------------------ plugin: exceptions and wrong returns
    Fault("plugin-raises", "plugin",
          "the plugin raises for a record",
          "retried, bisected, that record dead-lettered with the traceback",
          values=values(r3="raise", r30="raise"), dead={"r3": "ValueError", "r30": "ValueError"}),
    Fault("plugin-rejects", "plugin",
          "the plugin rejects a record (`Reject`)",
          "dead-lettered as `Rejected` with the reason",
          values=values(r8="reject"), dead={"r8": "Rejected"}),
    *[Fault(f"returns-{kind}", "plugin",
            f"`process()` returns {what}",
            "the batch fails with a `TypeError` naming the type; isolated and dead-lettered",
            values={4: f"return={kind}:r4"}, dead={"r4": "TypeError"})
      for kind, what in [("str", "a `str`"), ("dict", "a `dict`"), ("int0", "`0`"), ("false", "`False`"),
                         ("emptystr", '`""`'), ("bytes", "`bytes`")]],
    *[Fault(f"yields-{kind}", "plugin",
            f"`process()` yields {what}",
            "the same: `TypeError` naming the field and the fix, dead-lettered",
            values={4: f"yield={kind}:r4"}, dead={"r4": "TypeError"})
      for kind, what in [("dict", "a `dict`"), ("int", "an `int`"), ("tuple3", "a 3-tuple"),
                         ("outdict", "`Output(value=dict)`"), ("outkeyint", "`Output(key=int)`"),
                         ("outheaders", "`Output(headers=str)`"), ("outtopic", '`Output(topic="")`')]],
    *[Fault(f"sys-exit-{code}", "plugin",
            f"the plugin calls `sys.exit({code})`",
            "counted as an exception of the batch: `SystemExit` dead letter; the daemon goes on",
            values={11: f"sysexit={code}:r11"}, dead={"r11": "SystemExit"})
      for code in (0, 2, 3, 75)],
    *[Fault(f"os-exit-{code}", "plugin",
            f"the plugin calls `os._exit({code})`",
            "a crash (the worker was ready): restarted, the batch retried, bisected, the record "
            "dead-lettered as `WorkerCrashed`; the daemon goes on",
            values={11: f"osexit={code}:r11"}, dead={"r11": "WorkerCrashed"},
            workers={"batch_max_records": 8},
            log=(f"exited with status {code}",) if code else ("exited with status 0",))
      for code in (0, 2, 3, 75)],
    Fault("segfault", "plugin",
          "the plugin segfaults",
          "the same as any crash: `WorkerCrashed`, killed by SIGSEGV",
          values={6: "signal=11:r6"}, dead={"r6": "WorkerCrashed"}, workers={"batch_max_records": 8},
          log=("killed by SIGSEGV",)),
    Fault("oom-kill", "plugin",
          "a worker is killed by SIGKILL (the OOM killer)",
          "the same: `WorkerCrashed`, logged as perhaps out of memory",
          values={6: "signal=9:r6"}, dead={"r6": "WorkerCrashed"}, workers={"batch_max_records": 8},
          log=("perhaps out of memory",)),
    Fault("hangs-in-process", "plugin",
          "the plugin hangs in `process()`",
          "the worker is stopped after `batch_timeout_s`; the record isolated and dead-lettered",
          values={10: "hang:r10"}, workers={"batch_max_records": 4, "batch_timeout_s": 1.0},
          dead={"r10": "WorkerCrashed"}, log=("exceeded its deadline",)),
    Fault("forks-and-returns", "plugin",
          "the plugin forks and the child returns from `process()`",
          "the child is stopped at once; the record is processed once",
          values={5: "fork:r5"}, check="exactly_once"),
    Fault("forks-a-daemon", "plugin",
          "the plugin starts a long-lived child process",
          "the child is killed with its worker: nothing outlives the supervisor",
          values={5: "forkdaemon:r5"}, check="children_gone"),
    Fault("leaks-memory", "plugin",
          "the plugin leaks memory",
          "its worker is recycled between batches once over `max_rss_mb`",
          values={i: f"leak=40:r{i}" for i in range(0, 40, 4)}, n=40,
          workers={"max_rss_mb": 150, "batch_max_records": 4}, settings={"sleep_ms": 40},
          log=("recycling worker",)),
    Fault("teardown-raises", "plugin",
          "`teardown()` raises",
          "logged; the worker still exits cleanly",
          settings={"fail_teardown": True}, log=("plugin teardown failed",)),
    # ------------------------------------------------------------------ plugin: start-up
    Fault("setup-fails-first-start", "start-up",
          "`setup()` raises on the first start",
          "exit 3 after `start_attempts`, one line naming the error (systemd does not restart)",
          settings={"fail_setup": True}, workers={"start_attempts": 2}, exit=3,
          log=("setup refused: fail_setup is set",)),
    Fault("setup-sys-exit-first-start", "start-up",
          "`setup()` calls `sys.exit(3)` on the first start",
          "the same: exit 3, `setup() called sys.exit(3)`",
          settings={"setup_exit": {"code": 3, "on": [1, 2, 3], "how": "sys"}},
          workers={"start_attempts": 2}, exit=3,
          log=("called sys.exit(3)",)),
    Fault("setup-os-exit-first-start", "start-up",
          "a worker dies in start-up without a word (`os._exit(3)` in `setup()`)",
          "exit 6 (crash loop before any worker was ready; systemd restarts later)",
          settings={"setup_exit": {"code": 3, "on": [1, 2, 3], "how": "os"}},
          workers={"start_attempts": 2}, exit=6,
          log=("during start-up",)),
    Fault("setup-hangs-first-start", "start-up",
          "`setup()` hangs on the first start",
          "killed after `setup_timeout_s`; exit 3 naming the timeout",
          settings={"hang_setup_on": [1, 2]}, workers={"start_attempts": 1, "setup_timeout_s": 2.0}, exit=3,
          log=("setup did not finish within 2 s",)),
    Fault("setup-fails-later", "start-up",
          "`setup()` fails in a later incarnation (after a crash, a recycle, an OOM kill)",
          "retried with back-off for as long as it takes; the daemon goes on",
          values={12: "crash:r12"}, settings={"fail_setup_on": [2, 3]}, workers={"batch_max_records": 8},
          dead={"r12": "WorkerCrashed"}, log=("worker failed to start; retrying",)),
    Fault("setup-os-exit-later", "start-up",
          "a later incarnation dies in `setup()` with status 3",
          "the same: a start failure, retried; never read as 'cannot load the plugin'",
          values={12: "crash:r12"}, settings={"setup_exit": {"code": 3, "on": [2], "how": "os"}},
          workers={"batch_max_records": 8}, dead={"r12": "WorkerCrashed"}),
    Fault("setup-hangs-later", "start-up",
          "`setup()` hangs in a later incarnation",
          "killed after `setup_timeout_s` and started again",
          values={12: "crash:r12"}, settings={"hang_setup_on": [2]},
          workers={"batch_max_records": 8, "setup_timeout_s": 2.0}, dead={"r12": "WorkerCrashed"},
          log=("setup did not finish within 2 s",)),
    # ------------------------------------------------------------------ no dead-letter topic
    Fault("no-dlq-raise", "no dead-letter topic",
          "a record fails and there is no `[dead_letter] topic`",
          "its partition stops there (status: blocked), nothing after it is processed or committed; "
          "`--until-caught-up` exits 7",
          values=values(r21="raise"), n=40, partitions=2, dead_letter=False, exit=7,
          log=("offset 10: ValueError",), check="blocked_at_failure"),
    Fault("no-dlq-crash", "no dead-letter topic",
          "a record keeps crashing workers and there is no `[dead_letter] topic`",
          "the same: blocked, exit 7",
          values=values(r21="crash"), n=40, partitions=2, dead_letter=False, exit=7,
          workers={"batch_max_records": 4}, log=("WorkerCrashed",), check="blocked_at_failure"),
    Fault("no-dlq-too-large", "no dead-letter topic",
          "a record is too large for a ring and there is no `[dead_letter] topic`",
          "the same: blocked, exit 7",
          values={21: "big:r21#" + "z" * 70_000}, n=40, partitions=2, dead_letter=False, exit=7,
          workers={"ring_bytes": 65536}, log=("RecordTooLarge",), check="blocked_at_failure"),
    # ------------------------------------------------------------------ outputs
    Fault("output-topic-from-plugin", "outputs",
          "the plugin sends `Output(topic=...)` and no `[output]` or `[dead_letter]` topic is set",
          "produced to that topic (Spark does the same)",
          values={i: f"route=ROUTED:r{i}" for i in range(0, 40, 5)}, output=False, dead_letter=False,
          no_output=frozenset(f"r{i}" for i in range(40)), check="routed"),
    Fault("outputs-without-topic", "outputs",
          "the plugin returns outputs and no `[output] topic` is set",
          "they are discarded with one warning, and counted (`discarded` in status)",
          output=False, no_output=frozenset(f"r{i}" for i in range(40)),
          log=("no [output] topic is configured",), check="discarded_counted"),
    Fault("output-unreachable", "outputs",
          "outputs cannot be delivered for longer than `delivery_timeout_s` (broker or leader away)",
          "not the records' fault: the partition waits and retries with back-off; nothing is "
          "dead-lettered or committed until it is delivered",
          driver="output_outage", check="outage_recovered", timeout_s=180),
    Fault("output-refused", "outputs",
          "the broker keeps dropping producers' connections",
          "the same: back-off and retry, no dead letters, everything delivered once it recovers",
          driver="output_outage_reset", check="outage_recovered", timeout_s=180),
    Fault("dead-letter-unreachable", "outputs",
          "the dead-letter topic cannot be written while a record fails",
          "the batch waits and is retried; the dead letter is written once the broker is back",
          driver="dead_letter_outage", dead={"r7": "ValueError"}, check="outage_recovered", timeout_s=180),
    Fault("plugin-backoff", "outputs",
          "the plugin raises `Backoff(seconds)` (its downstream is failing)",
          "the partition pauses that long, then the same batch runs again in order; nothing is "
          "dead-lettered",
          values={9: "backoff=1:r9"}, settings={"journal_dir": "JOURNAL"}, check="in_order_once_backed_off"),
    # ------------------------------------------------------------------ deployment
    Fault("forkserver", "deployment",
          '`start_method = "forkserver"`',
          "works end to end, crash isolation included",
          values={10: "crash:r10"}, n=40, partitions=2, workers={"start_method": "forkserver", "processes": 2,
                                                              "batch_max_records": 8},
          dead={"r10": "WorkerCrashed"}),
    Fault("forkserver-supervisor-killed", "deployment",
          'the supervisor is SIGKILLed with `start_method = "forkserver"`',
          "its workers (children of the fork server) die with it",
          driver="supervisor_sigkill", workers={"start_method": "forkserver", "processes": 2}),
    Fault("spawn-supervisor-killed", "deployment",
          "the supervisor is SIGKILLed (spawn)",
          "its workers die with it; the next start reclaims its shared memory",
          driver="supervisor_sigkill", workers={"start_method": "spawn", "processes": 2}),
    Fault("status-dir-missing", "deployment",
          "the status file's directory does not exist, or disappears while running",
          "created at start; a failed write later is a warning, never a crash",
          driver="status_dir_removed", log=("cannot write the status file",)),
    Fault("batch-wait-zero", "deployment",
          "`batch_max_wait_ms = 0`",
          "no busy loop: the supervisor idles on its wake-ups",
          driver="idle_cpu", workers={"batch_max_wait_ms": 0}),
]

BY_ID = {f.id: f for f in FAULTS}
assert len(BY_ID) == len(FAULTS), "fault ids must be unique"
