"""The fault matrix (tests/faults/matrix.py), against the real broker and real processes.

Rows are independent (own topics, group, directories) and spend most of their time waiting
(group joins, restarts, back-offs), so the selected rows run a few at a time in a thread
pool, once per session; each row is still its own test, judged on its own observation.
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import TEST_BROKER, journal, read_all
from probe import headers_digest

from . import drive
from .matrix import FAULTS, NOT_UTF8, REBALANCE_ROWS, REDRIVE_LETTERS, Fault, wire_field_rows
from .parallel import observe_selected
from .protocols import with_variants

pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(900)]
# Every row, and the rebalance rows again under the broker's other group protocol.
ROWS = with_variants(FAULTS, REBALANCE_ROWS)
ROWS_BY_ID = {f.id: f for f in ROWS}


@pytest.fixture(scope="session")
def observations(request: pytest.FixtureRequest, broker: Any,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    yield observe_selected(request, "test_fault", ROWS_BY_ID, drive.run, broker.bootstrap, tmp_path_factory,
                           cost)


# Drivers that start a broker of their own (seconds for Apache Kafka's JVM), then those that
# kill, restart or wait on processes: measured the longest rows, so started first.
OWN_BROKER = {"output_outage", "output_outage_reset", "dead_letter_outage", "caught_up_broker_away",
              "caught_up_broker_stall", "caught_up_commit_unanswered", "start_offsets_unanswered"}


def cost(f: Fault) -> int:
    if f.driver in OWN_BROKER:
        return 2
    crashes = "WorkerCrashed" in f.dead.values() or f.redelivers
    return 1 if crashes or f.driver != "batch" or f.workers.get("start_attempts") else 0


def ident(value: bytes | None) -> str:
    text = (value or b"").decode(errors="replace").split("#", 1)[0]
    return text.split(":", 1)[1] if ":" in text else text


@pytest.mark.parametrize("fault_id", [f.id for f in ROWS])
def test_fault(fault_id: str, observations: dict[str, Any]) -> None:
    obs = observations[fault_id]
    if isinstance(obs, BaseException):
        raise obs
    f: Fault = obs.fault
    tail = "\n".join(obs.log.splitlines()[-40:])
    if f.driver.startswith("share"):
        print(figures(obs))  # shown with the failure, or with -rP
    assert obs.exit == f.exit, f"exit {obs.exit}, expected {f.exit}:\n{tail}"
    # Invariant 7 for every row, in the row's own segment directory (drive.run).
    assert obs.extra["shm_left"] == [], f"shared memory left behind by the row: {obs.extra['shm_left']}"
    for needle in f.log:
        assert needle in obs.log, f"the log does not say {needle!r}:\n{tail}"
    dead = {ident(m.value()): dict(m.headers() or [])["ringmaster.error.type"].decode() for m in obs.dead}
    assert dead == dict(f.dead), f"dead letters {dead}, expected {dict(f.dead)}:\n{tail}"
    if f.exit == 0 and f.driver.startswith("share"):  # no offsets in a share group: records acknowledged
        # Every record output or dead-lettered (below), nothing left held, the broker's answers
        # counted: an acknowledgement after the record's lock ended is a lock expiry, not an
        # accept (a record archived at its last delivery once its output or letter was written).
        share = (obs.status or {}).get("share") or {}
        settled = sum(share.get(k, 0) for k in ("accepted", "released", "rejected", "lock_expiries"))
        assert share and share["acquired"] == settled and not share.get("held") and not share["rejected"], \
            f"share counts {share}:\n{tail}"
        assert "timed_out" not in obs.extra, f"{obs.extra['timed_out']}:\n{tail}"
    elif f.exit == 0:
        assert obs.committed == obs.counts, f"committed {obs.committed}, produced {obs.counts}:\n{tail}"
    if f.exit == 0:
        ids = Counter(b["id"] for b in obs.bodies())
        written = Counter(ident(v) for v in obs.values)  # empty and null values share an id
        twice = [i for i, n in ids.items() if n > max(1, written[i])][:5]
        copies = [b for b in obs.bodies() if b["id"] in twice] if twice else []  # each one's pid
        assert f.redelivers or not twice, f"outputs written more than once: {twice}: {copies}\n{tail}"
        if f.guarantee == "exactly-once":  # read_committed (read_all): the dead letters once too
            letters = Counter(ident(m.value()) for m in obs.dead)
            assert all(n == 1 for n in letters.values()), f"dead letters written twice: {letters}:\n{tail}"
        outputs = set(ids)
        expected = {ident(v) for v in obs.values} - set(f.dead) - f.no_output
        assert outputs == expected, (f"outputs missing {sorted(expected - outputs)[:10]}, "
                                     f"unexpected {sorted(outputs - expected)[:10]}:\n{tail}")
    if "aborted_outputs" in obs.extra and TEST_BROKER == "kafka":
        # Apache Kafka hides aborted records from read_committed; Tansu delivers them
        # (drive.transactions takes them out there, so that the rest is judged alike).
        aborted = [m.value()[:20] for m in obs.extra["aborted_outputs"]]
        assert not aborted, f"records of aborted transactions processed: {aborted[:5]}"
    if f.check:
        CHECKS[f.check](obs)


def figures(obs: drive.Observation) -> str:
    """A share row's outcome in numbers: records lost (no output, no dead letter), run twice,
    dead letters (and records with more than one), and what the daemon counted."""
    outputs = Counter(b["id"] for b in obs.bodies())
    letters = Counter(ident(m.value()) for m in obs.dead)
    ids = {ident(v) for v in obs.values}
    lost = sorted(ids - set(outputs) - set(letters))
    return (f"figures {obs.fault.id}: {len(ids)} records, {len(lost)} lost {lost[:10]}, "
            f"{sum(1 for n in outputs.values() if n > 1)} run twice, {sum(letters.values())} dead letters "
            f"({sum(1 for n in letters.values() if n > 1)} records with more than one), "
            f"counts {(obs.status or {}).get('share')}")


# ---------------------------------------------------------------------------- extra checks
def share_delivery_count(obs: drive.Observation) -> None:
    (m,) = obs.dead
    assert int(dict(m.headers() or [])["ringmaster.delivery_count"]) >= 1


def share_lock_expiries(obs: drive.Observation) -> None:
    share = (obs.status or {}).get("share") or {}
    assert share.get("lock_expiries", 0) >= 1, f"the refused acknowledgements not counted: {share}"
    # Handed out again once after the stall, not over and over until the broker's delivery
    # limit archives them (the records' polls run within their lock once the broker is back).
    assert share["acquired"] <= 3 * obs.fault.n, f"the records were handed out again and again: {share}"

def share_counts_add_up(obs: drive.Observation) -> None:
    """What the broker did, counted from its answers and the lock's clock (issue 44: 2,000
    refused first-delivery ACCEPTs showed as 500 lock expiries and 4,000 accepted): once the
    daemon has stopped, every record it acquired is accepted, released, rejected or expired."""
    share = (obs.status or {}).get("share") or {}
    settled = share["accepted"] + share["released"] + share["rejected"] + share["lock_expiries"]
    assert share["acquired"] == settled, f"acquired {share['acquired']} != {settled}: {share}"
    assert not share["rejected"], share
    assert "timed_out" not in obs.extra, obs.extra["timed_out"]


def _letters(obs: drive.Observation) -> list[dict[str, bytes]]:
    letters = [dict(m.headers() or []) for m in obs.dead]
    ids = Counter(ident(m.value()) for m in obs.dead)
    assert all(n == 1 for n in ids.values()), f"dead letters written more than once: {ids}"
    return letters


def share_letters_at_the_limit(obs: drive.Observation) -> None:
    """Past the delivery limit × the lock, each record dead-lettered once, at its last delivery
    (the group's limit), saying what held it: none archived by the broker without a trace."""
    share_counts_add_up(obs)
    limit = obs.fault.group_configs["share.delivery.count.limit"].encode()
    for h in _letters(obs):
        assert h["ringmaster.delivery_count"] == limit, h
        assert b"share.delivery.count.limit" in h["ringmaster.error.message"], h


def share_one_letter_each(obs: drive.Observation) -> None:
    """One poison record, one dead letter, with its delivery count (issue 44: 3 and 4 letters
    for one record, and the WorkerCrashed letter had no ringmaster.delivery_count)."""
    share_counts_add_up(obs)
    for h in _letters(obs):
        assert int(h["ringmaster.delivery_count"]) >= 1, h


def share_few_duplicates(obs: drive.Observation) -> None:
    """Only the records in a ring with a slow one run twice: the slow batch and what was queued
    behind it (a batch and 20 ms of work: scheduler.py), not the poll (all 400 before)."""
    share_counts_add_up(obs)
    ids = Counter(b["id"] for b in obs.bodies())
    twice = sorted(i for i, n in ids.items() if n > 1)
    slow = sum(1 for v in obs.values if v and v.startswith(b"firstslow"))
    bound = slow * 4 * obs.fault.workers["batch_max_records"]
    assert len(twice) <= bound, f"{len(twice)} records ran twice (at most {bound}): {twice[:20]}"


def null_and_empty(obs: drive.Observation) -> None:
    assert len(obs.outputs) == obs.fault.n, "one output per record, empty and null ones included"
    keys = Counter(m.key() for m in obs.outputs)
    assert keys[None] and keys[b""] and keys[b"k"], f"keys kept as they were: {keys}"


def dead_letter_keeps_headers(obs: drive.Observation) -> None:
    (m,) = obs.dead
    h = m.headers()
    originals = [(k, v) for k, v in h if not k.startswith("ringmaster.")]
    assert len(originals) == 2000 and originals[7] == ("h7", b"\xff\xfe\x00\x07"), originals[:3]


def dead_letter_truncated(obs: drive.Observation) -> None:
    (m,) = obs.dead
    h = dict(m.headers())
    original = int(h["ringmaster.value.truncated"])
    assert original > len(m.value()) and len(m.value()) > 1000, (original, len(m.value()))
    assert h["ringmaster.source.offset"], "where the record is stays in the headers"


def _once_each(obs: drive.Observation) -> dict[str, Any]:
    """Outputs by id: none duplicated (no crash in these rows, so exactly once)."""
    ids = Counter(b["id"] for b in obs.bodies())
    assert max(ids.values()) == 1, f"duplicated outputs: {ids.most_common(3)}"
    return {json.loads(m.value())["id"]: (m, json.loads(m.value())) for m in obs.outputs}


def unreadable_dead_letters(obs: drive.Observation) -> None:
    """What can be read of the record is in its dead letter: key, value, the readable
    headers, and the name it could not read (in the reason); the other records' outputs
    saw their headers as written."""
    for m in obs.dead:
        i = int(ident(m.value())[1:])
        h = m.headers()
        assert (m.key(), m.value()) == (f"k{i}".encode(), f"r{i}".encode())
        assert ("trace", b"t-%d" % i) in h, f"the readable header is kept: {h[:3]}"
        reason = dict(h)
        why = reason["ringmaster.error.message"]
        assert repr(NOT_UTF8).encode() in why, why
        assert reason["ringmaster.worker"] == b"supervisor"
    for ident_, (_m, body) in _once_each(obs).items():
        i = int(ident_[1:])
        assert body["h"] == headers_digest([("trace", b"t-%d" % i)]), f"{ident_}: headers as written"


def wire_fields_seen(obs: drive.Observation) -> None:
    """The plugin saw every field as it was written: key, headers (names, values, count,
    order), timestamp (CreateTime as written; LogAppendTime from the broker)."""
    seen = _once_each(obs)
    stored = {m.value().decode(): m.timestamp() for m in read_all(obs.bootstrap, obs.names["in"])}
    for rec, log_append in wire_field_rows(obs.fault.n):
        ident_ = rec.value.decode()  # type: ignore[union-attr]
        m, body = seen[ident_]
        assert m.key() == rec.key, f"{ident_}: key"
        expected = [(n.decode(), v) for n, v in rec.headers] or None
        assert body["h"] == headers_digest(expected), f"{ident_}: headers {str(expected)[:80]}"
        if log_append:
            # Apache Kafka stamps a batch with its topic's timestamp type (CreateTime here),
            # whatever the producer's attribute; Tansu keeps the producer's LogAppendTime.
            # Either way the plugin sees the timestamp the broker hands out.
            assert body["ts"] == list(stored[ident_]), f"{ident_}: {body['ts']} != {stored[ident_]}"
            assert TEST_BROKER == "kafka" or body["ts"][0] == 2, f"{ident_}: LogAppendTime {body['ts']}"
        else:
            assert body["ts"] == [1, rec.timestamp], f"{ident_}: timestamp {body['ts']} != {rec.timestamp}"


def wire_dead_letters_keep_fields(obs: drive.Observation) -> None:
    """Dead letters of such records keep them as written: key, value, every original header."""
    sent = {rec.value: rec for rec, _ in wire_field_rows(obs.fault.n, failing=3)}
    assert len(obs.dead) == len(obs.fault.dead)
    for m in obs.dead:
        rec = sent[m.value()]
        assert m.key() == rec.key, f"{m.value()!r}: key"
        originals = [(k, v) for k, v in m.headers() if not k.startswith("ringmaster.")]
        assert originals == [(n.decode(), v) for n, v in rec.headers], f"{m.value()!r}: headers"
    _once_each(obs)


def exactly_once(obs: drive.Observation) -> None:
    ids = Counter(b["id"] for b in obs.bodies())
    assert ids["r5"] == 1 and len(obs.outputs) == obs.fault.n, ids.most_common(3)


def children_gone(obs: drive.Observation) -> None:
    """Counted when the daemon had exited, before the driver's own clean-up kills them."""
    pids = [int(p.read_text()) for p in obs.dirs["pids"].glob("*.pid")]
    assert pids, "the plugin started a child"
    alive = obs.extra["plugin_children_alive"]
    assert not alive, f"processes started by the plugin outlived the daemon: {alive}"


def reclaimed_by_next_start(obs: drive.Observation) -> None:
    """The SIGKILL left segments (the test can see something to reclaim), and the next start
    of a daemon in the same directory unlinked every one of them."""
    assert obs.extra["segments_left"], "the killed supervisor left no segment: nothing was tested"
    assert not obs.extra["segments_after_restart"], \
        f"segments of the killed supervisor not reclaimed: {obs.extra['segments_after_restart']}"


IDLE_CPU_SHARE = 0.2  # of one core; a busy loop takes all of one (about 1.0, 0.5 when starved)


def idles(obs: drive.Observation) -> None:
    share = obs.extra["idle_cpu_share"]
    assert share < IDLE_CPU_SHARE, f"an idle supervisor used {share:.0%} of a core: a busy loop"


def blocked_at_failure(obs: drive.Observation) -> None:
    """Record 21 is partition 1, offset 10 (round-robin over 2): nothing from it on is
    committed or output; partition 0 is processed to its end."""
    assert obs.committed[0] == obs.counts[0]
    assert obs.committed[1] <= 10, obs.committed  # negative: nothing committed
    late = [b for b in obs.bodies() if b["p"] == 1 and b["o"] > 10]
    assert not late, f"records after the failing one were processed: {late[:3]}"
    assert "exit" not in obs.log or "partition(s) stopped at a failing record" in obs.log
    assert obs.status and [p["tp"] for p in obs.status["partitions"] if p["blocked"]] == \
        [f"{obs.names['in']}[1]"], "the status names the blocked partition"


def routed(obs: drive.Observation) -> None:
    got = {json.loads(m.value())["id"] for m in obs.extra["routed"]}
    assert got == {f"r{i}" for i in range(0, 40, 5)}, got


def discarded_counted(obs: drive.Observation) -> None:
    assert obs.status is not None, "a final status was written"
    assert obs.status["discarded"] == obs.fault.n, obs.status["discarded"]


def outage_recovered(obs: drive.Observation) -> None:
    during = obs.extra["during"]
    assert not obs.extra["dead_during"], "records were dead-lettered because of an outage"
    assert obs.extra["committed_during"] != obs.counts, "offsets committed while outputs were not delivered"
    holds = [p["holds"].get("delivery", "") for p in during["partitions"]]
    assert any(holds), f"the status shows why partitions wait: {during['partitions']}"
    assert "WorkerCrashed" not in obs.log


def worker_exhausted(obs: drive.Observation) -> None:
    assert obs.status is not None
    exits = obs.status["workers"][0]["exits"]
    assert exits.get("exhausted", 0) >= 1 and not exits.get("crashed"), exits
    assert "WorkerCrashed" not in obs.log


def in_order_once_backed_off(obs: drive.Observation) -> None:
    offsets = [off for _ns, _part, off, _pid in journal(obs.dirs["journal"])]
    assert offsets == sorted(offsets), "after a back-off the partition goes on in order"
    assert "batch deferred" in obs.log


def no_worker_died(obs: drive.Observation) -> None:
    assert obs.extra["pids_after"] == obs.extra["pids_before"] and obs.extra["restarts"] == 0, \
        f"workers {obs.extra['pids_before']} -> {obs.extra['pids_after']}, {obs.extra['restarts']} restarts"
    for needle in obs.fault.log:  # one line per arrival: each signal went to the supervisor and the group
        assert obs.log.count(needle) == 2, f"{needle!r} logged {obs.log.count(needle)} times"


def transaction_aborted_not_crashed(obs: drive.Observation) -> None:
    """A transaction the coordinator timed out is a deferral (TransactionAborted), not a crash
    the batch is blamed for: no worker exited, nothing isolated."""
    deferred = [line for line in obs.log.splitlines() if "batch deferred" in line]
    assert "worker exited" not in obs.log and "WorkerCrashed" not in obs.log \
        and "bisecting" not in obs.log, f"a worker crashed on a timed-out transaction:\n{obs.log[-4000:]}"
    assert any("cause=transaction" in line or '"cause": "transaction"' in line for line in deferred), \
        f"the deferral's cause is the transaction: {deferred}"


def _no_crash(obs: drive.Observation) -> None:
    assert "WorkerCrashed" not in obs.log and "worker exited with status" not in obs.log \
        and "perhaps out of memory" not in obs.log, "no worker crashed"
    assert obs.log.count("partitions assigned") == 1 and obs.log.count("partitions revoked") == 0 \
        and obs.log.count("partitions released: the daemon is stopping") == 1, \
        "no rebalance: the member never left its group (one assignment, one release at the stop)"


def reloaded_by_signal(obs: drive.Observation) -> None:
    """Each SIGHUP (to the supervisor, then to the whole group) is one reload that replaced
    every worker: the workers ignored the group's copy, the supervisor reloaded."""
    steps = obs.extra["steps"]
    assert [(s[0], s[1], s[2], s[3]) for s in steps] == [("HUP", "supervisor", "succeeded", 2),
                                                         ("HUP", "group", "succeeded", 2)], steps
    pids = [obs.extra["pids_before"], *(s[4] for s in steps)]
    for old, new in itertools.pairwise(pids):
        assert not set(old) & set(new), f"a reload replaces every worker: {old} -> {new}"
    _no_crash(obs)


def resized_by_signal(obs: drive.Observation) -> None:
    """TTIN then TTOU, twice: 2 -> 3 -> 2 workers each time, and no worker restarted."""
    steps = obs.extra["steps"]
    assert [(s[0], s[1], s[2], s[3]) for s in steps] == [
        ("TTIN", "supervisor", "succeeded", 3), ("TTOU", "supervisor", "succeeded", 2),
        ("TTIN", "group", "succeeded", 3), ("TTOU", "group", "succeeded", 2)], steps
    assert set(obs.extra["pids_before"]) <= set(steps[0][4]), "adding a worker keeps the others"
    assert obs.extra["restarts"] == 0
    _no_crash(obs)


def stopped_gracefully(obs: drive.Observation) -> None:
    assert obs.extra["rest_exit"] == 0, "the next start finished the rest"
    done = sum(max(o, 0) for o in obs.extra["committed_at_stop"].values())
    assert 0 < done <= obs.extra["stopped_at"] < sum(obs.counts.values()), \
        f"stopped mid-run, committed {done} of {obs.extra['stopped_at']} done"
    assert "WorkerCrashed" not in obs.log and "did not stop in time" not in obs.log


def admin_held_up(obs: drive.Observation) -> None:
    health = obs.extra["health"]
    assert all(code == 200 and took < 2.0 for code, took in health), f"/healthz: {health}"
    before, after = obs.extra["fds"]
    assert after <= before + 16 + 4, f"the daemon's descriptors: {before} -> {after} (max_connections 16)"
    if "slow_cut_after_s" in obs.extra:
        cut = obs.extra["slow_cut_after_s"]
        assert len(cut) == 40 and max(cut) < 2.0 + 3.0, f"slow clients cut off after {sorted(cut)[-3:]} s"
    if "answers" in obs.extra:
        a = obs.extra["answers"]
        assert a["HEAD"][0] == 200 and a["HEAD"][1].endswith(b"\r\n\r\n"), "HEAD: no body"
        for method in ("POST", "PUT", "DELETE", "OPTIONS"):
            assert a[method][0] == 405 and b"Allow: GET, HEAD" in a[method][1], (method, a[method])
        assert a["malformed"][0] == 400 and a["huge"][0] == 431, a


def one_error_line(obs: drive.Observation) -> None:
    """The daemon could not start its admin endpoint: one line says why, and nothing of the
    group was touched (no commit, no output)."""
    errors = [line for line in obs.log.splitlines() if line.startswith("ringmaster: error: admin.listen")]
    assert len(errors) == 1, obs.log[-2000:]
    assert all(o < 0 for o in obs.committed.values()) and not obs.outputs, "nothing committed or produced"


def refused_before_kafka(obs: drive.Observation) -> None:
    import subprocess
    import sys

    from helpers import PLUGINS, ROOT

    errors = [line for line in obs.log.splitlines() if line.startswith("ringmaster: error: ")]
    assert len(errors) == 1 and "supervisor started" not in obs.log, obs.log[-2000:]
    assert all(o < 0 for o in obs.committed.values()) and not obs.outputs, "nothing touched the group"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGINS), str(ROOT)]))
    check = subprocess.run([sys.executable, "-m", "runtime.cli", "check", "-c", str(obs.extra["config"])],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert check.returncode == 2 and check.stderr.strip() == errors[0], check.stderr


def committed_is_processed(obs: drive.Observation) -> None:
    """Not caught up, and honest about it: the group's offsets stop short of the end, and
    every record below them was output (nothing committed past what was done)."""
    assert obs.committed != obs.counts
    done = {(b["p"], b["o"]) for b in obs.bodies()}
    for p, off in obs.committed.items():
        missing = [o for o in range(max(off, 0)) if (p, o) not in done]
        assert not missing, f"partition {p} committed up to {off} with {len(missing)} records not output"
    (line,) = [x for x in obs.log.splitlines() if x.startswith("ringmaster: error: --until-caught-up")]
    assert "partition(s) left" in line and "records left" in line, line


def committed_is_output_once(obs: drive.Observation) -> None:
    """The same under exactly-once, and exact: a read_committed reader finds the outputs of
    the records below the group's offsets, each once, and none of a record above them."""
    committed_is_processed(obs)
    done = Counter((b["p"], b["o"]) for b in obs.bodies())
    assert done == Counter((p, o) for p, off in obs.committed.items() for o in range(max(off, 0))), \
        f"outputs are not those of the records below the group's offsets {obs.committed}"


# ------------------------------------------------------------------------ a worker's whole life (issue 29)
def death_phase_named(obs: drive.Observation) -> None:
    """The dead letter of the record that killed its worker says what the worker was doing."""
    (m,) = obs.dead
    why = dict(m.headers())["ringmaster.error.message"].decode()
    phase = obs.fault.id.removeprefix("killed-while-").removesuffix("-exactly-once")
    words = {"read": "reading the batch or running the plugin",
             "deliver": "delivering outputs or dead letters",
             "wait": "waiting to retry", "letters": "delivering outputs or dead letters",
             "report": "reporting the batch"}[phase]
    assert f"the last time {words}" in why, why
    assert dict(m.headers())["ringmaster.worker"] == b"supervisor"


def dead_letters_as_read(obs: drive.Observation) -> None:
    """Each dead letter is the record as written to Kafka, at its own partition and offset,
    whatever the plugin changed in the objects it was given."""
    where = set()
    for m in obs.dead:
        h = dict(m.headers())
        i = int(ident(m.value())[1:])
        assert m.key() == str(i).encode(), f"the original key: {m.key()!r}"
        assert m.value() == obs.fault.values[i].encode(), f"the original value: {m.value()!r}"
        assert not [k for k, _ in m.headers() if k.startswith("probe.")], "no header the plugin added"
        assert h["ringmaster.source.topic"].decode() == obs.names["in"]
        partition, offset = int(h["ringmaster.source.partition"]), int(h["ringmaster.source.offset"])
        assert 0 <= offset < obs.counts[partition], (partition, offset, obs.counts)
        where.add((partition, offset))
    assert len(where) == len(obs.dead), "each names its own record"


def over_capacity_untouched(obs: drive.Observation) -> None:
    """Partitions held over capacity are never read: nothing of them is output or committed;
    the ones that fit are done and committed."""
    status = obs.status or {}
    over = {o["tp"] for o in status.get("over_capacity", [])} or {
        line.split("partitions=")[1].split()[0] for line in obs.log.splitlines()
        if "held over capacity" in line and "partitions=" in line}
    held = {int(p) for p in obs.committed if obs.committed[p] == obs.counts[p]}
    assert len(held) == 4, f"the 4 partitions that fit are done and committed: {obs.committed}"
    assert len(obs.committed) == 6 and all(obs.committed[p] < 0 for p in obs.committed if p not in held), \
        f"nothing committed for the partitions over capacity: {obs.committed} ({over})"
    outputs = {b["id"] for b in obs.bodies()}
    expected = {ident(v) for i, v in enumerate(obs.values) if i % 6 in held}
    assert outputs == expected, f"outputs only of the partitions that fit: {sorted(outputs ^ expected)[:10]}"


def redrive_passed_over_malformed(obs: drive.Observation) -> None:
    """The poisoned letters are passed over as malformed and counted; the good ones redriven
    once; a second run finds nothing left; the daemon then processed every redriven copy."""
    (_, out, err), (code2, out2, _) = obs.extra["redrive"]
    poisons, _ = REDRIVE_LETTERS[obs.fault.id]
    first, second = json.loads(out), json.loads(out2)
    assert "internal error" not in err and "Traceback" not in err, err[-2000:]
    assert first["skipped"] == {"malformed": len(poisons)}, first
    assert first["redriven_total"] == 8 - len(poisons) and first["ending"] == "end", first
    assert code2 == 0 and second["ending"] == "nothing" and second["redriven_total"] == 0, second
    assert obs.extra["daemon_exit"] == 0


def redrive_refused(obs: drive.Observation) -> None:
    (_, out, err), (code2, _, _) = obs.extra["redrive"]
    assert out == "" and err.count("\n") == 1 and err.startswith("ringmaster: error: --from"), err
    assert code2 == 2 and "daemon_exit" not in obs.extra


def started_at_the_committed_offsets(obs: drive.Observation) -> None:
    """Nothing ran while the committed offsets were unread (a partition started at the reset
    position instead would have), and the daemon said why its partitions waited."""
    assert obs.extra["processed_during"] == 0, f"{obs.extra['processed_during']} records processed " \
                                               "before the committed offsets were read"
    reasons = [p["pause_reasons"] for p in obs.extra["during"]["partitions"]]
    assert all(r == ["seeking"] for r in reasons), reasons


CHECKS = {name: fn for name, fn in globals().items() if callable(fn) and name in {
    f.check for f in FAULTS if f.check}}
assert set(CHECKS) == {f.check for f in FAULTS if f.check}, "every check named in the matrix exists"


def test_every_row_has_a_distinct_when() -> None:
    whens = Counter(f.when for f in FAULTS)
    assert max(whens.values()) == 1, [w for w, c in whens.items() if c > 1]


def test_the_operations_table_matches_the_matrix() -> None:
    from .table import DOC, render

    text = Path(DOC).read_text()
    assert render() in text, "docs/operations.md's table is stale: python -m tests.faults.table --write"
