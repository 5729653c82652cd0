"""What the host gives the daemon, read before anything touches Kafka: the default worker count
from the CPUs this process may use (affinity mask, cgroup v1/v2 CPU quota), the shared memory
the configuration needs against what shm_dir has free, and shared memory on CPUs that do not
order memory as x86-64 does (refused without the C speedups). One line each, exit 4."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runtime import config, host
from runtime.config import Settings
from runtime.supervisor.control.signals import SignalQueue
from runtime.supervisor.daemon import run as daemon
from runtime.transport import ordered, speedups
from runtime.transport.board import BOARD_BYTES
from runtime.transport.shm import segment_bytes

MiB = 2**20


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def budget(tmp_path: Path, cgroup: str, files: dict[str, str], affinity: set[int] | None = None,
           cpus: int = 16) -> host.CpuBudget:
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(cgroup)
    return host.cpu_budget(proc, tree(tmp_path / "cg", files), affinity or set(range(cpus)), cpus)


def test_cgroup_v2_quota_of_a_container_bounds_the_workers(tmp_path: Path) -> None:
    b = budget(tmp_path, "0::/\n", {"cpu.max": "200000 100000\n"})
    assert b == host.CpuBudget(2, "the cgroup CPU quota (2 CPUs)")


def test_cgroup_v2_quota_is_rounded_down_and_at_least_one(tmp_path: Path) -> None:
    assert budget(tmp_path, "0::/\n", {"cpu.max": "250000 100000\n"}).count == 2
    assert budget(tmp_path / "b", "0::/\n", {"cpu.max": "50000 100000\n"}).count == 1


def test_cgroup_v2_no_quota_leaves_the_cpu_count(tmp_path: Path) -> None:
    b = budget(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"}, cpus=6)
    assert b == host.CpuBudget(6, "os.cpu_count() = 6")


def test_cgroup_v2_an_ancestors_quota_applies(tmp_path: Path) -> None:
    """A pod's limit is on its parent slice; the container's own group says max."""
    b = budget(tmp_path, "0::/kubepods/pod1/ctr\n", {
        "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "kubepods/pod1/cpu.max": "300000 100000\n",
        "kubepods/cpu.max": "max 100000\n",
    })
    assert b.count == 3


def test_cgroup_v1_quota_and_period(tmp_path: Path) -> None:
    b = budget(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert b == host.CpuBudget(1, "the cgroup CPU quota (1.5 CPUs)")


def test_cgroup_v1_inside_a_container_reads_the_mount_it_sees(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path; the container's mount is its own group."""
    b = budget(tmp_path, "4:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "400000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert b.count == 4


def test_cgroup_v1_no_quota(tmp_path: Path) -> None:
    b = budget(tmp_path, "4:cpu,cpuacct:/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n", "cpu,cpuacct/cpu.cfs_period_us": "100000\n"}, cpus=8)
    assert b.count == 8


