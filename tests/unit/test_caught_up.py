"""``--until-caught-up`` is honest (issue 17.3): the run exits 0 only when every partition it
held was processed to the end seen at its start and committed with the broker's answer, or
handed over by a clean revocation; a lost partition, a refused commit, a stall or a signal
first is exit 9 with one line saying what is left. The real Supervisor over fakes."""

from __future__ import annotations

import itertools
from typing import Any

import fakes
import pytest
from fakes import TP0, TP1, Clock, FakeConsumer, FakePool, assign, lose, revoke

from runtime.config import Settings
from runtime.errors import NotCaughtUp, PartitionsBlocked
from runtime.kafka.group_offsets import GroupStanding
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.partition.partition import PauseReason
from runtime.transport.board import PHASE_CALL, EpochTable

TIMEOUT_S = 30.0
_BATCH_IDS = itertools.count(1_000_000)


def make(output: dict[str, Any] | None = None, **supervisor: Any
         ) -> tuple[Supervisor, FakeConsumer, Clock, FakePool]:
    clock = Clock()
    pool = FakePool(1)
    consumer = FakeConsumer()
    settings = Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", "processes": 1}, "output": output or {},
        "supervisor": {"stop_when_caught_up": True, "caught_up_timeout_s": TIMEOUT_S, **supervisor}})
    sup = Supervisor(settings, consumer, pool, EpochTable(memoryview(bytearray(8 * 16))),  # type: ignore[arg-type]
                     clock=clock)
    sup.workforce.start_all()
    return sup, consumer, clock, pool


def fetched(sup: Supervisor, consumer: FakeConsumer, tp: Any, first: int, end: int,
            high: int | None = None) -> None:
    """As if one fetch returned records first..end-1 of tp, the broker's end being `high`."""
    intake = sup.partitions[tp].intake
    consumer.high[tp] = end if high is None else high
    intake.first_offset = first if intake.first_offset is None else intake.first_offset
    intake.next_offset = end


def done(sup: Supervisor, tp: Any, first: int, end: int) -> None:
    """Records first..end-1 of tp processed (their batch done)."""
    tracker = sup.partitions[tp].tracker
    bid = next(_BATCH_IDS)
    tracker.register(bid, first, end - 1)
    tracker.complete(bid)


def all_done(sup: Supervisor, consumer: FakeConsumer, tps: tuple[Any, ...], end: int = 10) -> None:
    """Records 0..end-1 of each of tps fetched and processed."""
    for tp in tps:
        fetched(sup, consumer, tp, 0, end)
        done(sup, tp, 0, end)


def tick(sup: Supervisor, clock: Clock, seconds: float = 0.1) -> bool:
    clock.now += seconds
    return sup.caught_up.should_stop(sup.rebalance.rebalances)


def stop(sup: Supervisor) -> Exception | None:
    """What shutdown() decides: the final synchronous commit, then the verdict."""
    sup.stopping = True
    sup.shutdown()
    return sup.exit_error


def test_every_partition_done_and_the_final_commit_acknowledged_is_exit_0() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    for tp in (TP0, TP1):
        fetched(sup, consumer, tp, 0, 10)
    assert not tick(sup, clock), "nothing done yet"
    done(sup, TP0, 0, 10)
    assert not tick(sup, clock), "t[1] is not done"
    done(sup, TP1, 0, 10)
    assert tick(sup, clock)
    assert stop(sup) is None
    assert consumer.commits[-1] == {TP0: 10, TP1: 10}, "the final commit is synchronous, every partition"


