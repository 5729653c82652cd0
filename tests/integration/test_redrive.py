"""``ringmaster redrive`` against the real broker and the real CLI: dead letters of a fixed bug
come back exactly once, a redrive stops and resumes without loss or duplicates, dry runs and
filters, the redrive bound, through the plugin, truncated and reference letters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from helpers import (
    PLUGINS,
    ROOT,
    Broker,
    committed,
    daemon_config,
    make_topics,
    produce_rows,
    read_all,
    run_until_caught_up,
    to_toml,
    unique,
    wait_for,
)
from proxy import PRODUCE, Proxy

from runtime.execution.deadletter_format import (
    HEADER_PREFIX,
    REDRIVE_COUNT,
    dead_letter_headers,
    fit_dead_letter,
    reference_dead_letter,
)
from runtime.kafka.topic_reader import RecordFetcher, partition_bounds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

COUNT = REDRIVE_COUNT


def config(broker: Any, names: dict[str, str], tmp: Path, **settings: Any) -> dict[str, Any]:
    c = daemon_config(broker, names, tmp, plugin="fixable", settings=settings)
    c["dead_letter"].update({"max_attempts": 2, "retry_backoff_s": 0.01})
    c["supervisor"]["commit_interval_ms"] = 100
    return c


class Redrive:
    """One ``ringmaster redrive`` in a subprocess."""

    def __init__(self, cfg: dict[str, Any], tmp: Path, *args: str, name: str = "redrive",
                 as_json: bool = True) -> None:
        self.config_path = tmp / f"{name}.toml"
        self.config_path.write_text(to_toml(cfg))
        self.err_path = tmp / f"{name}.err"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
        self._err = open(self.err_path, "ab")  # noqa: SIM115
        cmd = [sys.executable, "-m", "runtime.cli", "redrive", "-c", str(self.config_path),
               *(["--json"] if as_json else []), *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, env=env, cwd=ROOT)
        self.stdout = ""

    def finish(self, timeout_s: float = 60) -> tuple[int, dict[str, Any]]:
        try:
            out, _ = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            raise AssertionError(f"redrive did not end in {timeout_s} s:\n{self.log()}") from None
        finally:
            self._err.close()
        self.stdout = out.decode(errors="replace")
        try:
            return self.proc.returncode, json.loads(out)
        except ValueError:
            raise AssertionError(f"exit {self.proc.returncode}, no JSON summary: {out!r}\n"
                                 f"{self.log()}") from None

    def log(self) -> str:
        return "\n".join(self.err_path.read_text(errors="replace").splitlines()[-40:])


def redrive(cfg: dict[str, Any], tmp: Path, *args: str, expect: int = 0,
            name: str = "redrive") -> dict[str, Any]:
    r = Redrive(cfg, tmp, *args, name=name)
    code, summary = r.finish()
    assert code == expect, f"exit {code}, expected {expect}: {summary}\n{r.log()}"
    return summary


def outputs_by_id(bootstrap: str, topic: str) -> Counter[str]:
    return Counter(json.loads(m.value())["id"] for m in read_all(bootstrap, topic))


def letter(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
           headers: list[tuple[str, bytes | None]] | None = None, error_type: str = "ValueError",
           count: int | None = None, failed_at_ms: int | None = None) -> tuple[Any, Any, Any]:
    """A dead letter as a worker writes it (runtime.execution.deadletter_format), as a row."""
    original = list(headers or [])
    if count is not None:
        original.append((COUNT, str(count).encode()))
    h = dead_letter_headers(original, error_type=error_type, message="m", traceback="", topic=topic,
                            partition=partition, offset=offset, attempts=1, worker="worker-0.1")
    if failed_at_ms is not None:
        h = [(k, str(failed_at_ms).encode() if k == HEADER_PREFIX + "failed_at_ms" else v) for k, v in h]
    return key, value, h


def hdict(m: Any) -> dict[str, bytes | None]:
    return dict(m.headers() or [])


# ---------------------------------------------------------------------------- the fixed bug
def test_after_the_fix_a_redrive_brings_every_dead_letter_back_exactly_once(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    bs = broker.bootstrap
    make_topics(bs, 2, names["in"], names["dlq"])
    make_topics(bs, 1, names["out"])
    rows = [(f"k{i}".encode(), f"{'bug' if i % 10 == 3 else 'ok'}:r{i}".encode(),
             [("trace", f"t{i}".encode()), ("empty", None)]) for i in range(200)]
    produce_rows(bs, names["in"], rows, 2)
    bugs = {f"r{i}" for i in range(200) if i % 10 == 3}

    run_until_caught_up(config(broker, names, tmp_path, fixed=False), tmp_path, name="buggy")
    dead = read_all(bs, names["dlq"])
    assert {m.value().decode().split(":")[1] for m in dead} == bugs
    first = outputs_by_id(bs, names["out"])
    assert set(first) == {f"r{i}" for i in range(200)} - bugs

    fixed = config(broker, names, tmp_path, fixed=True)
    summary = redrive(fixed, tmp_path)
    assert summary["redriven"] == [{"error_type": "ValueError", "source_topic": names["in"], "records": 20}]
    assert summary["ending"] == "end" and summary["skipped"] == {}
    copies = [m for m in read_all(bs, names["in"]) if COUNT in hdict(m)]
    assert len(copies) == 20
    originals = {m.value(): m for m in dead}
    for c in copies:
        dl = originals[c.value()]
        h = hdict(dl)
        assert c.key() == dl.key()
        assert c.partition() == int(h[HEADER_PREFIX + "source.partition"]), "back to its own partition"
        assert c.headers() == [("trace", hdict(dl)["trace"]), ("empty", None), (COUNT, b"1")], \
            "the original headers exactly, then the count"

    run_until_caught_up(fixed, tmp_path, name="fixed")
    total = outputs_by_id(bs, names["out"])
    assert total == Counter({f"r{i}": 1 for i in range(200)}), "every record processed exactly once"
    redriven = [json.loads(m.value()) for m in read_all(bs, names["out"])]
    assert {o["id"] for o in redriven if o["count"] == 1} == bugs
    assert all(o["headers"][0][0] == "trace" for o in redriven)

    again = redrive(fixed, tmp_path, name="again")
    assert again["ending"] == "nothing" and again["redriven_total"] == 0, "no letter is redriven twice"
    assert len([m for m in read_all(bs, names["in"]) if COUNT in hdict(m)]) == 20


# ---------------------------------------------------------------------------- stop and resume
class Tail:
    """Counts the records arriving in a topic, as they arrive."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self._c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("tail"),
                            "enable.auto.commit": False})
        self._c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._n = 0

    def count(self) -> int:
        self._n += sum(1 for m in self._c.consume(1000, 0.05) if m.error() is None)
        return self._n

    def __enter__(self) -> Tail:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._c.close()