def test_the_affinity_mask_bounds_the_workers(tmp_path: Path) -> None:
    b = budget(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"}, affinity={0, 1, 2}, cpus=16)
    assert b == host.CpuBudget(3, "the CPU affinity mask (3 of 16 CPUs)")


def test_the_tightest_bound_wins(tmp_path: Path) -> None:
    assert budget(tmp_path, "0::/\n", {"cpu.max": "800000 100000\n"}, affinity={0, 1}).count == 2
    assert budget(tmp_path / "b", "0::/\n", {"cpu.max": "100000 100000\n"}, affinity={0, 1}).count == 1


@pytest.mark.parametrize("text", ["", "garbage\n", "0::/\n"])
def test_unreadable_or_missing_cgroup_files_change_nothing(tmp_path: Path, text: str) -> None:
    b = budget(tmp_path, text, {"cpu.max": "not numbers\n"}, cpus=5)
    assert b.count == 5


def test_no_proc_file_at_all(tmp_path: Path) -> None:
    assert host.cgroup_cpu_quota(tmp_path / "missing", tmp_path) is None


def test_the_config_default_is_the_budget_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    budget = host.CpuBudget(2, "the cgroup CPU quota (2 CPUs)")
    monkeypatch.setattr(config.models, "cpu_budget", lambda: budget)
    s = settings()
    assert s.workers.processes == 2
    assert s.workers.processes_from == "the cgroup CPU quota (2 CPUs)"
    explicit = settings(processes=5)
    assert (explicit.workers.processes, explicit.workers.processes_from) == (5, "workers.processes")


def settings(**workers: object) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "127.0.0.1:1", "group_id": "g", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich", **workers}})


# -- shared memory ---------------------------------------------------------------------------

def test_the_shm_figure_is_what_the_segments_take() -> None:
    s = settings(processes=8)
    ring = segment_bytes(BOARD_BYTES + 8 * MiB)
    assert ring == 8 * MiB + 4096, "a board and a ring in whole pages"
    assert daemon.shm_needed(s, 9) == 9 * ring + segment_bytes(8 * 4096)


def test_too_little_shm_is_one_line_with_the_figure_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """8 workers of 8 MiB in Docker's default 64 MiB /dev/shm."""
    monkeypatch.setattr(daemon, "free_bytes", lambda _d: 64 * MiB)
    line, enough = daemon.shm_report(settings(processes=8))
    assert not enough and "\n" not in line
    assert line.startswith("supervisor.shm_dir '/dev/shm' has 64 MiB free but the rings need 72 MiB "
                           "(8 workers + 1 for a reload, 8 MiB each"), line
    assert "docker run --shm-size=74m" in line and "sizeLimit 74Mi" in line
    assert "lower workers.processes or workers.ring_bytes" in line
    assert daemon.host_problem(settings(processes=8)) == line


def test_enough_shm_passes_and_says_the_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "free_bytes", lambda _d: 73 * MiB)
    line, enough = daemon.shm_report(settings(processes=8))
    assert enough, line
    assert "has 73 MiB free; the rings need 72 MiB" in line
    assert daemon.host_problem(settings(processes=8)) is None


def test_a_missing_shm_dir_is_a_problem(tmp_path: Path) -> None:
    s = settings()
    s = s.model_copy(update={"supervisor": s.supervisor.model_copy(update={"shm_dir": str(tmp_path / "no")})})
    assert daemon.host_problem(s) == f"supervisor.shm_dir {str(tmp_path / 'no')!r} is not a directory"


# -- memory ordering -------------------------------------------------------------------------

def test_x86_64_needs_no_c_to_order_the_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speedups, "native", None)
    for machine in ("x86_64", "AMD64", "amd64"):
        assert ordered.ordering_problem(machine) is None


@pytest.mark.parametrize("machine", ["aarch64", "arm64", "ppc64le", "riscv64", "s390x", ""])
def test_a_weakly_ordered_cpu_without_the_c_speedups_is_refused_in_one_line(
        monkeypatch: pytest.MonkeyPatch, machine: str) -> None:
    monkeypatch.setattr(speedups, "native", None)
    monkeypatch.setattr(speedups, "native_status", "disabled by RINGMASTER_NO_SPEEDUPS")
    line = ordered.ordering_problem(machine)
    assert line is not None and "\n" not in line
    assert f"this CPU ({machine or 'unknown'}) does not order memory as x86-64 does" in line
    assert "disabled by RINGMASTER_NO_SPEEDUPS" in line and "install a built wheel" in line


@pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")
def test_a_weakly_ordered_cpu_with_the_c_speedups_runs() -> None:
    assert ordered.ordering_problem("aarch64") is None


def no_signals() -> SignalQueue:
    """A queue that counts as installed: the test process keeps its own handlers."""
    queue = SignalQueue()
    queue.installed = True
    return queue