def test_the_final_commit_is_sent_again_even_when_an_asynchronous_one_already_went() -> None:
    """Issue 17.3: exit 0 after the last asynchronous commit was refused. The refusal may
    come after the stop; only the synchronous answer counts."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 10)
    done(sup, TP0, 0, 10)
    sup.commits.commit(list(sup.partitions.values()), asynchronous=True)  # sent; its answer never seen
    assert tick(sup, clock)
    consumer.refuse_sync = {TP0: "REQUEST_TIMED_OUT"}
    err = stop(sup)
    assert consumer.commits[-1] == {TP0: 10}, "committed again, synchronously"
    assert isinstance(err, NotCaughtUp) and err.exit_code == 9
    assert "t[0] its commit was refused (REQUEST_TIMED_OUT): nothing committed by this run of 10 " \
           "(10 records left)" in str(err), str(err)
    assert "\n" not in str(err)


def test_a_lost_partition_is_waited_for_then_named_with_what_is_left() -> None:
    """Issue 17.3: after a stall past the session timeout the partitions were lost, the loop
    found no flows and declared success with 1,500 of 6,000 records committed."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP0, 0, 3000, high=6000)
    done(sup, TP0, 0, 1500)
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)  # acknowledged up to 1,500
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    lose(sup, [TP0])
    assert TP0 not in sup.partitions
    for _ in range(10):
        assert not tick(sup, clock, 1.0), "a lost partition may come back: not caught up"
    clock.now += TIMEOUT_S
    assert tick(sup, clock), "but not for ever"
    err = stop(sup)
    assert isinstance(err, NotCaughtUp)
    text = str(err)
    assert text.startswith("--until-caught-up did not catch up: no progress for")
    assert "1 partition(s) left: t[0] lost" in text
    assert "committed up to offset 1,500 of 6,000 (4,500 records left)" in text, text


def test_a_lost_partition_assigned_back_and_finished_is_caught_up() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 40)
    lose(sup, [TP0])
    assert not tick(sup, clock)
    assign(sup, consumer, [TP0])  # the member rejoined: the group gives it back
    fetched(sup, consumer, TP0, 0, 100)  # read again from the last commit
    done(sup, TP0, 0, 100)
    assert tick(sup, clock)
    assert stop(sup) is None


def test_a_clean_revocation_hands_the_partition_over() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 30)
    revoke(sup, [TP0])  # another member joined; the commit is acknowledged
    assert consumer.commits[-1] == {TP0: 30}
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    assert tick(sup, clock)
    assert stop(sup) is None


def test_a_revocation_whose_commit_is_refused_is_no_hand_over() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 30)
    consumer.refuse_sync = {TP0: "REBALANCE_IN_PROGRESS"}
    revoke(sup, [TP0])
    consumer.refuse_sync = {}
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    assert not tick(sup, clock)
    clock.now += TIMEOUT_S
    assert tick(sup, clock)
    err = stop(sup)
    assert isinstance(err, NotCaughtUp) and "t[0] its commit was refused (REBALANCE_IN_PROGRESS)" in str(err)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT", "SIGQUIT"])
def test_a_stop_by_signal_before_the_end_is_exit_9(signal_name: str) -> None:
    sup, consumer, _clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 60)
    sup.signals.stop_requested = signal_name
    err = stop(sup)
    assert isinstance(err, NotCaughtUp)
    assert f"did not catch up: stopped by {signal_name}; 1 partition(s) left: t[0] not at its end: " \
           "committed up to offset 60 of 100 (40 records left)" in str(err), str(err)


def test_without_until_caught_up_a_stop_is_exit_0() -> None:
    sup, consumer, clock, _ = make(stop_when_caught_up=False)
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 100)
    assert not tick(sup, clock, TIMEOUT_S * 2)
    sup.signals.stop_requested = "SIGTERM"
    assert stop(sup) is None


def test_the_end_seen_at_the_start_is_where_a_busy_topic_ends() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100, high=100)
    assert not tick(sup, clock)  # the target: 100
    consumer.high[TP0] = 5000  # producers keep writing
    sup.partitions[TP0].intake.next_offset = 300
    done(sup, TP0, 0, 100)
    assert tick(sup, clock), "everything up to the end seen at the start is done"
    assert stop(sup) is None


def test_a_partition_already_at_its_end_is_done_without_a_record() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    intake = sup.partitions[TP0].intake
    intake.eof_at = intake.first_offset = 42  # committed 42 = the end: only an end-of-partition event
    consumer.high[TP0] = 42
    assert tick(sup, clock)
    assert stop(sup) is None


def test_partitions_blocked_at_a_failing_record_and_nothing_else_are_exit_7() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 10)
    sup.partitions[TP0].hold(PauseReason.BLOCKED, "offset 10: ValueError: bad")
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    assert tick(sup, clock)
    err = stop(sup)
    assert isinstance(err, PartitionsBlocked) and err.exit_code == 7
    assert "t[0] offset 10: ValueError: bad" in str(err)


