"""``ringmaster run``'s daemon: own the resources (shared memory, workers, the consumer, the
admin endpoint), run the supervisor, and release every resource on every exit path
(invariant 7). Runs in: the supervisor process."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from runtime.config import Settings, max_message_bytes
from runtime.errors import ConfigError, RingmasterError, SharedMemoryError
from runtime.kafka.admin import ClusterProbe
from runtime.kafka.consumer import GroupConsumer
from runtime.kafka.fencing import fence_ids
from runtime.kafka.producer import OutputProducer
from runtime.kafka.properties import consumer_properties, producer_properties, share_consumer_properties
from runtime.kafka.share_consumer import ShareGroupConsumer, prepare_share_group
from runtime.kafka.transactions import transactional_id
from runtime.ops import backstop, member_slot
from runtime.ops.admin_server import AdminServer
from runtime.ops.cluster import cluster_problem, wait_for_cluster
from runtime.ops.control import OperatorPauses
from runtime.ops.control_socket import ControlServer, control_socket_path
from runtime.ops.member_status import Extra, StatusPublisher, ensure_status_topic, member_id, status_topic
from runtime.ops.metrics import Histograms, RuntimeMetrics
from runtime.ops.status import StatusFile, StatusSnapshot
from runtime.ops.systemd import Notifier
from runtime.ops.topic_commands import Requests
from runtime.supervisor.control.signals import SignalQueue
from runtime.supervisor.daemon.loop import Supervisor
from runtime.supervisor.datapath.deadletter_desk import DeadLetterDesk
from runtime.supervisor.seams.pool import PluginCode
from runtime.supervisor.workers.pool import ProbeOutcome, WorkerPool, probe_plugin
from runtime.supervisor.workers.snapshots import PluginSources
from runtime.transport.board import BOARD_BYTES, EpochTable
from runtime.transport.groupmeta import GROUP_METADATA_BYTES, GroupMetadataCell
from runtime.transport.ordered import ordering_problem
from runtime.transport.packing import PACK
from runtime.transport.shm import SegmentSet, check_space, free_bytes, reclaim_stale, segment_bytes
from runtime.transport.speedups import python_warning
from runtime.worker.spec import WorkerSpec

log = logging.getLogger("ringmaster.supervisor")


@dataclass
class RunResult:
    exit_code: int
    final_status: StatusSnapshot | None
    consumer_abandoned: bool
    error: RingmasterError | None = None


def worker_spec(settings: Settings, segments: SegmentSet | None,
                member: str = "") -> Callable[[int, int, str, PluginCode], WorkerSpec]:
    """What a worker is started with. ``segments`` None: a worker that never reads a ring
    (``ringmaster check``'s probe). ``member``: what names this daemon in its workers'
    transactional ids (``transaction_member``)."""
    dl = settings.dead_letter
    epochs_path = "" if segments is None else str(segments.dir / f"{segments.prefix}epochs")
    exactly_once = settings.output.guarantee == "exactly-once" and segments is not None
    group_path = str(segments.dir / f"{segments.prefix}group") if exactly_once and segments else ""
    member = member or f"{socket.gethostname()}-{os.getpid()}"

    def spec(index: int, incarnation: int, segment_path: str, code: PluginCode) -> WorkerSpec:
        return WorkerSpec(
            index=index, incarnation=incarnation, segment_path=segment_path,
            epochs_path=epochs_path,
            plugin=code.plugin, settings=dict(code.settings),
            output_topic=settings.output.topic, dead_letter_topic=dl.topic,
            producer_props=producer_properties(settings), max_attempts=dl.max_attempts,
            retry_backoff_s=dl.retry_backoff_s, retry_backoff_max_s=dl.retry_backoff_max_s,
            parent_pid=os.getpid(), delivery_timeout_s=settings.output.delivery_timeout_s,
            max_message_bytes=max_message_bytes(settings), log_level=settings.supervisor.log_level,
            log_format=settings.supervisor.log_format, input_topics=tuple(settings.kafka.topics),
            transactional_id=transactional_id(settings.kafka.group_id, member, index) if exactly_once else "",
            group_metadata_path=group_path, pipelined_delivery=settings.workers.pipelined_delivery,
            group_props=offsets_reader_properties(settings) if exactly_once else {})
    return spec


def transaction_member(settings: Settings, release: contextlib.ExitStack) -> str:
    """What names this daemon in its workers' transactional ids (runtime/kafka/transactions.py),
    stable across its death and replacement so that the replacement fences what it left open:
    the static member's ``group.instance.id``, else this host and the slot this daemon holds
    among the group's daemons on it (runtime/ops/member_slot.py), let go of at exit."""
    static = settings.kafka.consumer.get("group.instance.id")
    if static:
        return str(static)
    slot = member_slot.claim(settings.kafka.group_id)
    release.callback(slot.release)
    return member_slot.member_name(socket.gethostname(), slot.index)


def _fence_other_slots(settings: Settings, member: str, slots: range) -> None:
    """Fence, on a thread of its own, the transactional ids of the worker slots this daemon
    does not start (runtime/kafka/fencing.py): its workers fence their own as they start."""
    ids = [transactional_id(settings.kafka.group_id, member, i) for i in slots]
    threading.Thread(target=fence_ids, args=(producer_properties(settings), ids,
                                             settings.output.delivery_timeout_s),
                     name="ringmaster-fence", daemon=True).start()


def offsets_reader_properties(settings: Settings) -> dict[str, Any]:
    """The client a worker reads the group's committed offsets with (exactly-once): the
    consumer's properties (credentials, TLS), less the static membership it never takes."""
    props: dict[str, Any] = dict(consumer_properties(settings))
    props.pop("group.instance.id", None)
    return props


@contextlib.contextmanager
def _stop_requests() -> Iterator[Callable[[], bool]]:
    """SIGTERM/SIGINT while waiting for the cluster (before the supervisor installs its own
    handlers) ask the wait to end; the previous handlers come back afterwards, so a signal
    during the creation of resources ends the process as it always did."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return
    seen: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: seen.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield lambda: bool(seen)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def check_plugin_starts(settings: Settings) -> ProbeOutcome:
    """``ringmaster check``: start the plugin in a throw-away worker, on the same start path
    and with the same settings as the daemon's workers, bounded by workers.setup_timeout_s."""
    w = settings.workers
    spec = worker_spec(settings, None)(0, 1, "", PluginCode(1, w.plugin, dict(w.settings)))
    # The probe creates the output producer like any worker (a property librdkafka refuses
    # fails here too), but never sends: its connection attempts are not worth a log line.
    spec = dataclasses.replace(spec, producer_props={**spec.producer_props, "log_level": 2})
    return probe_plugin(spec, w.start_method, w.setup_timeout_s)


def run_daemon(settings: Settings, on_status: Callable[[StatusSnapshot], None] | None = None,
               on_started: Callable[[Supervisor], None] | None = None,
               reread: Callable[[], Settings] | None = None,
               signals: SignalQueue | None = None, member: int | None = None) -> RunResult:
    """Everything ``ringmaster run`` does: own the resources (shared memory, workers, the
    consumer, the control socket), run the supervisor, and release every resource on every
    exit path (invariant 7). Errors the user must act on come back in RunResult, not as
    exceptions. ``reread``: the config file read again, for a reload (SIGHUP, ``ringmaster
    reload``).

    ``signals``: the queue ``ringmaster run`` installed at its start; else one is installed
    here, before any resource exists, so no signal of signals.py ends the process with
    shared memory left behind (the loop acts on what arrived once it runs).

    ``member``: this daemon's index among the members ``ringmaster run --members`` started
    (runtime/supervisor/daemon/members.py). Member 0 is the one a lone daemon would be: the config's
    control socket, admin endpoint and status file; the others serve a pid-named control
    socket only, whichever of them gets there first."""
    signals = (signals or SignalQueue()).install()
    sup = settings.supervisor
    consumer: GroupConsumer | ShareGroupConsumer | None = None
    supervisor: Supervisor | None = None
    control: ControlServer | None = None
    # INVARIANT (7): each resource is released on every exit path, the last taken first: the
    # group is left before the workers stop, and they stop before their rings are unlinked.
    with contextlib.ExitStack() as release:
        release.callback(backstop.disarm)  # the first in: the last out (_bound_the_release)
        try:
            sources = PluginSources()
            release.callback(sources.close)
            status_file = StatusFile(sup.status_file)  # a bad directory is a config error: before anything
            # What this host cannot give is said before Kafka is touched (exit 4, one line): a
            # segment of a dead run of ours still counts against what is free until reclaimed.
            reclaim_stale(sup.shm_dir)
            problem = host_problem(settings)
            if problem is not None:
                raise SharedMemoryError(problem)
            with _stop_requests() as stop_requested:
                # An unreachable cluster is an outage: a daemon waits for it (a batch run gives up
                # after kafka.connect_timeout_s, exit 8), before it owns anything to release.
                give_up = settings.kafka.connect_timeout_s if sup.stop_when_caught_up else None
                answered, cluster_id = _wait_for_the_cluster(settings, give_up, stop_requested)
                if not answered:
                    log.info("stop requested while waiting for the Kafka cluster")
                    return RunResult(0, None, False)
                problem = cluster_problem(settings, cluster_id)
                if problem is not None:
                    raise ConfigError(problem)
            socket_path = control_socket_path(settings)
            admin_listen = settings.admin.listen
            if socket_path is not None:  # unusable: an error, before anything else
                control = ControlServer(socket_path, beside=bool(member))
                release.callback(control.close)  # (idempotent: the commands close it too)
                if control.path != socket_path:
                    # Another daemon of this group, from this config, runs on this host and holds
                    # the config's own socket, admin endpoint and status file: this one answers on
                    # its pid-named socket (ringmaster status/reload/scale reach both).
                    admin_listen, status_file = None, StatusFile(None)
                    if member:
                        log.info("member of ringmaster run --members: this one serves its own control socket "
                                 "only (member 0 has the admin endpoint and the status file)",
                                 extra={"member": member, "control_socket": str(control.path)})
                    else:
                        log.warning("another daemon of this group runs on this host: this one serves its own "
                                    "control socket only (no admin endpoint, no status file)",
                                    extra={"control_socket": str(control.path), "first": str(socket_path)})
            if member and socket_path is None:  # no control socket: still only member 0 serves these
                admin_listen, status_file = None, StatusFile(None)
            reclaim_stale(sup.shm_dir)  # again: a run that died while we waited for the cluster
            w = settings.workers
            _warn_if_no_room_to_grow(settings)
            segments = SegmentSet(sup.shm_dir)
            release.callback(segments.unlink_all)
            epochs = EpochTable(segments.create("epochs", 8 * sup.max_partitions).buf)
            release.callback(epochs.release)
            group_cell = None
            if settings.output.guarantee == "exactly-once":
                group_cell = GroupMetadataCell(segments.create("group", GROUP_METADATA_BYTES).buf)
                release.callback(group_cell.release)
            txn_member = transaction_member(settings, release) if group_cell is not None else ""
            # One slot more than max_processes: a reload's first new worker runs beside the old ones.
            pool = WorkerPool(segments, w.processes, w.ring_bytes, w.start_method,
                              worker_spec(settings, segments, txn_member), max_slots=w.process_limit + 1,
                              sources=sources)
            release.callback(_release_pool, pool)
            if txn_member:
                _fence_other_slots(settings, txn_member, range(w.processes, pool.max_slots))
            consumer = _consumer(settings, pool, group_cell)
            release.callback(_close_consumer, consumer)
            desk = None
            if settings.dead_letter.topic is not None:
                desk = DeadLetterDesk(settings.dead_letter.topic,
                                      lambda: OutputProducer(producer_properties(settings)),
                                      max_message_bytes(settings), time.monotonic,
                                      settings.output.retry_backoff_s, settings.output.retry_backoff_max_s)
                release.callback(desk.close, 2.0)
            pauses = OperatorPauses.for_settings(settings) if settings.control.enabled else None
            if pauses is not None:
                release.callback(pauses.close)
            # The console's commands come through the control topic, beside the socket's requests.
            requests = Requests(control, pauses, member_id())
            publisher = _status_publisher(settings, pauses, requests)
            if publisher is not None:
                release.callback(publisher.close, 2.0)  # after the final snapshot: it is sent too
                on_status = _each(on_status, publisher.offer)
            # Fed by the loop; served with the rest of /metrics, which reads the supervisor.
            histograms = Histograms(settings.kafka.group_id) if admin_listen else None
            supervisor = Supervisor(settings, consumer, pool, epochs, on_status=on_status, dead_letters=desk,
                                    pauses=pauses, histograms=histograms, status_file=status_file,
                                    control=requests, reread=reread, signals=signals)
            release.callback(supervisor.commands.close, "the daemon is stopping")  # idempotent
            if admin_listen:
                sv = supervisor
                metrics = RuntimeMetrics(lambda: sv.latest_status, settings.admin.partition_metrics,
                                         sv.loop_age, group=settings.kafka.group_id, histograms=histograms)
                admin = AdminServer(admin_listen, settings.admin.allow_remote, metrics,
                                    lambda: sv.latest_status, sv.health, sv.ready,
                                    max_connections=settings.admin.max_connections,
                                    request_timeout_s=settings.admin.request_timeout_s).start()
                release.callback(admin.close)
            if on_started is not None:
                on_started(supervisor)
            if "processes" not in settings.workers.model_fields_set:
                log.info("workers sized to the CPUs this process may use", extra={
                    "workers": settings.workers.processes, "bound_by": settings.workers.processes_from})
            slow = python_warning([PACK])  # said at every start, beside the start-up line
            if slow is not None:
                log.warning(slow)
            try:
                code = supervisor.run()
            finally:
                _bound_the_release(settings, supervisor, segments)
            return RunResult(code, supervisor.final_status, consumer.abandoned)
        except RingmasterError as exc:
            final = supervisor.final_status if supervisor is not None else None
            return RunResult(exc.exit_code, final, consumer.abandoned if consumer is not None else False, exc)


def _wait_for_the_cluster(settings: Settings, give_up: float | None,
                          stop: Callable[[], bool]) -> tuple[bool, str | None]:
    """(True, the cluster's id) once it answers; (False, None) when a stop was asked for
    meanwhile. The probe's admin client goes with this frame: kept in run_daemon's, it held
    its threads and a connection to the broker it asked as long as the daemon ran."""
    probe = ClusterProbe(consumer_properties(settings))
    if wait_for_cluster(settings, give_up_after_s=give_up, stop=stop, notify=Notifier().notify,
                        probe=probe) is None:
        return False, None
    return True, probe.cluster_id


def _status_publisher(settings: Settings, pauses: OperatorPauses | None,
                      requests: Requests) -> StatusPublisher | None:
    """This member's status records for ``ringmaster console`` (runtime/ops/member_status.py), or
    None when off (``control.status_interval_s = 0``) or the topic cannot be made: a warning,
    never a reason not to start."""
    interval = settings.control.status_interval_s
    if not interval:
        return None
    try:
        ensure_status_topic(settings)
        sender = OutputProducer(producer_properties(settings), own_topics=(status_topic(settings),))
    except RingmasterError as exc:
        log.warning("no status records for the console: the status topic cannot be used", extra={
            "topic": status_topic(settings), "error": str(exc)})
        return None
    guarantee, group_type = settings.output.guarantee, settings.kafka.group_type

    def extra() -> Extra:
        read_to = pauses.read_to if pauses is not None else None
        return Extra(guarantee, group_type, read_to, requests.answers())

    return StatusPublisher(status_topic(settings), sender, interval, extra)


def _each(*calls: Callable[[StatusSnapshot], None] | None) -> Callable[[StatusSnapshot], None]:
    def each(snap: StatusSnapshot) -> None:
        for call in calls:
            if call is not None:
                call(snap)
    return each


def _bound_the_release(settings: Settings, supervisor: Supervisor, segments: SegmentSet) -> None:
    """What is left of a stop once the supervisor has stopped (the callbacks of run_daemon's
    ExitStack: the control topic's reader, the dead-letter producer, the admin endpoint, the
    workers, the segments) ends within the rest of supervisor.shutdown_timeout_s, and never
    less than _RELEASE_FLOOR_S, also if one of them waits for good holding the GIL."""
    stopped = supervisor.final_status.stopped if supervisor.final_status is not None else None
    code = stopped.code if stopped is not None else 1  # 1: run() raised what is not a RingmasterError
    deadline = supervisor.stop_deadline or time.monotonic() + settings.supervisor.shutdown_timeout_s
    left = max(deadline - time.monotonic(), 0.0) + _RELEASE_FLOOR_S
    backstop.arm(left, code, log, "releasing what the daemon held did not finish in time; exiting without it "
                 "(offsets were committed before; the workers end with the supervisor)",
                 {"timeout_s": round(left, 1)}, segments.paths())


# The least time the release gets, whatever the supervisor's stop took (it may have used up
# shutdown_timeout_s giving up on leaving the group): a flush of dead letters takes up to 2 s.
_RELEASE_FLOOR_S = 5.0


def _release_pool(pool: WorkerPool) -> None:
    if any(h.process is not None for h in pool.handles):
        pool.stop_all(2.0)
    pool.kill_strays()
    pool.close()


def _close_consumer(consumer: GroupConsumer | ShareGroupConsumer) -> None:
    try:
        consumer.close(5.0)
    except Exception:  # already failing; the group will time us out
        log.debug("consumer close failed", exc_info=True)


def _consumer(settings: Settings, pool: WorkerPool,
              group_cell: GroupMetadataCell | None) -> GroupConsumer | ShareGroupConsumer:
    if settings.kafka.group_type == "consumer":
        # Exactly-once: the workers' transactions carry the group's metadata (KIP-447 fencing).
        return GroupConsumer(consumer_properties(settings),
                             on_group_metadata=None if group_cell is None else group_cell.write)
    props = share_consumer_properties(settings)
    group = prepare_share_group(props, settings.kafka.group_id, settings.kafka.connect_timeout_s)

    def wait_for_workers(timeout_s: float) -> None:
        """While a poll's records are out: until a worker reports or dies, or timeout_s."""
        waitables = pool.result_fds() + pool.sentinels()
        if waitables:
            select.select(waitables, [], [], timeout_s)
        else:
            time.sleep(timeout_s)

    return ShareGroupConsumer(props, wait_for_workers, group=group)


def _warn_if_no_room_to_grow(settings: Settings) -> None:
    """Rings beyond workers.processes are created when a resize or a reload needs them (a
    reload runs one worker more than the pool while it replaces them); say at start if shm_dir
    could not hold them all (the resize or reload would then fail with this message)."""
    w, sup = settings.workers, settings.supervisor
    need = shm_needed(settings, w.process_limit + 1)
    try:
        check_space(sup.shm_dir, need)
    except RingmasterError as exc:
        log.warning("workers.max_processes may not be reachable", extra={"error": str(exc)})


def shm_needed(settings: Settings, workers: int) -> int:
    """Bytes of supervisor.shm_dir that ``workers`` worker slots take: each a segment of its
    board and ring (whole pages), plus the run's epoch table."""
    w, sup = settings.workers, settings.supervisor
    return workers * segment_bytes(BOARD_BYTES + w.ring_bytes) + segment_bytes(8 * sup.max_partitions)


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**20:.2f} MiB"