def test_the_daemon_refuses_before_touching_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal comes back as exit 4 from run_daemon before the cluster is waited for."""
    monkeypatch.setattr(daemon, "ordering_problem", lambda: "this CPU (aarch64) does not order memory")
    monkeypatch.setattr(daemon, "wait_for_cluster", lambda *a, **k: pytest.fail("Kafka was touched"))
    result = daemon.run_daemon(settings(processes=1), signals=no_signals())
    assert result.exit_code == 4
    assert str(result.error) == "this CPU (aarch64) does not order memory"


def test_the_daemon_refuses_too_little_shm_before_touching_kafka(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(daemon, "free_bytes", lambda _d: 32 * MiB)
    monkeypatch.setattr(daemon, "wait_for_cluster", lambda *a, **k: pytest.fail("Kafka was touched"))
    result = daemon.run_daemon(settings(processes=8), signals=no_signals())
    assert result.exit_code == 4
    assert "has 32 MiB free but the rings need 72 MiB" in str(result.error)


@pytest.mark.skipif(speedups.native is None, reason=f"C speedups: {speedups.native_status}")
def test_ordered_words_read_and_write_the_same_words_as_the_view() -> None:
    words = memoryview(bytearray(64)).cast("q")
    load, store = ordered.ordered_access(words)
    store(3, -7)
    store(0, 2**62)
    assert (words[3], load(3), load(0)) == (-7, -7, 2**62)
    with pytest.raises(IndexError):
        load(8)
    with pytest.raises(ValueError, match="aligned"):
        speedups.native.load_acquire(memoryview(bytearray(64))[1:33], 0)  # type: ignore[union-attr]


def test_without_the_c_speedups_ordered_words_are_the_views_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speedups, "native", None)
    words = memoryview(bytearray(16)).cast("Q")
    load, store = ordered.ordered_access(words)
    store(1, 5)
    assert (words[1], load(1)) == (5, 5)


# -- ringmaster check ------------------------------------------------------------------------

def check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["t"]\n'
                   '[workers]\nplugin = "workers.enrich"\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER")}
    return subprocess.run([sys.executable, "-m", "runtime.cli", "check", "--shallow", "-c", str(cfg)],
                          capture_output=True, text=True, timeout=120, env={**base, **env})


def test_check_says_the_workers_the_shm_and_the_c_path(tmp_path: Path) -> None:
    r = check(tmp_path, RINGMASTER__WORKERS__PROCESSES="3")
    assert r.returncode == 0, r.stderr
    assert "workers: 3 (workers.processes)" in r.stderr
    assert "the rings need 32 MiB (3 workers + 1 for a reload, 8 MiB each" in r.stderr
    if speedups.native is not None:
        assert "hot paths: pack_frame: C, build_records: C" in r.stderr
        assert "C speedups are off" not in r.stderr


def test_check_says_plainly_when_the_python_path_runs_and_what_it_costs(tmp_path: Path) -> None:
    r = check(tmp_path, RINGMASTER_NO_SPEEDUPS="1")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stderr.splitlines() if x.startswith("warning: the C speedups are off"))
    assert "pack_frame (disabled by RINGMASTER_NO_SPEEDUPS)" in line
    assert "about 2.7× the C path's cost per record packed" in line and "install a built wheel" in line


def test_check_fails_with_exit_4_when_shm_is_too_small(tmp_path: Path) -> None:
    r = check(tmp_path, RINGMASTER__WORKERS__PROCESSES="2", RINGMASTER__WORKERS__RING_BYTES=str(2**50))
    assert r.returncode == 4, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ringmaster: error: supervisor.shm_dir '/dev/shm' has "), last
    assert "but the rings need" in last and "--shm-size=" in last
    assert r.stderr.count("the rings need") == 1, "said once"


def test_shm_elsewhere_names_no_docker_flag(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(daemon, "free_bytes", lambda _d: 1 * MiB)
    s = settings(processes=1)
    s = s.model_copy(update={"supervisor": s.supervisor.model_copy(update={"shm_dir": str(tmp_path)})})
    line, enough = daemon.shm_report(s)
    assert not enough and "(1 worker + 1 for a reload" in line
    assert "give it more (a tmpfs of at least 18 MiB there)" in line and "docker" not in line


def test_run_refuses_too_little_shm_before_waiting_for_an_unreachable_cluster(tmp_path: Path) -> None:
    """A real `ringmaster run` against a cluster that never answers (a daemon would wait for
    it for ever): the shm check comes first, exit 4, one line, nothing left in shm_dir."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "127.0.0.1:1"\ngroup_id = "g"\ntopics = ["t"]\n'
                   '[workers]\nplugin = "workers.enrich"\nprocesses = 2\nring_bytes = 1099511627776\n'
                   '[supervisor]\ncontrol_socket = ""\n')
    base = {k: v for k, v in os.environ.items() if not k.startswith("RINGMASTER")}
    r = subprocess.run([sys.executable, "-m", "runtime.cli", "run", "--no-progress", "-c", str(cfg)],
                       capture_output=True, text=True, timeout=120, env=base)
    assert r.returncode == 4, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ringmaster: error: supervisor.shm_dir '/dev/shm' has "), last
    assert "but the rings need 3145728 MiB (2 workers + 1 for a reload" in last
    assert "Kafka" not in r.stderr and "cluster" not in r.stderr, "the cluster was never waited for"