def test_no_progress_ends_the_run_but_a_busy_worker_and_an_operator_pause_are_no_stall() -> None:
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100)
    assert not tick(sup, clock)
    h = pool.handles[0]
    h.alive = True
    h.board.begin(7, 0)  # a batch in the plugin, for longer than the bound
    assert h.board.phase == PHASE_CALL
    assert not tick(sup, clock, TIMEOUT_S + 1)
    h.board.end(0)
    sup.partitions[TP0].hold(PauseReason.OPERATOR, "maintenance")
    assert not tick(sup, clock, TIMEOUT_S + 1), "an operator pause is a deliberate wait"
    sup.partitions[TP0].release(PauseReason.OPERATOR)
    assert not tick(sup, clock, TIMEOUT_S / 2)
    assert tick(sup, clock, TIMEOUT_S / 2 + 1)
    err = stop(sup)
    assert isinstance(err, NotCaughtUp) and "t[0] not at its end: nothing committed by this run of 100 " \
                                              "(100 records left)" in str(err), str(err)


def test_a_member_never_assigned_anything_stops_after_the_bound() -> None:
    sup, _consumer, clock, _ = make()
    assert not tick(sup, clock, 1)  # the loop's first round: the bound counts from here
    assert not tick(sup, clock, TIMEOUT_S - 1)
    assert tick(sup, clock, 2)
    err = stop(sup)
    assert isinstance(err, NotCaughtUp) and "no partition was ever assigned to this member" in str(err)


def test_a_member_given_no_partition_has_nothing_to_do() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [])
    assert tick(sup, clock)
    assert stop(sup) is None


def test_the_bound_can_be_turned_off() -> None:
    sup, consumer, clock, _ = make(caught_up_timeout_s=0)
    assign(sup, consumer, [TP0])
    assert not tick(sup, clock, 10 * 3600)


# ------------------------------------------------------------------ transactional input (issue 29)
def _take(sup: Supervisor, consumer: FakeConsumer, tp: Any, offsets: range, eof: int | None,
          high: int) -> None:
    """One consume(): records at ``offsets`` and the partition's end event at ``eof``, through
    the real intake (records first, then the end), cut into batches and done."""
    from fakes import msgs

    from runtime.kafka.consumer import Fetched

    f = Fetched()
    if offsets:
        f.runs[tp] = msgs(tp, *offsets)
        f.count = len(offsets)
    if eof is not None:
        f.eof[tp] = eof
    consumer.high[tp] = high
    sup.intake.take(f)
    for batch in sup.intake.cut(fakes.room(), drained=True).batches:
        sup.partitions[tp].tracker.complete(batch.batch_id)


def test_a_committed_transaction_is_caught_up_past_its_commit_marker_and_commits_it() -> None:
    """Ten records in one committed transaction: offsets 0-9, the commit marker at 10, the high
    watermark 11. The consumer never hands over offset 10; its end event says 11."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    _take(sup, consumer, TP0, range(10), eof=None, high=11)
    assert not tick(sup, clock), "the end is not reported yet"
    _take(sup, consumer, TP0, range(0), eof=11, high=11)
    assert tick(sup, clock), "the marker is no work left"
    assert stop(sup) is None
    assert consumer.commits[-1] == {TP0: 11}, "the commit moves past the marker: no lag left of one"


def test_aborted_records_under_read_committed_and_an_open_transaction_are_no_work_left() -> None:
    """read_committed: records 5-9 aborted (their marker at 10) are never handed over, and a
    transaction open from 11 keeps the end reported (the last stable offset) below the high
    watermark (20). Everything the consumer can see is done."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    _take(sup, consumer, TP0, range(5), eof=11, high=20)
    assert tick(sup, clock)
    assert stop(sup) is None
    assert consumer.commits[-1] == {TP0: 11}