def shm_report(settings: Settings) -> tuple[str, bool]:
    """One line on supervisor.shm_dir against what the configuration needs, and whether it is
    enough. Needed at start: workers.processes slots and one more, which a reload's first new
    worker takes while the old ones still run (a reload that found no room would fail)."""
    w, sup = settings.workers, settings.supervisor
    need = shm_needed(settings, w.processes + 1)
    where = f"supervisor.shm_dir {sup.shm_dir!r}"
    if not os.path.isdir(sup.shm_dir):
        return f"{where} is not a directory", False
    try:
        free = free_bytes(sup.shm_dir)
    except OSError as exc:
        return f"{where} cannot be read: {exc.strerror}", False
    figure = (f"{w.processes} worker{'s' if w.processes > 1 else ''} + 1 for a reload, "
              f"{_mib(segment_bytes(BOARD_BYTES + w.ring_bytes))} each (workers.ring_bytes), and the "
              "partition table")
    if free >= need:
        return f"{where} has {_mib(free)} free; the rings need {_mib(need)} ({figure})", True
    size = -(-need // 2**20) + 1
    if os.path.realpath(sup.shm_dir) == "/dev/shm":
        more = (f"docker run --shm-size={size}m; Kubernetes: an emptyDir with medium Memory and sizeLimit "
                f"{size}Mi at /dev/shm, docs/deploy.md")
    else:
        more = f"a tmpfs of at least {size} MiB there"
    return (f"{where} has {_mib(free)} free but the rings need {_mib(need)} ({figure}): give it more "
            f"({more}), or lower workers.processes or workers.ring_bytes", False)


def host_problem(settings: Settings) -> str | None:
    """The one line that says why this host cannot run the configuration, or None. Exit 4."""
    problem = ordering_problem()
    if problem is not None:
        return problem
    line, enough = shm_report(settings)
    return None if enough else line