def copies_by_id(bootstrap: str, topic: str) -> Counter[bytes]:
    return Counter(m.value() for m in read_all(bootstrap, topic) if COUNT in hdict(m))


def test_a_redrive_stopped_half_way_resumes_where_it_stopped_without_loss_or_duplicates(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """SIGTERM half way: the redrive stops taking letters, waits for the copies in flight to be
    acknowledged, commits, and exits 8; the next run goes on from there. The bound asserted is
    zero duplicates: a clean stop commits exactly the acknowledged prefix, so at-least-once
    costs nothing here (only a SIGKILL may send again what was sent after the last commit)."""
    bs = broker.bootstrap
    make_topics(bs, 2, names["in"], names["dlq"])
    make_topics(bs, 1, names["out"])
    n = 120
    produce_rows(bs, names["dlq"], [letter(names["in"], i % 2, i // 2, f"k{i}".encode(), f"ok:r{i}".encode())
                                    for i in range(n)], 2)
    cfg = config(broker, names, tmp_path, fixed=True)
    first = Redrive(cfg, tmp_path, "--rate", "20", name="first")
    with Tail(bs, names["in"], 2) as tail:
        wait_for(lambda: first.proc.poll() is not None or tail.count() >= 30, 30, "30 letters redriven")
    first.proc.send_signal(signal.SIGTERM)
    code, summary = first.finish()
    assert code == 9, first.log()
    assert summary["ending"] == "stopped"
    done = summary["redriven_total"]
    assert 30 <= done < n, f"stopped half way: {done}"
    group = f"{names['group']}.redrive"
    cursor = committed(bs, group, names["dlq"], 2)
    assert sum(max(0, o) for o in cursor.values()) == done, f"the cursor is after every copy sent: {cursor}"

    second = redrive(cfg, tmp_path, name="second")
    assert second["redriven_total"] == n - done and second["ending"] == "end"
    assert copies_by_id(bs, names["in"]) == Counter({f"ok:r{i}".encode(): 1 for i in range(n)})
    assert committed(bs, group, names["dlq"], 2) == {0: n // 2, 1: n // 2}


# ---------------------------------------------------------------------------- dry run, filters
def test_a_dry_run_counts_by_error_type_and_reason_and_sends_and_commits_nothing_then_a_filter_takes_one_type(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    i = iter(range(1000))
    rows = [letter(names["in"], 0, next(i), b"k", f"bug:v{n}".encode()) for n in range(6)]
    rows += [letter(names["in"], 0, next(i), b"k", f"bad:r{n}".encode(), error_type="Rejected")
             for n in range(4)]
    rows += [letter(names["in"], 0, next(i), b"k", b"ok:c", error_type="Rejected", count=3)
             for _ in range(2)]
    rows += [letter(names["in"], 0, next(i), b"k", b"ok:w", error_type="WorkerCrashed")]
    rows += [(b"k", b"not a dead letter", [("app", b"1")])]
    rows += [letter("another-groups-topic", 0, next(i), b"k", b"ok:o")]
    produce_rows(bs, names["dlq"], rows, 1)
    cfg = config(broker, names, tmp_path, fixed=True)
    group = f"{names['group']}.redrive"

    dry = redrive(cfg, tmp_path, "--dry-run", name="dry")
    assert dry["dry_run"] and dry["ending"] == "end"
    assert {(r["error_type"], r["records"]) for r in dry["redriven"]} == {
        ("ValueError", 6), ("Rejected", 4), ("WorkerCrashed", 1)}
    assert dry["skipped"] == {"max-redrives": 2, "not-a-dead-letter": 1, "other-source": 1}
    plugin_dry = redrive(cfg, tmp_path, "--dry-run", "--through-plugin", name="dry-plugin")
    assert plugin_dry["skipped"]["crashed-a-worker"] == 1, "a record that crashed a worker is not run here"
    table = Redrive(cfg, tmp_path, "--dry-run", name="dry-table", as_json=False)
    with pytest.raises(AssertionError, match="no JSON summary"):
        table.finish()
    code, out = table.proc.returncode, table.stdout
    assert code == 0 and "would redrive" in out and "ValueError" in out and "max-redrives" in out, out
    assert committed(bs, group, names["dlq"], 1) == {0: -1001}, "a dry run commits nothing"
    assert read_all(bs, names["in"]) == [], "a dry run sends nothing"

    only = redrive(cfg, tmp_path, "--error-type", "ValueError", "--error-type", "WorkerCrashed",
                   name="only")
    assert {(r["error_type"], r["records"]) for r in only["redriven"]} == {
        ("ValueError", 6), ("WorkerCrashed", 1)}
    assert only["skipped"] == {"not-selected": 6, "not-a-dead-letter": 1, "other-source": 1}
    assert sorted(m.value() for m in read_all(bs, names["in"])) == sorted(
        [f"bug:v{n}".encode() for n in range(6)] + [b"ok:w"])
    assert committed(bs, group, names["dlq"], 1) == {0: len(rows)}, "passed over: the cursor moved past them"


# ---------------------------------------------------------------------------- through the plugin
def test_through_the_plugin_a_record_that_keeps_failing_goes_round_at_most_max_redrives_times(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    rows = [letter(names["in"], 0, n, f"k{n}".encode(), f"{kind}:{kind}{n}".encode(),
                   [("trace", f"t{n}".encode())], error_type="ValueError" if kind == "bug" else "Rejected")
            for n, kind in enumerate(["bug", "bad", "bug", "bad", "bug", "bad"])]
    produce_rows(bs, names["dlq"], rows, 1)
    backoffs = tmp_path / "backoffs"
    backoffs.mkdir()
    cfg = config(broker, names, tmp_path, fixed=True, backoff_dir=str(backoffs), backoff_s=0.1)

    first = redrive(cfg, tmp_path, "--through-plugin", "--max-redrives", "2", name="first")
    assert first["redriven_total"] == 6 and first["failed_again"] == 3 and first["outputs"] == 3
    outs = [json.loads(m.value()) for m in read_all(bs, names["out"])]
    assert sorted(o["id"] for o in outs) == ["bug0", "bug2", "bug4"], "each fixed record once"
    assert all(o["count"] == 1 and o["headers"] == [["trace", f"t{o['id'][3:]}".encode().hex()]]
               for o in outs)
    assert sorted(os.listdir(backoffs)) == ["bug0", "bug2", "bug4"]

    second = redrive(cfg, tmp_path, "--through-plugin", "--max-redrives", "2", name="second")
    assert second["redriven_total"] == 3 and second["failed_again"] == 3, "only the new letters"
    third = redrive(cfg, tmp_path, "--through-plugin", "--max-redrives", "2", name="third")
    assert third["redriven_total"] == 0 and third["skipped"] == {"max-redrives": 3}

    letters = read_all(bs, names["dlq"])
    assert [hdict(m).get(COUNT) for m in letters[6:]] == [b"1"] * 3 + [b"2"] * 3, \
        "the count is carried into the new dead letter and raised on each redrive"
    assert all(hdict(m)["trace"] for m in letters[6:]) and all(m.key() for m in letters[6:])
    assert len(read_all(bs, names["out"])) == 3


# ---------------------------------------------------------------------------- time selection
def test_times_select_by_failure_time_read_and_filtered_and_to_leaves_the_rest_for_a_later_run(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    now_ms = int(time.time() * 1000)
    ages_min = [180, 170, 90, 80, 70, 10, 5]
    rows = [letter(names["in"], 0, n, b"k", f"ok:a{age}".encode(), failed_at_ms=now_ms - age * 60_000)
            for n, age in enumerate(ages_min)]
    produce_rows(bs, names["dlq"], rows, 1)
    cfg = config(broker, names, tmp_path, fixed=True)
    to = datetime.fromtimestamp((now_ms - 30 * 60_000) / 1000, tz=UTC).isoformat()

    window = redrive(cfg, tmp_path, "--from", "2h", "--to", to, name="window")
    assert window["redriven_total"] == 3 and window["skipped"] == {"before-from": 2}
    assert window["partitions_ended_at_to"] == 1
    assert sorted(m.value() for m in read_all(bs, names["in"])) == [b"ok:a70", b"ok:a80", b"ok:a90"]
    assert committed(bs, f"{names['group']}.redrive", names["dlq"], 1) == {0: 5}, "the cursor stays at --to"

    rest = redrive(cfg, tmp_path, name="rest")
    assert rest["redriven_total"] == 2 and rest["skipped"] == {}
    assert sorted(m.value() for m in read_all(bs, names["in"])) == [
        b"ok:a10", b"ok:a5", b"ok:a70", b"ok:a80", b"ok:a90"]


# ---------------------------------------------------------------------------- truncated, reference
def test_truncated_and_reference_letters_are_redriven_from_their_source_while_it_holds_them(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    big = [f"ok:s{n}#".encode() + bytes([65 + n]) * 6000 for n in range(3)]
    produce_rows(bs, names["in"], [(f"k{n}".encode(), v, [("trace", f"t{n}".encode())])
                                   for n, v in enumerate(big)], 1)
    whole = [letter(names["in"], 0, n, f"k{n}".encode(), big[n], [("trace", f"t{n}".encode())])
             for n in range(3)]
    truncated = fit_dead_letter(whole[1][0], whole[1][1], whole[1][2], 3000)
    assert truncated.form == "truncated"
    reference = reference_dead_letter(fit_dead_letter(*whole[0], 1_000_000), names["in"], 0, 0)
    beyond = letter(names["in"], 0, 50, b"k9", b"ok:s9")  # never there: the topic ends at 3
    gone = reference_dead_letter(fit_dead_letter(*beyond, 1_000_000), names["in"], 0, 50)
    other = fit_dead_letter(b"k2", b"ok:s2#" + b"Z" * 6000, whole[2][2], 3000)  # not what in[0]@2 holds
    produce_rows(bs, names["dlq"], [(x.key, x.value, x.headers)
                                    for x in (reference, truncated, gone, other)], 1)
    cfg = config(broker, names, tmp_path, fixed=True)

    summary = redrive(cfg, tmp_path)
    assert summary["redriven_total"] == 2 and summary["skipped"] == {"source-gone": 2}, summary
    copies = [m for m in read_all(bs, names["in"]) if COUNT in hdict(m)]
    assert sorted((m.key(), m.value(), tuple(m.headers())) for m in copies) == sorted(
        (f"k{n}".encode(), big[n], (("trace", f"t{n}".encode()), (COUNT, b"1"))) for n in (0, 1)), \
        "the whole original, read again from its source"


def test_a_redrive_killed_half_way_sends_again_only_what_it_sent_after_its_last_commit(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """SIGKILL: no stop, no final commit. The bound asserted is at-least-once's exactly: a
    letter before the cursor the killed run left is never sent again, a letter after it is
    sent at most twice, and twice only if the killed run had sent it."""
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    n = 120
    produce_rows(bs, names["dlq"], [letter(names["in"], 0, i, b"k", f"ok:r{i}".encode())
                                    for i in range(n)], 1)
    cfg = config(broker, names, tmp_path, fixed=True)
    # The broker holds a rejoin for the dead member's max.poll.interval.ms; the redrive polls
    # every half second whatever it waits for, so 3 s is plenty.
    cfg["kafka"]["consumer"]["max.poll.interval.ms"] = 3000
    first = Redrive(cfg, tmp_path, "--rate", "20", name="killed")
    with Tail(bs, names["in"], 1) as tail:
        wait_for(lambda: first.proc.poll() is not None or tail.count() >= 30, 30, "30 letters redriven")
    first.proc.kill()
    first.proc.wait(10)
    sent = copies_by_id(bs, names["in"])
    cursor = committed(bs, f"{names['group']}.redrive", names["dlq"], 1)[0]
    assert 0 < cursor <= sum(sent.values()) < n, (cursor, sum(sent.values()))

    redrive(cfg, tmp_path, name="resumed")
    total = copies_by_id(bs, names["in"])
    for i in range(n):
        copies = total[f"ok:r{i}".encode()]
        assert copies >= 1, f"letter {i} lost"
        assert copies == 1 or (i >= cursor and copies == 2 and sent[f"ok:r{i}".encode()] == 1), \
            f"letter {i} sent {copies} times (cursor {cursor})"


def test_an_outage_stops_the_redrive_at_its_last_acknowledged_letter_and_a_rerun_finishes(
        proxied: tuple[Broker, Proxy], names: dict[str, str], tmp_path: Path) -> None:
    """The broker stops taking the copies (produce requests go unanswered): the redrive does not
    pass a letter over for an outage, it exits 5 with its cursor at the last acknowledged letter;
    once the broker is back, a rerun sends the rest. Nothing lost, nothing sent twice before the
    cursor."""
    broker, proxy = proxied
    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    n = 120
    produce_rows(bs, names["dlq"], [letter(names["in"], 0, i, b"k", f"ok:r{i}".encode())
                                    for i in range(n)], 1)
    cfg = config(broker, names, tmp_path, fixed=True)
    cfg["output"]["delivery_timeout_s"] = 2.0
    first = Redrive(cfg, tmp_path, "--rate", "20", name="outage")
    with Tail(bs, names["in"], 1) as tail:
        wait_for(lambda: first.proc.poll() is not None or tail.count() >= 20, 30, "20 letters redriven")
    proxy.block(PRODUCE, "stall")
    code, summary = first.finish()
    proxy.unblock(PRODUCE)
    assert code == 5 and summary["ending"] == "failed", first.log()
    assert "delivery" in summary["error"] or "acknowledged" in summary["error"]
    cursor = committed(bs, f"{names['group']}.redrive", names["dlq"], 1)[0]
    sent = copies_by_id(bs, names["in"])
    assert 20 <= cursor <= sum(sent.values()) < n

    rest = redrive(cfg, tmp_path, name="after")
    assert rest["ending"] == "end"
    total = copies_by_id(bs, names["in"])
    for i in range(n):
        copies = total[f"ok:r{i}".encode()]
        assert copies == 1 or (i >= cursor and copies == 2), f"letter {i} sent {copies} times"


# ---------------------------------------------------------------------------- the adapter
def test_partition_bounds_come_from_a_fetch_and_a_record_is_read_by_its_coordinates(
        broker: Any, names: dict[str, str]) -> None:
    bs = broker.bootstrap
    make_topics(bs, 3, names["in"])
    produce_rows(bs, names["in"], [(b"k", f"v{i}".encode(), [("h", b"1")]) for i in range(5)], 2)
    props = {"bootstrap.servers": bs, "group.id": unique("bounds")}
    assert partition_bounds(names["in"], props, 10) == {0: (0, 3), 1: (0, 2), 2: (0, 0)}
    fetcher = RecordFetcher(props)
    try:
        one = fetcher.fetch(names["in"], 0, 1, 10)
        assert one is not None and (one.key, one.value, one.headers) == (b"k", b"v2", [("h", b"1")])
        assert fetcher.fetch(names["in"], 1, 1, 10) is not None
        assert fetcher.fetch(names["in"], 0, 3, 10) is None, "at the end: no such record"
        assert fetcher.fetch(names["in"], 0, 500, 10) is None, "beyond the end"
        assert fetcher.fetch(names["in"], 2, 0, 10) is None, "an empty partition"
    finally:
        fetcher.close()


# ---------------------------------------------------------------------------- poisoned letters (issue 29)
def test_poisoned_letters_are_passed_over_as_malformed_and_never_stop_a_redrive(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    """A letter whose redrive count has 5,000 digits (any input record can carry the header),
    whose source partition is 2**32 or offset past int64, or whose header name is not UTF-8:
    each used to stop every redrive with "internal error (a bug)", nothing committed, the
    letters before it redriven again on every run. Now each is passed over as malformed and
    counted, the good letters on both sides are redriven once, and the cursor moves past all."""
    from tests.wire import RawRecord, WireProducer

    bs = broker.bootstrap
    make_topics(bs, 1, names["in"], names["dlq"], names["out"])
    good = [letter(names["in"], 0, i, f"k{i}".encode(), f"ok:g{i}".encode()) for i in range(4)]
    huge_count = letter(names["in"], 0, 10, b"k", b"ok:p0")
    huge_count = (huge_count[0], huge_count[1], [*huge_count[2], (COUNT, b"9" * 5000)])
    wide = letter(names["in"], 0, 11, b"k", b"ok:p1")
    wide = (wide[0], wide[1], [(k, str(2**32).encode() if k.endswith("source.partition") else v)
                               for k, v in wide[2]])
    far = letter(names["in"], 0, 12, b"k", b"ok:p2")
    far = (far[0], far[1], [(k, b"9" * 5000 if k.endswith("source.offset") else v) for k, v in far[2]])
    produce_rows(bs, names["dlq"], [good[0], huge_count, good[1], wide, far, good[2]], 1)
    unreadable = letter(names["in"], 0, 13, b"k", b"ok:p3")
    with WireProducer(bs) as p:  # a header name the Python client cannot write (Go and C can)
        p.produce(names["dlq"], 0, [RawRecord(unreadable[1], unreadable[0],
                                              [(k.encode(), v) for k, v in unreadable[2]]
                                              + [(b"\xff\xfebad-name", b"x")], 1_700_000_000_000)])
    produce_rows(bs, names["dlq"], [good[3]], 1)
    cfg = config(broker, names, tmp_path)

    summary = redrive(cfg, tmp_path)
    assert summary["ending"] == "end", summary
    assert summary["redriven_total"] == 4 and summary["skipped"] == {"malformed": 4}, summary
    assert "redrive.count" in summary["skipped_examples"]["malformed"]
    again = redrive(cfg, tmp_path, name="again")
    assert again["ending"] == "nothing" and again["redriven_total"] == 0, "the cursor moved past them all"
    copies = read_all(bs, names["in"])
    assert sorted(m.value() for m in copies) == sorted(f"ok:g{i}".encode() for i in range(4)), \
        "each good letter redriven once, nothing of the malformed ones"
    assert committed(bs, f"{names['group']}.redrive", names["dlq"], 1) == {0: 8}


def test_cli_numbers_out_of_range_are_one_line_and_exit_2(
        broker: Any, names: dict[str, str], tmp_path: Path) -> None:
    make_topics(broker.bootstrap, 1, names["in"], names["dlq"], names["out"])
    cfg = config(broker, names, tmp_path)
    for args in (["--from", "9" * 5000], ["--to", f"{2**32}:1"], ["--max-redrives", str(2**40)]):
        r = Redrive(cfg, tmp_path, *args, as_json=False)
        code = r.proc.wait(60)
        r._err.close()
        err = r.err_path.read_text()
        assert code == 2, err
        assert "Traceback" not in err and "internal error" not in err
        assert err.count("\n") == 1 and err.startswith("ringmaster: error: "), err
        r.err_path.unlink()