def test_an_aborted_transaction_alone_is_caught_up_and_committed_past_its_marker() -> None:
    """read_committed on Apache Kafka: records 0-2 aborted, the abort marker at 3. Nothing is
    handed over; the first report is the end, 4. The group commits 4 (not nothing: a lag of
    4 for ever on a partition that has no work)."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    _take(sup, consumer, TP0, range(0), eof=4, high=4)
    assert tick(sup, clock)
    assert stop(sup) is None
    assert consumer.commits[-1] == {TP0: 4}


def test_the_end_event_skips_nothing_while_records_before_it_are_not_done() -> None:
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    from fakes import msgs

    from runtime.kafka.consumer import Fetched

    f = Fetched()
    f.runs[TP0], f.count, f.eof[TP0] = msgs(TP0, *range(10)), 10, 11
    consumer.high[TP0] = 11
    sup.intake.take(f)
    batches = sup.intake.cut(fakes.room(), drained=True).batches
    tracker = sup.partitions[TP0].tracker
    assert tracker.committable is None, "nothing is done: the marker's offset waits behind the records"
    for b in batches:
        tracker.complete(b.batch_id)
    assert tracker.committable == 11
    assert tick(sup, clock)


def test_a_batch_deferred_again_and_again_is_no_progress_whatever_the_workers_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 29: an output no broker takes deferred its batch for ever; each try re-read the
    partition and kept a worker busy, and `--until-caught-up` with a 20 s bound ran past 150 s."""
    sup, consumer, clock, pool = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 100)
    assert not tick(sup, clock)
    h = pool.handles[0]
    h.alive = True
    monkeypatch.setattr(sup.scheduler, "has_out", lambda tp: tp == TP0)
    p = sup.partitions[TP0]
    p.stats.deferrals = 3  # deferred three times in a row (results.py)
    stopped = False
    for _ in range(int(TIMEOUT_S) + 2):
        h.board.begin(7, 0)  # each try: a worker in the batch...
        intake = p.intake
        intake.next_offset = None  # ...after a rewind, the same records read again
        stopped = stopped or tick(sup, clock, 0.5)
        intake.next_offset = 100
        h.board.end(0)
        stopped = stopped or tick(sup, clock, 0.5)
    assert stopped, "the bound holds"
    assert isinstance(stop(sup), NotCaughtUp)


