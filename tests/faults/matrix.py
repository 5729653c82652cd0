"""The fault matrix: every way a record, a plugin, the outputs or the deployment can hurt
the daemon, and what must happen. One row per fault; a new row is one entry here.

Each row runs against the real broker and the real `ringmaster run` (tests/faults/drive.py)
and is checked (tests/faults/test_fault_matrix.py) for its outcome: the exit status, every
good record output, exactly the bad ones dead-lettered with their error type, every offset
committed (or, for a stop, nothing committed past the failing record), and the log line a
user would look for. The "When things go wrong" table of docs/operations.md is generated from the
``when``/``then`` columns (tests/faults/table.py) and checked against this file.

Record values follow tests/plugins/probe.py: ``command[=arg]:id``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.supervisor.workers.workforce import _WATCH_S
from tests.wire import RawRecord

Rows = Callable[[int], list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None]]]
# Records written byte for byte by tests/wire.py (what the Python clients cannot write): a
# RawRecord and whether its batch carries the LogAppendTime attribute.
RawRows = Callable[[int], list[tuple[RawRecord, bool]]]


@dataclass(frozen=True)
class Fault:
    id: str
    group: str  # section of the table in docs/operations.md
    when: str  # "What happens when..."
    then: str  # ... what the runtime does
    values: Mapping[int, str] = field(default_factory=dict)  # record index -> value (others: r<i>)
    rows: Rows | None = None  # custom (key, value, headers) rows instead of values
    raw: RawRows | None = None  # records written byte for byte (tests/wire.py) instead
    env: Mapping[str, str] = field(default_factory=dict)  # the daemon's environment
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
    signals: tuple[str, ...] = ()  # drivers "signals" and "signal_stop": what to send (HUP, ...)
    # A batch runs again after a supervisor or worker dies, or after the broker stalls
    # mid-delivery (a produce that timed out may still have landed): only such rows may show
    # an output twice (at least once); every other row is exactly once. (The output stalls:
    # measured on Apache Kafka, outputs the stall held in flight land once it ends, and the
    # batch the worker gave up on runs again.) (A live worker that
    # runs records again does not write again what was acknowledged: runtime/execution/acked.py.)
    redelivers: bool = False
    protocol: str | None = None  # the daemons' group protocol (None: the session's, tests/helpers.py)
    # output.guarantee: "exactly-once" rows run on Apache Kafka only (Tansu's read_committed
    # returns aborted records) and are judged exactly once, outputs and dead letters, whatever
    # ``redelivers`` says of the same fault under at-least-once.
    guarantee: str = "at-least-once"
    # A share group's configs (kafka-configs --entity-type groups), set before the daemon joins:
    # share.record.lock.duration.ms, share.delivery.count.limit.
    group_configs: Mapping[str, str] = field(default_factory=dict)
    outage_s: float = 0.0  # driver share_output_outage: how long the output topic is missing


def values(**at: str) -> dict[int, str]:
    """values(r5="raise") -> {5: "raise:r5"}"""
    return {int(k[1:]): f"{v}:{k}" for k, v in at.items()}


BIG_PRODUCER = {"message.max.bytes": 4_000_000}  # what the test producer may write
NOT_UTF8 = b"\xff\xfebad-name"  # a header name Go and C producers can write


def unreadable_rows(bad: set[int]) -> RawRows:
    """Records whose header name is not UTF-8 at the indexes in ``bad`` (with a good header
    before it, which the dead letter must keep), plain records elsewhere."""
    def rows(n: int) -> list[tuple[RawRecord, bool]]:
        def headers(i: int) -> list[tuple[bytes, bytes | None]]:
            return [(b"trace", b"t-%d" % i), (NOT_UTF8, b"x")] if i in bad else [(b"trace", b"t-%d" % i)]
        return [(RawRecord(f"r{i}".encode(), f"k{i}".encode(), headers(i), 1_700_000_000_000 + i), False)
                for i in range(n)]
    return rows


def wire_field_rows(n: int, failing: int = 0) -> list[tuple[RawRecord, bool]]:
    """One record per edge of every field that comes off the wire (header names, values and
    counts; keys; timestamps of either type), cycled over n records. Values carry the ids;
    with ``failing``, every failing-th record makes the plugin raise."""
    edges: list[tuple[bytes | None, list[tuple[bytes, bytes | None]], int, bool]] = [
        (b"k", [(b"", b"empty name")], 0, False),
        (b"k", [(b"n" * 100_000, b"very long name")], -1, False),
        (b"k", [(b"dup", b"1"), (b"dup", b"2"), (b"dup", None)], -5, False),
        (b"k", [(b"null", None), (b"empty", b"")], 2**62, False),
        (b"k", [(b"binary", bytes(range(256)))], 1, False),
        (b"k", [(b"large", b"L" * 300_000)], 1_700_000_000_000, False),
        (b"k", [(b"h%d" % j, b"%d" % j) for j in range(3000)], 1_700_000_000_000, False),
        (b"k", [(b"one", b"1")], 0, True),  # LogAppendTime: the broker's time
        (None, [], -1, False),
        (b"", [], 0, True),
        (b"K" * 200_000, [], 7, False),
        (bytes(range(256)) * 4, [("é-名前".encode(), "値".encode())], -(2**40), False),
    ]
    out = []
    for i in range(n):
        key, headers, ts, log_append = edges[i % len(edges)]
        value = f"raise:r{i}" if failing and i % failing == 0 else f"r{i}"
        out.append((RawRecord(value.encode(), key, headers, ts), log_append))
    return out


FAULTS: list[Fault] = [
    # ------------------------------------------------------------------ records
    Fault("null-keys-and-values", "records",
          "records have null or empty keys and values",
          "processed like any other",
          rows=lambda n: [(None if i % 3 == 0 else b"" if i % 3 == 1 else b"k",
                           None if i == 5 else b"" if i == 6 else f"r{i}".encode(), None) for i in range(n)],
          check="null_and_empty"),
    Fault("records-trickle-in", "records",
          "records arrive one at a time, so that the client's queue holds the partition's end "
          "between two of them",
          "each record is run once, in order: an end or a fetch error between records is never "
          "taken for a record",
          # Records come faster than the one worker runs them, so the loop waits for it with
          # records in hand, and the client's short fetch wait answers with the end between
          # records meanwhile; each consume() takes three of what queued.
          driver="trickle", n=10, workers={"batch_max_records": 3}, settings={"sleep_ms": 20},
          sections={"kafka": {"consumer": {"fetch.wait.max.ms": 5}}}),
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
          "the record is dead-lettered as `OutputRejected`; the others' outputs go out once (those the "
          "broker acknowledged before the refusal are not sent again by the retries and bisection)",
          values={6: "bigout=150000:r6"}, sections={"kafka": {"producer": {"message.max.bytes": 100_000}}},
          dead={"r6": "OutputRejected"}),
    # ------------------------------------------------------------------ fields off the wire
    Fault("header-name-not-utf8", "fields off the wire",
          "a record's header name is not UTF-8 (Go and C producers can write one)",
          "dead-lettered by the supervisor as `UnreadableRecord` with its key, value and readable headers; "
          "the rest of its batch goes on",
          raw=unreadable_rows({5, 22}), partitions=2, workers={"processes": 2},
          dead={"r5": "UnreadableRecord", "r22": "UnreadableRecord"}, check="unreadable_dead_letters"),
    Fault("header-name-not-utf8-key-ordering", "fields off the wire",
          "the same with `ordering = \"key\"`",
          "the same: dead-lettered, every other key processed in order",
          raw=unreadable_rows({5, 22}), partitions=2, workers={"processes": 2, "ordering": "key"},
          dead={"r5": "UnreadableRecord", "r22": "UnreadableRecord"}, check="unreadable_dead_letters"),
    Fault("header-name-not-utf8-python", "fields off the wire",
          "the same without the C speedups (`RINGMASTER_NO_SPEEDUPS=1`)",
          "the same",
          raw=unreadable_rows({0, 5, 6, 39}), partitions=2, env={"RINGMASTER_NO_SPEEDUPS": "1"},
          dead={f"r{i}": "UnreadableRecord" for i in (0, 5, 6, 39)}, check="unreadable_dead_letters"),
    Fault("header-name-not-utf8-no-dlq", "fields off the wire",
          "a record's header name is not UTF-8 and there is no `[dead_letter] topic`",
          "its partition stops there (blocked), nothing after it is committed; `--until-caught-up` exits 7",
          raw=unreadable_rows({21}), partitions=2, dead_letter=False, exit=7,
          log=("offset 10: UnreadableRecord",), check="blocked_at_failure"),
    *[Fault(f"wire-field-edges{suffix}", "fields off the wire",
            f"records carry every edge of the wire's fields{what}: empty, 100 KB, duplicated header names; "
            "null, empty, binary, 300 KB header values; 0, 1, 3,000 headers; null, empty, 200 KB, "
            "binary keys; "
            "timestamps 0, -1, negative, far future, LogAppendTime",
            "processed like any other; the plugin sees each field as it was written",
            raw=wire_field_rows, n=48, partitions=2, workers=workers, env=env, check="wire_fields_seen",
            sections={"kafka": {"producer": BIG_PRODUCER}})
      for suffix, what, workers, env in [
          ("", "", {"processes": 2}, {}),
          ("-key-ordering", ' (`ordering = "key"`)', {"processes": 2, "ordering": "key"}, {}),
          ("-python", " (without the C speedups)", {"processes": 1}, {"RINGMASTER_NO_SPEEDUPS": "1"})]],
    Fault("wire-field-edges-failing", "fields off the wire",
          "such records fail in the plugin",
          "dead-lettered with their key, value and headers as written (thousands, binary, empty and "
          "very long names included)",
          raw=lambda n: wire_field_rows(n, failing=3), n=48, partitions=2, workers={"processes": 2},
          dead={f"r{i}": "ValueError" for i in range(0, 48, 3)}, check="wire_dead_letters_keep_fields",
          sections={"kafka": {"producer": BIG_PRODUCER}}),
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
          "the supervisor kills the worker after `batch_timeout_s` (logged as its kill, with why; "
          "counted `killed`); the record isolated and dead-lettered",
          values={10: "hang:r10"}, workers={"batch_max_records": 4, "batch_timeout_s": 1.0},
          dead={"r10": "WorkerCrashed"},
          log=("worker killed by the supervisor (SIG", "): batch exceeded its deadline")),
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
          # The work lasts four of the supervisor's looks at its workers (psutil, every
          # _WATCH_S): a run of 1.6 s could end before a look saw the leak (CI, on Kafka).
          workers={"max_rss_mb": 150, "batch_max_records": 4},
          settings={"sleep_ms": int(4 * _WATCH_S * 1000 / 40)},
          log=("recycling worker",)),
    Fault("leaks-file-descriptors", "plugin",
          "the plugin leaks file descriptors until its worker runs out (`EMFILE` on every record)",
          "the worker's fault, not the records': the batch is not done, the worker is replaced at once "
          "and the batch runs again on the new one; nothing is dead-lettered",
          values={i: f"leakfd=12:r{i}" for i in range(40)}, workers={"batch_max_records": 2},
          settings={"nofile": 96}, log=("ran out of file descriptors",), check="worker_exhausted"),
    Fault("leaks-file-descriptors-slowly", "plugin",
          "the plugin leaks file descriptors slowly",
          "its worker is recycled between batches once it holds 80 % of its `RLIMIT_NOFILE`",
          values={i: f"leakfd=1:r{i}" for i in range(80)}, n=80, workers={"batch_max_records": 1},
          settings={"nofile": 96, "sleep_ms": 200}, log=("open files of its limit",)),
    Fault("plugin-memory-error", "plugin",
          "the plugin hits `MemoryError`",
          "the same: the worker is replaced, the batch runs again; nothing is dead-lettered",
          values={20: "nomem=1:r20"}, workers={"batch_max_records": 4}, log=("ran out of memory",),
          check="worker_exhausted"),
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
    Fault("start-offsets-unanswered", "start-up",
          "the group coordinator takes the daemon in but answers no offset fetch for a while (stuck, "
          "overloaded), with half of each partition committed",
          "each partition waits (status: seeking), nothing runs; once the coordinator answers, and the "
          "client's own unanswered fetch has timed out (`socket.timeout.ms`, 60 s by default), each "
          "starts at its committed offset, never at the reset position",
          partitions=2, driver="start_offsets_unanswered", no_output=frozenset(f"r{i}" for i in range(20)),
          log=("cannot read committed offsets yet",), check="started_at_the_committed_offsets"),
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
          # start_attempts: a first start merely slow on a loaded host (over the 2 s) must not
          # count towards a crash loop with the hang the row is about.
          workers={"batch_max_records": 8, "setup_timeout_s": 2.0, "start_attempts": 10},
          dead={"r12": "WorkerCrashed"}, log=("setup did not finish within 2 s",)),
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
          driver="output_outage", check="outage_recovered", timeout_s=180, redelivers=True),
    Fault("output-refused", "outputs",
          "the broker keeps dropping producers' connections",
          "the same: back-off and retry, no dead letters, everything delivered once it recovers",
          driver="output_outage_reset", check="outage_recovered", timeout_s=180),
    Fault("dead-letter-unreachable", "outputs",
          "the dead-letter topic cannot be written while a record fails",
          "the batch waits and is retried; the dead letter is written once the broker is back",
          driver="dead_letter_outage", dead={"r7": "ValueError"}, check="outage_recovered", timeout_s=180,
          redelivers=True),
    Fault("plugin-backoff", "outputs",
          "the plugin raises `Backoff(seconds)` (its downstream is failing)",
          "the partition pauses that long (up to 1.5 times: jitter), then the same batch runs again in "
          "order; nothing is dead-lettered",
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
          driver="supervisor_sigkill", workers={"start_method": "forkserver", "processes": 2},
          check="reclaimed_by_next_start", redelivers=True),  # the next start reads from the last commit
    Fault("spawn-supervisor-killed", "deployment",
          "the supervisor is SIGKILLed (spawn)",
          "its workers die with it; the next start reclaims its shared memory",
          driver="supervisor_sigkill", workers={"start_method": "spawn", "processes": 2},
          check="reclaimed_by_next_start", redelivers=True),  # the next start reads from the last commit
    # ------------------------------------------------------------------ several members from one command
    # (issue 24.3: `run --members N`; the real-process scenarios are tests/integration/test_members.py)
    Fault("members-batch-with-failures", "deployment",
          "a batch run of two members (`supervisor.members = 2`) meets a crashing and a raising record",
          "each member isolates its own: both dead-lettered, every other record output and committed, exit 0 "
          "once both members caught up",
          env={"RINGMASTER__SUPERVISOR__MEMBERS": "2"}, values={7: "crash:r7", 30: "raise:r30"}, n=60,
          partitions=4, workers={"processes": 2},
          dead={"r7": "WorkerCrashed", "r30": "ValueError"}),
    Fault("members-too-few-workers", "deployment",
          "`supervisor.members` is more than `workers.processes`",
          "exit 2 before any member starts, one line naming both keys (`ringmaster check` says it too)",
          sections={"supervisor": {"members": 3}}, workers={"processes": 2}, exit=2,
          log=("is fewer than supervisor.members",), check="refused_before_kafka"),
    Fault("status-dir-missing", "deployment",
          "the status file's directory does not exist, or disappears while running",
          "created at start; a failed write later is a warning, never a crash",
          driver="status_dir_removed", log=("cannot write the status file",)),
    Fault("batch-wait-zero", "deployment",
          "`batch_max_wait_ms = 0`",
          "no busy loop: the supervisor idles on its wake-ups",
          driver="idle_cpu", workers={"batch_max_wait_ms": 0}, check="idles"),
]

# The control plane and the operator's surface: signals, the admin endpoint, configurations
# that would feed the daemon its own writes, and batch runs (`--until-caught-up`) that cannot
# finish. Same columns, same checks: exit status, records lost, dead letters, commits.
FAULTS += [
    # ------------------------------------------------------------------ signals
    Fault("sighup", "signals",
          "SIGHUP reaches the supervisor, or its whole process group (a terminal hangs up)",
          "a reload (as `ringmaster reload`): each worker is replaced, one at a time, by one running the "
          "config file's plugin, without a rebalance; the workers ignore it; nothing is lost, no worker "
          "crashes, everything is committed",
          driver="signals", signals=("HUP",), check="reloaded_by_signal",
          workers={"start_method": "forkserver"}),  # a hangup must not kill the fork server either
    Fault("sigttin-sigttou", "signals",
          "SIGTTIN, then SIGTTOU, reach the supervisor or its whole process group",
          "one worker more, then one fewer (up to `workers.max_processes`), without a rebalance; the "
          "workers ignore them; nothing is lost, no worker crashes, everything is committed",
          driver="signals", signals=("TTIN", "TTOU"), workers={"max_processes": 4},
          check="resized_by_signal"),
    Fault("sigusr1-sigusr2-sigwinch-sigpipe", "signals",
          "SIGUSR1, SIGUSR2, SIGWINCH or SIGPIPE reach the supervisor or its whole process group",
          "USR1 logs a one-line status; the others are ignored (USR2 and WINCH with a log line)",
          driver="signals", signals=("USR1", "USR2", "WINCH", "PIPE"),
          log=("status: ", "SIGUSR2 ignored", "SIGWINCH ignored"), check="no_worker_died"),
    *[Fault(f"sig{name.lower()}-to-the-group", "signals",
            f"{what} reaches the whole process group",
            "a graceful stop: the batches in progress finish and are committed, exit 0; workers ignore it "
            "(SIGTERM: they stop at once, fenced); the next start goes on from there",
            driver="signal_stop", signals=(name,), log=(f"signal=SIG{name}",), check="stopped_gracefully")
      for name, what in (("TERM", "SIGTERM"), ("INT", "Ctrl-C (SIGINT)"), ("QUIT", "Ctrl-\\ (SIGQUIT)"))],
    # ------------------------------------------------------------------ admin endpoint
    Fault("admin-idle-connections", "admin endpoint",
          "1,000 clients connect to the admin endpoint and send nothing",
          "at most `admin.max_connections` are kept (the longest-waiting makes room for a new one); "
          "/healthz answers throughout; the daemon's descriptors stay bounded",
          driver="admin_idle", check="admin_held_up"),
    Fault("admin-slow-clients", "admin endpoint",
          "clients send their requests a byte at a time (slowloris)",
          "each is closed after `admin.request_timeout_s`; /healthz answers throughout",
          driver="admin_slow", check="admin_held_up"),
    Fault("admin-odd-requests", "admin endpoint",
          "clients send HEAD, POST, PUT, DELETE, OPTIONS, malformed or 100 KB requests",
          "HEAD is answered like GET without a body; other methods get 405 with `Allow: GET, HEAD`, "
          "malformed requests 400, oversized ones 431; the daemon goes on",
          driver="admin_odd", check="admin_held_up"),
    # ------------------------------------------------------------------ the admin listener's address
    # (issue 28: a port in use was exit 2, a configuration error systemd does not restart)
    Fault("admin-port-in-use", "admin endpoint",
          "`admin.listen`'s port is held by another process when the daemon starts",
          "exit 13 (systemd restarts it: the port may be free then), one line naming the address; "
          "nothing consumed, shared memory released",
          driver="admin_port_held", exit=13, log=("Address already in use",), check="one_error_line"),
    Fault("admin-address-not-here", "admin endpoint",
          "`admin.listen` names an address this host does not have (yet: an interface not up)",
          "the same: exit 13, one line naming the address",
          sections={"admin": {"listen": "192.0.2.1:9464", "allow_remote": True}}, exit=13,
          log=("cannot listen on 192.0.2.1:9464",), check="one_error_line"),
    # ------------------------------------------------------------------ configurations
    Fault("output-topic-is-an-input", "configuration",
          "`[output] topic` is one of the input topics",
          "refused by `check` and `run` with one line, exit 2, before anything touches Kafka",
          sections={"output": {"topic": "{in}"}}, exit=2, log=("is also an input topic",),
          check="refused_before_kafka"),
    # (issue 25: credentials; a refused login itself is tests/integration/test_credentials.py,
    # against a broker of its own that requires SCRAM over TLS)
    Fault("password-file-unreadable", "configuration",
          "`kafka.security.password_file` names a file that is not there (a secret not mounted)",
          "the same: refused, exit 2, one line naming the key and the path, never a content",
          sections={"kafka": {"security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                           "username": "svc", "password_file": "/nonexistent/kafka-pw"}}},
          exit=2, log=("kafka.security.password_file", "cannot be read"), check="refused_before_kafka"),
    Fault("security-set-twice", "configuration",
          "`sasl.username` in `[kafka.consumer]` and `username` in `[kafka.security]`",
          "the same: refused, exit 2 (one of the two would be silently unused)",
          sections={"kafka": {"consumer": {"sasl.username": "a"},
                              "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                           "username": "b", "password": "x"}}},
          exit=2, log=("which [kafka.security] sets too",), check="refused_before_kafka"),
    Fault("dead-letter-topic-matched-by-the-pattern", "configuration",
          "the subscription is a pattern (`^rx\\..*`) that matches the dead-letter topic",
          "the same: refused, exit 2, one line naming the topic and the pattern",
          sections={"kafka": {"topics": ["^{in}.*"]}, "dead_letter": {"topic": "{in}.dlq"}}, exit=2,
          log=("matches the subscription pattern",), check="refused_before_kafka"),
    Fault("control-topic-matched-by-the-pattern", "configuration",
          "a pattern subscription matches the group's control topic (`_ringmaster.control.<group>`)",
          "the same: refused, exit 2 (set `[control] topic` outside the pattern)",
          sections={"kafka": {"topics": ["{in}", "^_ringmaster\\..*"]}}, exit=2,
          log=("the control topic",), check="refused_before_kafka"),
    Fault("status-topic-matched-by-the-pattern", "configuration",
          "a pattern subscription matches the group's status topic (`_ringmaster.status.<group>`)",
          "the same: refused, exit 2 (set `control.status_topic` outside the pattern)",
          sections={"kafka": {"topics": ["{in}", "^_ringmaster\\.status\\..*"]}}, exit=2,
          log=("the status topic",), check="refused_before_kafka"),
    # (issue 43: the status records the console reads must never hurt the daemon)
    Fault("status-topic-not-a-topic-name", "configuration",
          "`control.status_topic` is no valid topic name",
          "refused by `check` and `run` with one line naming the key, exit 2, before anything touches Kafka",
          sections={"control": {"status_topic": "not a topic!"}}, exit=2, log=("control.status_topic",),
          check="refused_before_kafka"),
    Fault("transaction-timeout-below-the-message-timeout", "configuration",
          "under exactly-once, `kafka.producer` sets `transaction.timeout.ms` below the producer's "
          "`message.timeout.ms` (`output.delivery_timeout_s`, 30 s by default)",
          "refused by `check` and `run` with one line naming both (librdkafka would refuse every "
          "worker's producer at its start), exit 2, before anything touches Kafka",
          sections={"output": {"guarantee": "exactly-once"},
                    "kafka": {"producer": {"transaction.timeout.ms": 15000}}},
          exit=2, log=("transaction.timeout.ms (15000)",), check="refused_before_kafka"),
    Fault("control-topic-not-a-topic-name", "configuration",
          "`control.topic` is no valid topic name",
          "refused by `check` and `run` with one line naming the key, exit 2, before anything touches Kafka",
          sections={"control": {"topic": "not a topic!"}}, exit=2, log=("control.topic",),
          check="refused_before_kafka"),
    Fault("status-record-too-large", "configuration",
          "a member's status record is larger than the producer's `message.max.bytes` (thousands of "
          "partitions, or a small limit)",
          "the record is dropped and a warning logged (once a minute); the daemon goes on: everything "
          "processed and committed",
          sections={"kafka": {"producer": {"message.max.bytes": 1000}}},
          log=("cannot publish the status record",)),
    Fault("dead-letter-topic-is-the-output-topic", "configuration",
          "`[dead_letter] topic` is `[output] topic`",
          "refused, exit 2: dead letters would reach the outputs' consumers as outputs",
          sections={"dead_letter": {"topic": "{out}"}}, exit=2, log=("dead_letter.topic is output.topic",),
          check="refused_before_kafka"),
    # ------------------------------------------------------------------ batch runs
    Fault("until-caught-up-broker-stays-away", "batch runs (`--until-caught-up`)",
          "the broker goes away during `--until-caught-up` and stays away",
          "exit 9 after `caught_up_timeout_s` without progress, one line naming each partition left and "
          "its records; nothing committed past what was done",
          driver="caught_up_broker_away", exit=9, log=("did not catch up",), check="committed_is_processed"),
    Fault("until-caught-up-commit-unanswered", "batch runs (`--until-caught-up`)",
          "the broker stops answering commits before a batch run ends",
          "exit 9: the final commit gets no answer within `revoke_timeout_s`, the line says so and what is "
          "left; the daemon does not hang",
          driver="caught_up_commit_unanswered", exit=9, log=("its commit was refused",),
          check="committed_is_processed"),
    Fault("until-caught-up-broker-stall", "batch runs (`--until-caught-up`)",
          "the broker stalls past the session timeout during `--until-caught-up` (partitions lost), "
          "then comes back",
          "the partitions come back to the member and the run ends caught up: exit 0 only with every "
          "record committed (it used to exit 0 with a quarter of them); outputs whose delivery timed "
          "out in the stall may be written twice (at least once)",
          driver="caught_up_broker_stall", log=("partitions lost",), redelivers=True),
]

# ---------------------------------------------------------------------- plugin descendants
# Issue 29.8: what a plugin starts, however it detaches, ends with its worker or the daemon
# (a subreaper supervisor; a worker's death read from its pidfd). The SIGKILL-of-the-supervisor
# cases are in tests/integration/test_lineage.py.
FAULTS += [
    Fault("forks-a-setsid-daemon", "plugin",
          "the plugin double-forks a daemon (`setsid`, its parent exits at once: it is nobody's child)",
          "the supervisor, a child subreaper, inherits it and ends it when a worker ends or the daemon "
          "stops: nothing outlives the supervisor",
          values={5: "forksetsid:r5"}, check="children_gone"),
    Fault("starts-a-program", "plugin",
          "the plugin starts a program with `subprocess` and leaves it running",
          "the same: ended with its worker, or at the stop",
          values={5: "popen:r5"}, check="children_gone"),
    Fault("double-forks-then-crashes", "plugin",
          "the plugin double-forks a daemon, then its worker crashes on a later record",
          "the worker's death is seen at once (its pidfd: the daemon holds the worker's pipes open), the "
          "daemon is ended with it, the record is isolated as any crash",
          values={5: "forksetsid:r5", 6: "crash:r6"}, dead={"r6": "WorkerCrashed"},
          workers={"batch_max_records": 8}, log=("ended a process left by the plugin",),
          check="children_gone"),
]

# A worker's whole life is under the failure model (issue 29): a worker killed in any phase
# of a batch, not only in the plugin, and plugins that change the records they were given.
# The deaths are SIGKILLs the worker sends itself from hooks on its own code (tests/plugins/
# probe.py die=PHASE), as the OOM killer would send them; outputs of the batch's other
# records delivered before a death are written again when the batch runs again (at least once).
_PHASES = {"read": "reading its batch (decoding the frame)",
           "deliver": "delivering its outputs (after `process()` returned)",
           "wait": "waiting to retry a failed call",
           "letters": "writing a dead letter",
           "report": "reporting its batch done (outputs acknowledged)"}
FAULTS += [
    *[Fault(f"killed-while-{phase}", "a worker's whole life",
            f"a record gets its worker SIGKILLed (the OOM killer) while {what}",
            "a crash like one in the plugin: the batch counts it, is retried, bisected, the record "
            "dead-lettered as `WorkerCrashed` (the reason says what the worker was doing); the partition "
            "goes on and is committed",
            values={13: f"die={phase}:r13"}, settings={"die_hooks": True}, workers={"batch_max_records": 8},
            dead={"r13": "WorkerCrashed"}, check="death_phase_named", redelivers=True)
      for phase, what in _PHASES.items()],
    Fault("killed-while-deliver-no-dlq", "a worker's whole life",
          "a record gets its worker SIGKILLed while its outputs are delivered and there is no "
          "`[dead_letter] topic`",
          "its partition stops there (blocked), as for a crash in the plugin; `--until-caught-up` exits 7",
          values=values(r21="die=deliver"), n=40, partitions=2, dead_letter=False, exit=7,
          settings={"die_hooks": True}, workers={"batch_max_records": 4}, log=("WorkerCrashed",),
          check="blocked_at_failure"),
    *[Fault(f"plugin-changes-{kind}", "a worker's whole life",
            f"the plugin changes its records' {what}, and one record fails",
            "retries, bisection and the dead letter see the record as read from Kafka: only the failing "
            "record is dead-lettered, with its original key, value, headers and coordinates",
            values=values(r5="raise", r22="raise"), settings={"mutate": [kind]}, partitions=2,
            dead={"r5": "ValueError", "r22": "ValueError"}, check="dead_letters_as_read")
      for kind, what in [("value", "value (`r.value = r.value.decode()`)"),
                         ("object", "value to an object (`r.value = json.loads(r.value)`)"),
                         ("key", "key (to an int)"),
                         ("headers", "headers (an int header appended)"),
                         ("coordinates", "offset, topic and partition"),
                         ("items", "batch list (reversed, a forged record put in)")]],
    Fault("plugin-rejects-a-changed-record", "a worker's whole life",
          "the plugin changes a record and yields it in `Reject`",
          "the record as read is dead-lettered as `Rejected`, at its own partition and offset",
          values=values(r8="reject", r27="reject"), settings={"mutate": ["value", "headers", "coordinates"]},
          partitions=2, dead={"r8": "Rejected", "r27": "Rejected"}, check="dead_letters_as_read"),
]

# ---------------------------------------------------------------- transactional input (issue 29)
# Transaction markers and aborted records take offsets no consumer is handed: a batch run must
# not count them as work left, nor commit one short of them. Driver "transactions"
# (tests/faults/drive.py): per row, the transactions written, (records, committed?).
TRANSACTIONS: dict[str, list[tuple[int, bool]]] = {
    "input-in-committed-transactions": [(10, True), (15, True), (15, True)],
    "input-with-an-aborted-transaction": [(10, True), (10, False), (10, True)],
    "input-ends-with-an-aborted-transaction": [(20, True), (10, False)],
    "failing-record-in-a-transaction": [(20, True), (20, True)],
}
FAULTS += [
    Fault("input-in-committed-transactions", "transactional input",
          "the input was written in committed transactions (Kafka Streams, Flink, an exactly-once "
          "producer): each leaves a commit marker no consumer is handed",
          "every record processed; `--until-caught-up` ends at once, exit 0, committed at each "
          "partition's end, past the last marker (it used to wait for the marker, then exit 9)",
          driver="transactions", partitions=2),
    Fault("input-with-an-aborted-transaction", "transactional input",
          "the input holds an aborted transaction between committed ones",
          "under `read_committed` (the default) its records are not processed (Tansu delivers "
          "them anyway) and are no work left: exit 0, committed at the end",
          driver="transactions", partitions=2),
    Fault("input-ends-with-an-aborted-transaction", "transactional input",
          "the input ends with an aborted transaction",
          "the same: caught up past its records and its abort marker, exit 0",
          driver="transactions"),
    Fault("failing-record-in-a-transaction", "transactional input",
          "a record of a committed transaction fails",
          "dead-lettered as any other; the run ends caught up past the markers, exit 0",
          driver="transactions", partitions=2, values=values(r7="raise", r33="raise"),
          dead={"r7": "ValueError", "r33": "ValueError"}),
]

# ---------------------------------------------------------------- permanent delivery errors (issue 29)
# An output that can never be delivered is its record's fault (dead-lettered after its retries),
# not an outage: an invalid topic name, a topic the plugin routed to that does not exist (with
# auto-creation off). The same refusal from a topic the configuration names is an outage (every
# record would fail alike), and a batch run still ends within caught_up_timeout_s.
NO_AUTO_CREATE = {"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 1000}
MISSING_TOPIC = "ringmaster-matrix-never-created"  # no row creates it
FAULTS += [
    Fault("output-routed-to-an-invalid-topic", "permanent delivery errors",
          "the plugin routes an output to a topic name Kafka refuses (`Output(topic=\"no such topic!\")`)",
          "the record is dead-lettered as `OutputRejected` (\"Invalid topic\": the worker checks the name, "
          "where the client said \"Broker: Invalid topic\" or, on Apache Kafka, sometimes \"Local: Unknown "
          "topic\") after its retries; "
          "the others' outputs go out once (the retries do not send again what the broker acknowledged); "
          "`--until-caught-up` ends, exit 0 (it used to defer the batch for ever)",
          values={6: "route=no such topic!:r6"}, dead={"r6": "OutputRejected"},
          sections={"supervisor": {"caught_up_timeout_s": 20.0}}, log=("Invalid topic",)),
    Fault("output-routed-to-a-missing-topic", "permanent delivery errors",
          "the plugin routes an output to a topic that does not exist, and topics are not created "
          "automatically",
          "the same: dead-lettered as `OutputRejected` (\"Unknown topic or partition\"), exit 0",
          values={6: f"route={MISSING_TOPIC}:r6"}, dead={"r6": "OutputRejected"},
          sections={"kafka": {"producer": NO_AUTO_CREATE}, "supervisor": {"caught_up_timeout_s": 20.0}}),
    Fault("output-topic-missing", "permanent delivery errors",
          "`[output] topic` does not exist, and topics are not created automatically",
          "an outage, not the records' fault: nothing dead-lettered or committed, the batch waits and is "
          "tried again; `--until-caught-up` exits 9 after `caught_up_timeout_s` without progress",
          sections={"kafka": {"producer": NO_AUTO_CREATE}, "output": {"topic": MISSING_TOPIC},
                    "supervisor": {"caught_up_timeout_s": 10.0}},
          exit=9, log=("batch deferred", "did not catch up"), timeout_s=90),
]

# ------------------------------------------- acknowledged outputs not written again (issue 29)
# A batch run again by the same live worker (retries and bisection after a failure, a refused
# output; a deferred batch coming back) does not write again what the broker acknowledged:
# every row here is judged exactly once (runtime/execution/acked.py). A batch handed to another
# worker (a death, a revocation) starts from nothing: at least once, as the rows above say.
INVALID = "no such topic!"
FAULTS += [
    Fault("outputs-refused-in-two-parts-of-a-batch", "acknowledged outputs",
          "two records far apart in one batch each route an output to a topic name Kafka refuses",
          "both dead-lettered as `OutputRejected`; every other record's output written exactly once "
          "through the retries and the bisection that isolate them",
          values={5: f"route={INVALID}:r5", 30: f"route={INVALID}:r30"},
          dead={"r5": "OutputRejected", "r30": "OutputRejected"},
          sections={"supervisor": {"caught_up_timeout_s": 30.0}}),
    Fault("failing-and-refused-records-in-one-batch", "acknowledged outputs",
          "one record raises and another's output is refused, in the same batch",
          "both dead-lettered with their errors; the good records' outputs written exactly once",
          values={5: "raise:r5", 12: f"route={INVALID}:r12"},
          dead={"r5": "ValueError", "r12": "OutputRejected"},
          sections={"supervisor": {"caught_up_timeout_s": 30.0}}),
    Fault("backoff-after-part-of-a-batch-was-written", "acknowledged outputs",
          "the plugin raises `Backoff` after part of its batch was written (a failing record bisected "
          "the batch first)",
          "the batch runs again on the same worker without writing again what was acknowledged: every "
          "output exactly once, the failing record dead-lettered once",
          values={3: "raise:r3", 30: "backoff=1:r30"}, dead={"r3": "ValueError"}),
]

# ------------------------------------------------- more partitions than max_partitions (issue 29)
# The group may give a member more partitions than its epoch table has slots (a member left):
# a state the member lives with (the rest held over capacity: paused, not read, reported),
# never an exit. tests/integration/test_max_partitions.py covers a member leaving a live pair.
FAULTS += [
    Fault("more-partitions-than-max-partitions", "more partitions than `max_partitions`",
          "the group assigns a member more partitions than `supervisor.max_partitions` (a member left)",
          "it takes what fits and holds the rest over capacity: paused, not read, named in a warning, "
          "status and `ringmaster_partitions_over_capacity`; taken in when a slot frees up (it used to "
          "exit 1); a batch run ends exit 9 naming them",
          partitions=6, n=60, sections={"supervisor": {"max_partitions": 4, "caught_up_timeout_s": 10.0}},
          exit=9, log=("held over capacity, not read", "assigned over supervisor.max_partitions"),
          check="over_capacity_untouched", timeout_s=90),
]

# ---------------------------------------------------------------- poisoned dead letters (issue 29)
# Every field redrive reads from a letter is bounded, as the control records are: a letter
# out of bounds is passed over as malformed (counted, committed past, left in the topic), the
# good letters around it are redriven, and redrive never exits "internal error". Driver
# "redrive_letters": per row, which of 8 letters (0-7) are poisoned and how, and the options.
RawHeaders = list[tuple[bytes, bytes | None]]


def _set(name: str, value: bytes) -> Callable[[RawHeaders], RawHeaders]:
    return lambda h: [(k, value if k == f"ringmaster.{name}".encode() else v) for k, v in h]


POISONS: dict[str, Callable[[RawHeaders], RawHeaders]] = {
    "count-5000-digits": lambda h: [*h, (b"ringmaster.redrive.count", b"9" * 5000)],
    "partition-2**32": _set("source.partition", str(2**32).encode()),
    "offset-past-int64": _set("source.offset", str(2**63).encode()),
    "offset-5000-digits": _set("source.offset", b"9" * 5000),
    "failed-at-5000-digits": _set("failed_at_ms", b"9" * 5000),
    "invalid-source-topic": _set("source.topic", b"no such topic!"),
    "header-name-not-utf8": lambda h: [*h, (NOT_UTF8, b"x")],
}
REDRIVE_LETTERS: dict[str, tuple[dict[int, str], tuple[str, ...]]] = {
    "dead-letters-with-fields-out-of-bounds": (
        {1: "count-5000-digits", 3: "partition-2**32", 4: "offset-past-int64", 6: "offset-5000-digits"}, ()),
    "dead-letters-unreadable-or-odd": (
        {0: "header-name-not-utf8", 2: "failed-at-5000-digits", 7: "invalid-source-topic"}, ()),
    "redrive-from-out-of-range": ({}, ("--from", "9" * 5000)),
}
FAULTS += [
    Fault("dead-letters-with-fields-out-of-bounds", "poisoned dead letters (`ringmaster redrive`)",
          "dead letters hold numbers no Kafka type takes (a 5,000-digit `redrive.count`, which any input "
          "record can carry; a source partition of 2**32; an offset past int64)",
          "each is passed over as `malformed` with a warning naming the header, counted, committed past and "
          "left in the topic; the good letters around them are redriven once; exit 0 (it used to exit 1, "
          "\"internal error\", every run)",
          driver="redrive_letters", check="redrive_passed_over_malformed",
          log=("dead letter passed over: a ringmaster.* header is out of bounds",)),
    Fault("dead-letters-unreadable-or-odd", "poisoned dead letters (`ringmaster redrive`)",
          "a dead letter has a header name that is not UTF-8, a 5,000-digit `failed_at_ms`, or a source "
          "topic no broker accepts",
          "the same: passed over as `malformed`, the rest redriven, exit 0",
          driver="redrive_letters", check="redrive_passed_over_malformed"),
    Fault("redrive-from-out-of-range", "poisoned dead letters (`ringmaster redrive`)",
          "`redrive --from` is given a 5,000-digit offset (or a partition past int32, a `--rate` of 1e400)",
          "exit 2 with one line naming the option; nothing read or sent",
          driver="redrive_letters", exit=2, log=("is not an offset",), check="redrive_refused"),
]

# What the host cannot give (issue 28): checked at start, before the cluster is touched, one line
# with the figure and the fix, exit 4 (systemd restarts it: space freed up is picked up).
FAULTS += [
    Fault("shm-too-small-at-start", "the host",
          "`supervisor.shm_dir` has less free than `(processes + 1)` rings need (Docker's 64 MiB "
          "`/dev/shm` and 8 workers of 8 MiB)",
          "exit 4 at start, before Kafka is touched or a worker started: one line with what is free, "
          "what the rings need and the fix (`--shm-size`, an `emptyDir` of medium `Memory`, fewer or "
          "smaller rings); nothing read, nothing committed, nothing left in `shm_dir`",
          workers={"processes": 2, "ring_bytes": 1 << 40}, exit=4,
          log=("but the rings need 3145728 MiB (2 workers + 1 for a reload", "give it more")),
]

# Share groups (issue 27, kafka.group_type = "share", Apache Kafka only; skipped on Tansu): the
# worker and plugin rows again, each record acknowledged instead of offsets committed.
FAULTS += [
    Fault("share-worker-killed", "share groups (Apache Kafka)",
          "in a share group, a record kills its worker (`os._exit`) every time it runs",
          "the batch runs again here first, is bisected, and the record is dead-lettered as `WorkerCrashed`, "
          "then accepted; every other record output and accepted",
          driver="share", values={12: "crash:r12"}, dead={"r12": "WorkerCrashed"}, redelivers=True),
    Fault("share-plugin-raises", "share groups (Apache Kafka)",
          "in a share group, the plugin raises on a record",
          "retried, bisected, dead-lettered with its `ringmaster.delivery_count`, then accepted (not "
          "rejected: the dead letter keeps why)",
          driver="share", values={7: "raise:r7"}, dead={"r7": "ValueError"}, check="share_delivery_count"),
    Fault("share-worker-sigkilled-delivering", "share groups (Apache Kafka)",
          "in a share group, a worker is SIGKILLed while it delivers a batch's outputs",
          "not accepted before its outputs are delivered: the batch runs again here, each record is accepted "
          "once its outputs are",
          driver="share", values={9: "die=deliver:r9"}, settings={"die_hooks": True},
          dead={"r9": "WorkerCrashed"}, redelivers=True),
    Fault("share-broker-stall", "share groups (Apache Kafka)",
          "in a share group, the broker is cut off for longer than the acquisition lock and the share "
          "session while a poll is worked on, then comes back",
          "outputs that cannot be delivered are not accepted (their records kept, then released as the "
          "lock nears its end, with what was not started); acknowledgements the broker refuses once back "
          "are counted as lock expiries, and their records, handed out again, are run again: every "
          "record output (at least once), none rejected, the counts adding up",
          driver="share_broker_stall", n=1500, settings={"sleep_ms": 1}, workers={"batch_max_records": 10},
          log=("acknowledgements refused",), check="share_lock_expiries", redelivers=True, timeout_s=240.0),
]

# Share groups against the delivery limit and the lock (issue 44). Each delivery of a record
# counts, a release included, and at the group's share.delivery.count.limit the broker archives
# a record released or whose lock runs out, with no trace: records held through an outage used
# to be released at every deferral and vanish (2 of 200 under a Backoff of 60 s, 3 of 200 with
# the output topic missing for 60 s, on Apache Kafka's defaults: 5 deliveries, a 30 s lock).
# Here a 5 s lock and 3 deliveries: an outage within limit × lock, and one past it. At a
# record's last delivery the broker hands records out one at a time (seen on Apache Kafka 4.4:
# 40 records released twice came back as 1 a poll), so the rows past the limit have few records.
SHORT_LOCK = {"share.record.lock.duration.ms": "5000", "share.delivery.count.limit": "3"}
_ALL_BACK_OFF = {i: f"backofffor={{s}}:r{i}" for i in range(40)}
FAULTS += [
    Fault("share-backoff-within-the-delivery-limit", "share groups (Apache Kafka)",
          "in a share group, the plugin raises `Backoff` for every record for 6 s, longer than the "
          "acquisition lock (5 s), shorter than the delivery limit × the lock (3 × 5 s)",
          "the deferred records are kept, not released at each deferral (a release spends a delivery), "
          "and run again here when the back-off ends; released only as their lock nears its end, to go "
          "on with a fresh one: every record output once its back-off ends, none dead-lettered",
          driver="share", values={i: v.format(s=6) for i, v in _ALL_BACK_OFF.items()},
          group_configs=SHORT_LOCK, check="share_counts_add_up", redelivers=True),
    Fault("share-backoff-past-the-delivery-limit", "share groups (Apache Kafka)",
          "in a share group, the plugin raises `Backoff` for every record for longer than the delivery "
          "limit × the acquisition lock (3 × 5 s)",
          "never released at its last delivery (the broker would archive it with no trace): as its last "
          "lock nears its end each record is dead-lettered as `DeliveryLimitReached`, with its "
          "`ringmaster.delivery_count` and what held it, then accepted; nothing is lost",
          driver="share", n=2, values={i: v.format(s=600) for i, v in _ALL_BACK_OFF.items() if i < 2},
          dead={f"r{i}": "DeliveryLimitReached" for i in range(2)}, group_configs=SHORT_LOCK,
          check="share_letters_at_the_limit", timeout_s=180.0),
    Fault("share-output-outage-within-the-delivery-limit", "share groups (Apache Kafka)",
          "in a share group, `[output] topic` is missing (auto-creation off) for 6 s: an outage longer "
          "than the acquisition lock, shorter than the delivery limit × the lock",
          "the batches wait (not the records' fault); their records are kept here, not released at each "
          "retry, and every record is output once the topic exists, none dead-lettered",
          driver="share_output_outage", outage_s=6.0, group_configs=SHORT_LOCK,
          check="share_counts_add_up", redelivers=True, timeout_s=180.0),
    Fault("share-output-outage-past-the-delivery-limit", "share groups (Apache Kafka)",
          "in a share group, `[output] topic` is missing (auto-creation off) for longer than the "
          "delivery limit × the acquisition lock",
          "each record is dead-lettered as `DeliveryLimitReached` before its last lock ends (the "
          "dead-letter topic is there), then accepted; nothing is archived without a trace",
          driver="share_output_outage", n=4, outage_s=60.0, group_configs=SHORT_LOCK,
          dead={f"r{i}": "DeliveryLimitReached" for i in range(4)}, check="share_letters_at_the_limit",
          timeout_s=180.0),
    Fault("share-lock-ends-mid-isolation", "share groups (Apache Kafka)",
          "in a share group, a record that kills its worker is in a batch of 200 under a 3 s lock: "
          "finding it takes longer than the lock",
          "the batch is split into its records at once (not bisected: a death per level outlived the "
          "lock, and two members each isolated the record, up to four letters); the record's letter is "
          "written only while this member's lock holds, or at its last delivery, else it is released "
          "and its next delivery isolates it: one dead letter, with its `ringmaster.delivery_count`",
          driver="share", n=200, values={37: "crash:r37"}, dead={"r37": "WorkerCrashed"},
          workers={"batch_max_records": 200}, group_configs={"share.record.lock.duration.ms": "3000"},
          check="share_one_letter_each", redelivers=True, timeout_s=180.0),
    Fault("share-slow-records-in-a-big-poll", "share groups (Apache Kafka)",
          "in a share group, two records among 400 of one producer batch take longer than the "
          "acquisition lock (3 s) on their first delivery",
          "acknowledged batch by batch, not once the whole poll is done; records the loop has not "
          "started as the lock nears its end are released, not run after it: only the records in a "
          "ring with a slow one run twice, not the poll (every record used to run twice)",
          driver="share", n=400, values={50: "firstslow=4000:r50", 300: "firstslow=4000:r300"},
          settings={"sleep_ms": 2}, workers={"batch_max_records": 10},
          group_configs={"share.record.lock.duration.ms": "3000"}, check="share_few_duplicates",
          redelivers=True, timeout_s=180.0),
]

# The rows whose subject is the group protocol at work: a member's death and the rewind to the
# last commit, a graceful leave, a member fenced after a stall, two members sharing
# partitions, an assignment over capacity, a reload and a resize without a rebalance. On
# Apache Kafka each runs again under the other group protocol (tests/faults/protocols.py):
# classic and KIP-848's.
REBALANCE_ROWS = ("spawn-supervisor-killed", "sigterm-to-the-group", "until-caught-up-broker-stall",
                  "members-batch-with-failures", "more-partitions-than-max-partitions", "sighup",
                  "sigttin-sigttou")

# Exactly-once (issue 26, docs/exactly-once.md): the rows whose batches run again after a worker,
# a supervisor or the broker goes away, and their neighbours (plugin exceptions, Backoff, an
# output stall, a rebalance between members, batch runs that end or do not), once more with
# output.guarantee = "exactly-once", each by its own driver (most `run --until-caught-up`,
# judged by the group's offsets the transactions wrote), and judged exactly once by a
# read_committed reader with no exception. Apache Kafka only (drive.run skips them on Tansu).
# Rows that cannot apply under the guarantee, and why:
# - until-caught-up-commit-unanswered: it blocks the supervisor's OffsetCommit, and under the
#   guarantee the supervisor commits nothing (TxnOffsetCommit unanswered: broker-stall below);
# - the key-ordering, share-group and Spark rows: the guarantee needs workers.ordering =
#   "partition" and a consumer group, and refuses Spark (`ringmaster check`);
# - transactional input: under the guarantee the group's offset ends at the offset after the
#   last record, before the marker (no record's transaction commits past it), which the rows'
#   judge (committed at each end) does not expect; tested on its own in
#   tests/integration/test_exactly_once_kafka.py, as is the redrive under the guarantee;
# - configuration, admin and start-up rows: what they test is the same under either guarantee.
_EO_GROUP = "exactly-once (Apache Kafka)"


def _exactly_once(row: str, then: str = ("the same, and a `read_committed` reader finds each output and "
                                          "dead letter once: the batch the worker died in was aborted and "
                                          "ran again"), **changes: Any) -> Fault:
    f = next(f for f in FAULTS if f.id == row)
    return replace(f, id=f"{row}-exactly-once", group=_EO_GROUP, then=then,
                   when=f'{f.when}, under `output.guarantee = "exactly-once"`',
                   guarantee="exactly-once", redelivers=False, **changes)


FAULTS += [
    *[_exactly_once(row) for row in ("segfault", "oom-kill", "killed-while-read", "killed-while-deliver",
                                     "killed-while-wait", "killed-while-letters")],
    _exactly_once("killed-while-report",
                  "its batch's transaction had committed: the batch comes back, is found committed (the "
                  "group's stable offset) and is not run again; nothing dead-lettered, each output once",
                  dead={}, check=None, log=("batch committed already by an earlier transaction",),
                  no_output=frozenset({"r13"})),  # probe.py: die=report writes no output of its own
    _exactly_once("plugin-raises", "the same inside each batch's transaction (retries, bisection and the "
                  "dead letters in it): each output and dead letter once"),
    _exactly_once("plugin-backoff", "the batch's transaction is aborted and the batch runs again after the "
                  "pause, in a new one: each output once", check=None, log=("batch deferred",)),
    _exactly_once("output-unreachable", "the batch's transaction is aborted and it runs again once the "
                  "broker takes outputs again: each output once, nothing committed before it"),
    _exactly_once("spawn-supervisor-killed", "its workers die with it; the next start on the host takes its "
                  "slot, so its workers' transactional ids, and fences the open transactions at once; it "
                  "reads from the group's offsets and writes each output once"),
    _exactly_once("members-batch-with-failures", "each member isolates its own; exit 0 once the group's "
                  "offsets (its transactions') are at the end, each output and dead letter once"),
    _exactly_once("until-caught-up-broker-stall", "the partitions come back and the run ends caught up, the "
                  "transactions under way in the stall aborted: exit 0 with the group's offsets at the end "
                  "and each output once"),
    _exactly_once("until-caught-up-broker-stays-away", "exit 9 after `caught_up_timeout_s`, one line naming "
                  "each partition left with the group's offset; the outputs are exactly those of the records "
                  "below it", check="committed_is_output_once"),
    Fault("supervisor-killed-after-isolation-exactly-once", _EO_GROUP,
          "the last record of a partition SIGKILLs its workers, and the supervisor is SIGKILLed as soon as "
          "it isolates it, under `output.guarantee = \"exactly-once\"`; then started again",
          "the letter and the offset past the record commit in one worker transaction: killed before "
          "it, nothing of it is visible and the next start isolates the record again; killed after "
          "it, the next start reads past the record and runs nothing again. Either way its dead "
          "letter once and the group's offsets at the end",
          driver="supervisor_sigkill_after_isolation", guarantee="exactly-once", n=30,
          values={29: "signal=9:r29"}, dead={"r29": "WorkerCrashed"},
          workers={"batch_max_records": 8}),
    _exactly_once("record-larger-than-ring", "its dead letter is not the supervisor's to write: it stands "
                  "in the record's place in its lane, and a worker's transaction writes it (its value cut to "
                  "fit a ring, `ringmaster.value.truncated` = the original size) with the offset past it: "
                  "once, read_committed; the rest goes on"),
    _exactly_once("too-large-for-ring-and-message-max", "the same, the letter truncated to fit both"),
    _exactly_once("header-name-not-utf8", "its dead letter, with its key, value and readable headers, is "
                  "written by a worker's transaction in the record's place, with the offset past it: once; "
                  "the rest of its batch goes on"),
    Fault("supervisor-killed-after-set-aside-exactly-once", _EO_GROUP,
          "a record too large for every ring is followed by more, and the supervisor is SIGKILLed as soon "
          "as the group's offset is past the batch after it, under `output.guarantee = \"exactly-once\"` "
          "(`linger.ms` 3 s holds back what the supervisor's own producer writes); then started again",
          "the letter is written by a worker's transaction in the record's place in the lane, committed "
          "with the offset past the record, before any later batch runs: its dead letter once, each other "
          "output once, the group's offsets at the end",
          driver="supervisor_sigkill_after_set_aside", guarantee="exactly-once", n=12,
          values={5: "big:r5#" + "z" * 70_000}, dead={"r5": "RecordTooLarge"},
          workers={"ring_bytes": 65536, "batch_max_records": 1},
          sections={"kafka": {"producer": {"linger.ms": 3000}}}),
    # Issue 44: an output the cluster will never take, inside a transaction. librdkafka fails a
    # transaction in which a delivery failed, so the refusal that at-least-once dead-letters at
    # once used to defer the batch for ever (the partition stuck, committed -1001).
    *[_exactly_once(row, "the refusal fails the batch's transaction (librdkafka aborts a transaction in "
                    "which a delivery failed): it is aborted and the batch runs again in a new one that "
                    "knows the refusal, where the record is dead-lettered as `OutputRejected` without its "
                    "output being produced again; exit 0, each output and dead letter once")
      for row in ("output-routed-to-a-missing-topic", "output-routed-to-an-invalid-topic",
                  "output-larger-than-message-max", "outputs-refused-in-two-parts-of-a-batch",
                  "failing-and-refused-records-in-one-batch")],
    Fault("transaction-timed-out-exactly-once", _EO_GROUP,
          "a batch runs longer than the producer's `transaction.timeout.ms` after its first output, "
          "under `output.guarantee = \"exactly-once\"`: the coordinator aborts its transaction and "
          "fences the producer",
          "`TransactionAborted`: the batch is deferred and runs again in a new transaction (a new producer); "
          "no worker crashes and no record is blamed: each output and dead letter once",
          # r3 raises: bisection delivers outputs (the coordinator starts the transaction's clock
          # at its first write), then the part holding r30 sleeps past the timeout (once)
          values={3: "raise:r3", 30: "slowonce=6000:r30"}, dead={"r3": "ValueError"},
          guarantee="exactly-once",
          # librdkafka wants message.timeout.ms (delivery_timeout_s) within transaction.timeout.ms
          sections={"kafka": {"producer": {"transaction.timeout.ms": 3000}},
                    "output": {"delivery_timeout_s": 2.0}},
          log=("batch deferred",), check="transaction_aborted_not_crashed"),
    Fault("broker-stall-exactly-once", _EO_GROUP,
          "the broker stalls past the session timeout in the middle of transactions, under "
          "`output.guarantee = \"exactly-once\"`, then comes back",
          "the partitions are lost at once (no batch waited for, no worker killed) and come back; the "
          "transactions under way carry the generation they started in and are refused; a "
          "`read_committed` reader finds each output once and the offsets end at each partition's end",
          driver="exactly_once_broker_stall", guarantee="exactly-once", log=("partitions lost",)),
    Fault("worker-producer-fenced-exactly-once", _EO_GROUP,
          "a producer with a worker's transactional id starts while the worker's batch is under way (a "
          "zombie's successor: a daemon replacing a dead one on its host), under "
          "`output.guarantee = \"exactly-once\"`",
          "the worker's producer is fenced: its transaction aborted, the batch deferred as an outage "
          "(never the records' fault) and run again by a new producer: each output once, nothing "
          "dead-lettered", driver="producer_fenced", guarantee="exactly-once", n=60,
          settings={"sleep_ms": 40}, workers={"batch_max_records": 8}, log=("batch deferred",)),
]

BY_ID = {f.id: f for f in FAULTS}
assert len(BY_ID) == len(FAULTS), "fault ids must be unique"
