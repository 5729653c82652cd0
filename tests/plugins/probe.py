"""A test plugin driven by record values, with a journal of what it processed.

A value is ``[command[=arg]:]id[#padding]``. Plain ids are processed: the output is JSON
with the id and where it came from. Commands (per record, in ``process``):

==================  =====================================================================
raise               raise ValueError
crash               os._exit(13)
osexit=N            os._exit(N)
sysexit=N           sys.exit(N)
signal=N            os.kill(self, N)
hang                sleep for an hour
reject              Reject(record) through the API
return=KIND         process() returns a wrong type for the whole batch: str, dict, int0,
                    false, emptystr, bytes
yield=KIND          process() yields a wrong item: dict, int, tuple3, outdict (Output value
                    a dict), outkeyint, outheaders, outtopic
fork                os.fork(); the child goes on as if nothing happened (the runtime must
                    stop it), the parent processes the record
forkdaemon          fork a child that sleeps for an hour and writes its pid to pid_dir
forksetsid          a daemon's double fork: a child calls setsid() and forks a grandchild that
                    sleeps for an hour (its pid to pid_dir, forksetsid-<pid>.pid), then exits (reaped
                    at once)
popen               start ``sleep 3600`` with subprocess (its pid to pid_dir, popen-<pid>.pid)
leak=MiB            keep MiB of memory for good
leakfd=N            open N file descriptors and keep them for good (OSError EMFILE once the
                    worker has none left: the plugin's error, as a leaking plugin would raise it)
nomem=N             raise MemoryError the first N times this id is seen (state_dir)
bigout=N            an output of N bytes
route=TOPIC         the output goes to TOPIC (Output(topic=...))
backoff=S           raise Backoff(S) the first time this id is seen (state_dir), then process
backoffall=S        the same with scope="all"
flaky=N             raise the first N times this id is seen (state_dir), then process
firstslow=MS        sleep MS on the record's first delivery (record.delivery_count 1: share
                    groups), then process
slowonce=MS         sleep MS the first time this id is seen (state_dir), then process
backofffor=S        raise Backoff(0.5) while less than S seconds have passed since a record with
                    this command was first seen (state_dir): a downstream down for S seconds
                    from the first record that met it, for every record that needs it
notopic             yield an Output without a topic (and nothing else for this record)
die=PHASE           the worker SIGKILLs itself (as the OOM killer would) in that phase of the
                    batch holding this record, through hooks on the worker's own code that
                    setup() installs with the ``die_hooks`` setting: ``read`` (decoding the
                    frame), ``deliver`` (producing this record's output), ``wait`` (the record
                    raises; the retry's back-off), ``letters`` (the record raises; writing its
                    dead letter), ``report`` (sending the batch's result)
==================  =====================================================================

Every output is JSON: ``id``, ``p``, ``o``, ``pid``, ``key`` (its length), ``h`` (a digest of
the headers as the plugin saw them, ``headers_digest``), ``ts`` (the timestamp pair) and, in a
share group, ``n`` (the record's delivery count).

Settings: ``sleep_ms`` per record; ``slow_keys`` ({key: ms}, extra time per record of a key);
``journal_dir`` (one file per worker process: ``topic partition offset pid monotonic_ns
key-hex`` per record, written per batch); ``state_dir``
(files that outlive worker restarts); ``pid_dir``; ``fail_setup`` (always) or
``fail_setup_on`` (incarnations, e.g. [2, 3]: ``worker-0.2`` is incarnation 2 of worker 0);
``setup_exit`` {code, on, how: "os"|"sys"}; ``hang_setup_on``; ``fail_teardown``; ``nofile``
(the worker's soft RLIMIT_NOFILE, set in setup: leaks run out sooner); ``die_hooks`` (install
the hooks of ``die=PHASE``); ``mutate`` (a list of what ``process`` changes in the records and
the batch list it was given, after reading them and before it fails or rejects: ``value``
(decoded to str), ``object`` (a dict), ``key``, ``headers`` (an int header appended),
``coordinates`` (offset, topic, partition), ``items`` (the list reversed, a forged record put
in), ``reject`` (every record's Reject carries the changed record)).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from runtime.plugin import Backoff, Context, Output, Record, Reject

_sleep_s = 0.0
_journal: int | None = None
_state_dir: str | None = None
_pid_dir: str | None = None
_leaked_children: list[subprocess.Popen[bytes]] = []
_fail_teardown = False
_slow_keys: dict[bytes, float] = {}
_leaked: list[bytearray] = []
_leaked_fds: list[int] = []


def _incarnation(context: Context) -> int:
    """worker-0.2 is incarnation 2 of worker 0 (a Spark worker, spark-<pid>, counts as 1)."""
    tail = context.worker_id.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else 1


def setup(context: Context) -> None:
    global _sleep_s, _journal, _state_dir, _pid_dir, _fail_teardown, _slow_keys
    s = context.settings
    n = _incarnation(context)
    if s.get("fail_setup") or n in s.get("fail_setup_on", ()):
        raise RuntimeError("setup refused: fail_setup is set")
    exit_cfg = s.get("setup_exit")
    if exit_cfg and n in exit_cfg.get("on", ()):
        if exit_cfg.get("how") == "sys":
            sys.exit(exit_cfg["code"])
        os._exit(exit_cfg["code"])
    if n in s.get("hang_setup_on", ()):
        time.sleep(3600)
    if s.get("nofile"):
        import resource

        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (int(s["nofile"]), hard))
    _sleep_s = float(s.get("sleep_ms", 0)) / 1000
    _state_dir = s.get("state_dir")
    _pid_dir = s.get("pid_dir")
    _fail_teardown = bool(s.get("fail_teardown"))
    _slow_keys = {k.encode(): float(ms) / 1000 for k, ms in s.get("slow_keys", {}).items()}
    global _mutate
    _mutate = frozenset(s.get("mutate", ()))
    if s.get("die_hooks"):
        _install_die_hooks()
    jdir = s.get("journal_dir")
    if jdir:
        _journal = os.open(os.path.join(jdir, f"{os.getpid()}.log"),
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)


_DIE_HEADER = "probe.die"
_armed: str | None = None  # die=PHASE seen in the batch being processed (wait, report)
_mutate: frozenset[str] = frozenset()


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)


def _install_die_hooks() -> None:
    """Hooks on the worker's own code paths after process() (test-only: how else would a
    plugin get its worker killed while the runtime delivers, retries or reports)."""
    import runtime.execution.run as execution
    import runtime.worker.decoding as decoding
    import runtime.worker.process as process
    from runtime.kafka.producer import OutputProducer
    from runtime.transport.frames import ResultKind, decode_result

    records_of, produce, backoff = decoding.records_of, OutputProducer.produce, execution.backoff_s
    send = process.send_message

    def reading(frame: Any) -> list[Record]:
        records = records_of(frame)
        if any((r.value or b"").startswith(b"die=read:") for r in records):
            _die()
        return records

    def producing(self: Any, topic: str, value: bytes | None, key: bytes | None = None,
                  headers: Any = None, *args: Any, **kw: Any) -> None:
        if (value or b"").startswith(b"die=letters:") or any(k == _DIE_HEADER for k, _ in headers or ()):
            _die()
        produce(self, topic, value, key, headers, *args, **kw)

    def waiting(*args: Any, **kw: Any) -> float:
        if _armed == "wait":
            _die()
        return backoff(*args, **kw)

    def reporting(fd: int, message: bytes) -> None:
        if _armed == "report" and decode_result(message).kind is ResultKind.DONE:
            _die()
        send(fd, message)

    decoding.records_of = reading  # every runner reads a frame's records through decoding.frame_records
    OutputProducer.produce = producing  # type: ignore[method-assign]
    execution.backoff_s = waiting
    process.send_message = reporting


def _mutated(batch: Sequence[Record]) -> None:
    """What a careless plugin does to the records it was given (the ``mutate`` setting)."""
    for r in batch:
        if "value" in _mutate:
            r.value = (r.value or b"").decode(errors="replace")  # type: ignore[assignment]
        if "object" in _mutate:
            r.value = {"was": (r.value or b"")[:10].decode(errors="replace")}  # type: ignore[assignment]
        if "key" in _mutate:
            r.key = 7  # type: ignore[assignment]
        if "headers" in _mutate:
            if r.headers is None:
                r.headers = []
            r.headers.append(("probe.int", 7))  # type: ignore[arg-type]
        if "coordinates" in _mutate:
            r.offset, r.topic, r.partition = r.offset + 1000, "elsewhere", r.partition + 7
    if "items" in _mutate and isinstance(batch, list) and batch:
        batch.reverse()
        batch[0] = Record("forged", 99, 99, None, b"forged", None, (0, 0))


def teardown() -> None:
    if _fail_teardown:
        raise RuntimeError("teardown refused: fail_teardown is set")


def _seen(name: str) -> int:
    """How many times this name was seen before (a file per name in state_dir)."""
    assert _state_dir, "this command needs the state_dir setting"
    path = os.path.join(_state_dir, name.replace("/", "_"))
    try:
        with open(path) as f:
            n = int(f.read() or 0)
    except FileNotFoundError:
        n = 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    return n


def _first_seen(name: str) -> float:
    """When this name was first seen (wall-clock seconds, a file per name in state_dir)."""
    assert _state_dir, "this command needs the state_dir setting"
    path = os.path.join(_state_dir, name.replace("/", "_"))
    try:
        with open(path) as f:
            return float(f.read())
    except FileNotFoundError:
        now = time.time()
        with open(path, "w") as f:
            f.write(repr(now))
        return now


def parse(value: str) -> tuple[str, str, str]:
    """(command, argument, id) of a value."""
    head = value.split("#", 1)[0]
    if ":" not in head:
        return "", "", head
    cmd, ident = head.split(":", 1)
    name, _, arg = cmd.partition("=")
    return name, arg, ident


_WRONG_RETURNS: dict[str, Any] = {"str": "abc", "dict": {"a": 1}, "int0": 0, "false": False,
                                  "emptystr": "", "bytes": b"xyz"}


def _wrong_item(kind: str, r: Record) -> Any:
    return {"dict": {"a": 1}, "int": 42, "tuple3": (b"k", b"v", b"x"),
            "outdict": Output({"a": 1}),  # type: ignore[arg-type]
            "outkeyint": Output(b"v", key=7),  # type: ignore[arg-type]
            "outheaders": Output(b"v", headers="h=1"),  # type: ignore[arg-type]
            "outtopic": Output(b"v", topic=""),
            }[kind]


def headers_digest(headers: Any) -> str | None:
    """What the plugin saw of a record's headers, in a few bytes (tests compare it with what
    was written)."""
    return None if headers is None else hashlib.sha1(repr(headers).encode()).hexdigest()


def process(batch: Sequence[Record]) -> Iterator[Any] | Any:
    global _armed
    _armed = None
    lines = []
    outs: list[Any] = []
    given = list(batch)
    # With ``mutate``: what the records were, read before the plugin changes them.
    seen = [Record(r.topic, r.partition, r.offset, r.key, r.value,
                   None if r.headers is None else list(r.headers), r.timestamp)
            for r in given] if _mutate else given
    if _mutate:
        _mutated(batch)
    for g, r in zip(given, seen, strict=True):
        value = (r.value or b"").decode(errors="replace")
        cmd, arg, ident = parse(value)
        if cmd == "raise":
            raise ValueError(f"poison record {value}")
        if cmd == "die" and arg in ("wait", "letters"):
            _armed = arg
            raise ValueError(f"poison record {value}: its worker dies when it {arg}")
        if cmd == "die" and arg == "report":
            _armed = arg
            continue  # no output of its own: the batch's others are acknowledged, then the worker dies
        if cmd == "crash":
            os._exit(13)
        if cmd == "osexit":
            os._exit(int(arg))
        if cmd == "sysexit":
            sys.exit(int(arg))
        if cmd == "signal":
            os.kill(os.getpid(), int(arg))
            time.sleep(5)
        if cmd == "hang":
            time.sleep(3600)
        if cmd == "return":
            return _WRONG_RETURNS[arg]
        if cmd == "yield":
            outs.append(_wrong_item(arg, r))
            continue
        if cmd == "fork" and os.fork() == 0:
            pass  # the child goes on through the rest of process(), as a careless plugin would
        if cmd == "forkdaemon":
            pid = os.fork()
            if pid == 0:
                try:
                    time.sleep(3600)
                finally:
                    os._exit(0)
            if _pid_dir:
                with open(os.path.join(_pid_dir, f"{pid}.pid"), "w") as f:
                    f.write(str(pid))
        if cmd == "forksetsid":
            _double_fork()
        if cmd == "popen":
            _leaked_children.append(subprocess.Popen(["sleep", "3600"]))
            _write_pid(_leaked_children[-1].pid, "popen-")
        if cmd == "leak":
            _leaked.append(bytearray(int(arg) * 2**20))
        if cmd == "leakfd":
            for _ in range(int(arg)):
                _leaked_fds.append(os.open(os.devnull, os.O_RDONLY))  # OSError EMFILE when none left
        if cmd == "nomem" and _seen(f"nomem-{r.topic}-{r.partition}-{r.offset}") < int(arg):
            raise MemoryError(f"no memory for {ident}")
        if cmd in ("backoff", "backoffall") and _seen(f"backoff-{r.topic}-{r.partition}-{r.offset}") == 0:
            raise Backoff(float(arg), f"downstream down for {ident}",
                          scope="all" if cmd == "backoffall" else "partition")
        if cmd == "flaky" and _seen(f"flaky-{r.topic}-{r.partition}-{r.offset}") < int(arg):
            raise RuntimeError(f"flaky record {value}")
        if cmd == "firstslow" and g.delivery_count == 1:
            time.sleep(int(arg) / 1000)
        if cmd == "slowonce" and _seen(f"slowonce-{r.topic}-{r.partition}-{r.offset}") == 0:
            time.sleep(int(arg) / 1000)
        if cmd == "backofffor" and time.time() - _first_seen("backofffor") < float(arg):
            raise Backoff(0.5, f"downstream down for {arg} s ({ident})")
        if _sleep_s:
            time.sleep(_sleep_s)
        if r.key in _slow_keys:
            time.sleep(_slow_keys[r.key])
        if cmd == "reject":
            outs.append(Reject(g, f"rejected {value}"))  # the record it was given, changed or not
            continue
        key = "-" if r.key is None else r.key.hex()
        lines.append(f"{r.topic} {r.partition} {r.offset} {os.getpid()} {time.monotonic_ns()} {key}\n")
        fields = {"id": ident if cmd else value.split("#", 1)[0], "p": r.partition, "o": r.offset,
                  "pid": os.getpid(), "key": None if r.key is None else len(r.key),
                  "h": headers_digest(r.headers), "ts": list(r.timestamp)}
        if g.delivery_count is not None:
            fields["n"] = g.delivery_count
        body = json.dumps(fields).encode()
        if cmd == "bigout":
            body = body + b" " * int(arg)
        if cmd == "notopic":
            outs.append(Output(body, key=r.key, topic=None))
            continue
        headers = [(_DIE_HEADER, b"deliver")] if cmd == "die" and arg == "deliver" else None
        outs.append(Output(body, key=r.key, headers=headers, topic=arg if cmd == "route" else None))
    if _journal is not None and lines:
        os.write(_journal, "".join(lines).encode())
    return iter(outs)


def _write_pid(pid: int, prefix: str) -> None:
    if _pid_dir:
        with open(os.path.join(_pid_dir, f"{prefix}{pid}.pid"), "w") as f:
            f.write(str(pid))


def _double_fork() -> None:
    """What a daemon does to leave its parent: the grandchild is in a session of its own and
    its parent is gone (the kernel gives it to the nearest subreaper, or init)."""
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        try:
            os.setsid()
            grandchild = os.fork()
            if grandchild == 0:
                os.close(w)
                try:
                    time.sleep(3600)
                finally:
                    os._exit(0)
            os.write(w, str(grandchild).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        grandchild_pid = int(f.read() or 0)
    os.waitpid(child, 0)
    if grandchild_pid:
        _write_pid(grandchild_pid, "forksetsid-")