def test_what_is_left_is_said_once_by_the_verdict_and_never_logged_before(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 28: "did not catch up" was printed three times (the room's log, the CLI's log,
    the CLI's line). The room returns it; `ringmaster run` prints it, once
    (test_cli_run.py)."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 10, high=20)
    caplog.set_level("DEBUG")
    assert not tick(sup, clock, 1.0)
    clock.now += TIMEOUT_S
    assert tick(sup, clock, 1.0)
    err = stop(sup)
    assert isinstance(err, NotCaughtUp)
    assert not [r for r in caplog.records if "did not catch up" in r.getMessage()
                or "records left" in r.getMessage()], "logged before the verdict's one line"


# ---------------------------------------------------------------------- the whole group
TP2 = ("t", 2)


def standing(committed: dict[Any, int], ends: dict[Any, int] | None = None,
             complete: bool = True, mapped: bool | None = None) -> GroupStanding:
    """``mapped``: every partition's end known (None: as ``complete``, which implies it)."""
    return GroupStanding(ends or {TP0: 10, TP1: 10, TP2: 10}, committed, complete,
                         mapped=complete if mapped is None else mapped)


def test_a_member_done_waits_for_the_partitions_another_member_holds() -> None:
    """CI's run on Apache Kafka under KIP-848: a member killed a moment ago kept t[0] until its
    session timed out; the new member, given t[1] alone, finished it and exited 0 with t[0]
    never committed. Its own partitions done, a member waits until the group is at its end."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({TP1: 3})
    assign(sup, consumer, [TP1])
    fetched(sup, consumer, TP1, 3, 10)
    done(sup, TP1, 3, 10)
    assert not tick(sup, clock), "t[0] and t[2] are nobody's done work yet"
    assert consumer.group_asks[-1] is True, "the committed offsets are asked for once its own are done"
    consumer.group = standing({TP0: 10, TP1: 3, TP2: 10})
    assert tick(sup, clock), "every other partition committed at its end"
    assert stop(sup) is None


def test_another_members_commits_moving_is_progress_and_its_partitions_are_named_when_it_stalls() -> None:
    sup, consumer, clock, _ = make()
    consumer.group = standing({TP0: 2, TP2: 10})
    assign(sup, consumer, [TP1])
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    for at in range(3, 9):  # another member works through t[0]: no stall however long it takes
        consumer.group = standing({TP0: at, TP2: 10})
        assert not tick(sup, clock, TIMEOUT_S * 0.6)
    assert tick(sup, clock, TIMEOUT_S + 1), "nothing moved for the bound"
    err = stop(sup)
    assert isinstance(err, NotCaughtUp), err
    assert "1 partition(s) left: t[0] not at its end in the group" in str(err), err
    assert "committed up to offset 8 of 10" in str(err), err


def test_until_the_group_has_answered_nothing_is_judged() -> None:
    sup, consumer, clock, _ = make()
    consumer.group = standing({}, complete=False)
    assign(sup, consumer, [TP0, TP1, TP2])
    all_done(sup, consumer, (TP0, TP1, TP2))
    assert not tick(sup, clock), "the group's answer is not in yet"
    consumer.group = standing({}, complete=True)
    assert tick(sup, clock), "every partition held here: the others' commits do not matter"
    assert stop(sup) is None


def test_a_member_holding_every_partition_stops_before_the_group_answers_for_its_commits() -> None:
    """The group's committed offsets are asked for once this member's own partitions are done,
    and answered a round trip and a check later: ~90 ms at the end of every 2-core bench run,
    5 % of its window (issue 41). A member that holds every partition of the topics knows
    already that no other member has work."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({}, complete=False, mapped=True)
    assign(sup, consumer, [TP0, TP1, TP2])
    for tp in (TP0, TP1, TP2):
        fetched(sup, consumer, tp, 0, 10)
    assert not tick(sup, clock), "nothing done yet"
    for tp in (TP0, TP1, TP2):
        done(sup, tp, 0, 10)
    assert tick(sup, clock), "every partition is this member's: nobody else's commits to wait for"
    assert stop(sup) is None


def test_a_member_holding_some_partitions_waits_for_the_groups_answer() -> None:
    sup, consumer, clock, _ = make()
    consumer.group = standing({}, complete=False, mapped=True)
    assign(sup, consumer, [TP0, TP1])
    all_done(sup, consumer, (TP0, TP1))
    assert not tick(sup, clock), "t[2] is another member's: where it stands is not known yet"
    clock.now += TIMEOUT_S
    assert tick(sup, clock, 1.0)
    err = stop(sup)
    assert isinstance(err, NotCaughtUp), err
    assert "where the rest of the group stands is unknown" in str(err), err


def test_a_member_not_knowing_every_partitions_end_waits_though_it_holds_all_it_was_told() -> None:
    """Until the topics' metadata and every partition's end are answered (``mapped``), holding
    all the partitions seen so far says nothing about the ones not seen."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({}, ends={TP0: 10, TP1: 10}, complete=False, mapped=False)
    assign(sup, consumer, [TP0, TP1])
    all_done(sup, consumer, (TP0, TP1))
    assert not tick(sup, clock)


def test_the_last_result_is_judged_at_once_and_a_busy_loop_at_most_every_50_ms(monkeypatch: Any) -> None:
    """With nothing in any ring and no worker in a batch, the run is judged on the next tick,
    not up to 50 ms later (half that on average: 1.5 % of a 30,000-record run on 2 cores); with
    batches in flight the partitions are walked at most every 50 ms."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 10)
    assert not tick(sup, clock)
    asks = len(consumer.group_asks)
    monkeypatch.setattr(sup.scheduler, "counts", lambda: [1])  # a batch in a worker's ring
    assert not tick(sup, clock, 0.001)
    assert len(consumer.group_asks) == asks, "judged again within 50 ms with a batch in flight"
    monkeypatch.undo()
    done(sup, TP0, 0, 10)
    assert tick(sup, clock, 0.001), "nothing in flight: judged on the next tick"
    assert stop(sup) is None


def test_a_refused_commit_on_a_partition_another_member_finished_is_caught_up() -> None:
    """CI's run: a member's commit was refused (ILLEGAL_GENERATION) while members joined; the
    partition went to another member, which committed it to its end. That is caught up."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({TP2: 10}, ends={TP0: 100, TP1: 10, TP2: 10})
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP0, 0, 100)
    done(sup, TP0, 0, 30)
    consumer.refuse_sync = {TP0: "ILLEGAL_GENERATION"}
    revoke(sup, [TP0])
    consumer.refuse_sync = {}
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    assert not tick(sup, clock), "t[0] refused, and the group has not caught it up"
    consumer.group = standing({TP0: 100, TP2: 10}, ends={TP0: 100, TP1: 10, TP2: 10})
    assert tick(sup, clock)
    assert stop(sup) is None


def test_a_refused_final_commit_that_had_nothing_new_to_commit_is_caught_up() -> None:
    """The 16-core run of `run --members 15`: members finishing together rebalance the group,
    and a member's final commit was refused (ILLEGAL_GENERATION) for partitions whose end it
    had already committed with an acknowledged commit. Nothing was left to commit: exit 0.
    A refused commit that carried offsets past the acknowledged one stays exit 9."""
    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0, TP1])
    all_done(sup, consumer, (TP0, TP1))
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)  # acknowledged: 10 and 10
    assert consumer.acknowledged == {TP0: 10, TP1: 10}
    assert tick(sup, clock)
    consumer.refuse_sync = {TP0: "ILLEGAL_GENERATION"}
    assert stop(sup) is None

    sup, consumer, clock, _ = make()
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 10)
    done(sup, TP0, 0, 5)
    sup.commits.commit(list(sup.partitions.values()), asynchronous=False)  # acknowledged: 5
    done(sup, TP0, 5, 10)
    assert tick(sup, clock)
    consumer.refuse_sync = {TP0: "ILLEGAL_GENERATION"}
    err = stop(sup)
    assert isinstance(err, NotCaughtUp) and "t[0] its commit was refused (ILLEGAL_GENERATION): " \
        "committed up to offset 5 of 10 (5 records left)" in str(err), str(err)


# ---------------------------------------------------------------------- exactly-once
EXACTLY_ONCE = {"topic": "out", "guarantee": "exactly-once"}


def test_under_exactly_once_the_run_stops_only_once_the_group_shows_the_transactions_offsets() -> None:
    """The supervisor commits nothing: a worker reports a batch done once its transaction's
    commit returned, but its offset reaches the group only with the markers that follow.
    Stopping on the member's own view would judge the run before the group has it."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    assert sup.commits.transactional and sup.caught_up.transactional
    consumer.group = standing({TP0: 10}, ends={TP0: 10, TP1: 10})
    assign(sup, consumer, [TP0, TP1])
    all_done(sup, consumer, (TP0, TP1))
    assert not tick(sup, clock), "t[1]'s last transaction is not in the group's offsets yet"
    consumer.group = standing({TP0: 10, TP1: 10}, ends={TP0: 10, TP1: 10})
    assert tick(sup, clock)
    consumer.settled = consumer.group
    assert stop(sup) is None
    assert consumer.commits == [], "the supervisor committed nothing, not even at the stop"
    assert consumer.settle_asks == 1, "the verdict asked the group once more, after the release"


def test_under_exactly_once_a_member_holding_every_partition_still_waits_for_the_groups_offsets() -> None:
    """Holding every partition tells that nobody else has work, not that this member's
    transactions' offsets have reached the group."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    consumer.group = standing({}, ends={TP0: 10, TP1: 10}, complete=False, mapped=True)
    assign(sup, consumer, [TP0, TP1])
    all_done(sup, consumer, (TP0, TP1))
    assert not tick(sup, clock), "the group's committed offsets are not answered yet"
    consumer.group = standing({TP0: 10, TP1: 10}, ends={TP0: 10, TP1: 10})
    assert tick(sup, clock)


def test_under_exactly_once_the_verdict_is_the_groups_stable_offsets_after_the_release() -> None:
    """A batch still running when the stop began ends during the release (its transaction
    committed or not): only a read of the group's offsets asked after it says which."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    consumer.group = standing({TP0: 10}, ends={TP0: 10, TP1: 10})
    assign(sup, consumer, [TP0, TP1])
    for tp in (TP0, TP1):
        fetched(sup, consumer, tp, 0, 10)
    done(sup, TP0, 0, 10)
    done(sup, TP1, 0, 6)
    assert not tick(sup, clock)
    sup.signals.stop_requested = "SIGTERM"
    consumer.settled = standing({TP0: 10, TP1: 6}, ends={TP0: 10, TP1: 10})
    err = stop(sup)
    assert isinstance(err, NotCaughtUp), err
    assert "stopped by SIGTERM; 1 partition(s) left: t[1] not at its end: committed up to offset 6 of 10 " \
           "(4 records left)" in str(err), err
    assert "t[0]" not in str(err)


def test_under_exactly_once_a_partition_done_here_whose_offset_the_group_lacks_is_named() -> None:
    """Done here, but the group's stable answer is short (a transaction whose offsets never
    reached the group): nothing past what the group has counts as done."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    consumer.group = standing({TP0: 7}, ends={TP0: 10})
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 10)
    done(sup, TP0, 0, 10)
    assert not tick(sup, clock), "the group does not show the last transaction's offset"
    sup.signals.stop_requested = "SIGTERM"
    consumer.settled = consumer.group
    err = stop(sup)
    assert isinstance(err, NotCaughtUp), err
    assert "t[0] handled to its end, but the group's committed offset (the workers' transactions') " \
           "is short of it: committed up to offset 7 of 10" in str(err), err


def test_under_exactly_once_an_input_ending_in_a_transactions_marker_is_done_at_its_last_record() -> None:
    """A transactional producer's input ends with a marker no record's offset commits: the
    last batch's transaction commits the offset after its last record, one short of the end."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    consumer.group = standing({TP0: 9}, ends={TP0: 10})
    assign(sup, consumer, [TP0])
    fetched(sup, consumer, TP0, 0, 9, high=10)
    done(sup, TP0, 0, 9)
    sup.partitions[TP0].intake.eof_at = 10
    sup.partitions[TP0].tracker.skip_to(9, 10)
    assert tick(sup, clock)
    consumer.settled = consumer.group
    assert stop(sup) is None


def test_under_exactly_once_a_partition_handed_over_is_not_lost() -> None:
    """A revocation commits nothing here (the transactions did): the partition is handed over,
    and the member waits for the group to show it at its end like any other member's."""
    sup, consumer, clock, _ = make(EXACTLY_ONCE)
    consumer.group = standing({TP0: 10, TP1: 4}, ends={TP0: 10, TP1: 10})
    assign(sup, consumer, [TP0, TP1])
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 4)
    revoke(sup, [TP1])
    fetched(sup, consumer, TP0, 0, 10)
    done(sup, TP0, 0, 10)
    assert not tick(sup, clock), "t[1] went to another member, not at its end yet"
    consumer.group = standing({TP0: 10, TP1: 10}, ends={TP0: 10, TP1: 10})
    assert tick(sup, clock)
    consumer.settled = consumer.group
    assert stop(sup) is None


def test_a_lost_partition_is_not_at_its_end_because_the_group_view_says_a_short_end() -> None:
    """CI's default run on Tansu: both partitions lost in a broker stall, 500 of 3,000 records
    committed; Tansu's ListOffsets answered an end of 1 (the last batch's base offset + 1), and
    the member called itself caught up. What it saw itself is the floor of a partition's end."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({TP0: 500, TP1: 500}, ends={TP0: 1, TP1: 1})
    assign(sup, consumer, [TP0, TP1])
    for tp in (TP0, TP1):
        fetched(sup, consumer, tp, 0, 1000, high=3000)
        done(sup, tp, 0, 500)
    lose(sup, [TP0, TP1])
    for _ in range(5):
        assert not tick(sup, clock, 1.0), "500 of 3,000 is not the end, whatever ListOffsets said"
    consumer.group = standing({TP0: 3000, TP1: 3000}, ends={TP0: 1, TP1: 1})
    assert tick(sup, clock), "another member (or this one, assigned them back) finished them"
    assert stop(sup) is None


def test_another_members_partition_short_only_by_offsets_no_reader_gets_is_at_its_end() -> None:
    """Issue 26: a transactional input's last commit marker; the member holding t[0] committed
    the offset after its last record, one short of the end. The group's answer says the gap
    is empty (group_offsets.py): caught up, at once, not after caught_up_timeout_s."""
    sup, consumer, clock, _ = make()
    consumer.group = standing({TP0: 9, TP2: 10})
    assign(sup, consumer, [TP1])
    fetched(sup, consumer, TP1, 0, 10)
    done(sup, TP1, 0, 10)
    assert not tick(sup, clock), "t[0]'s gap not known to be empty: work left"
    consumer.group = GroupStanding({TP0: 10, TP1: 10, TP2: 10}, {TP0: 9, TP2: 10}, True, {TP0: 8})
    assert not tick(sup, clock), "an answer for another committed offset says nothing of this one"
    consumer.group = GroupStanding({TP0: 10, TP1: 10, TP2: 10}, {TP0: 9, TP2: 10}, True, {TP0: 9})
    assert tick(sup, clock)
    consumer.settled = consumer.group
    assert stop(sup) is None
