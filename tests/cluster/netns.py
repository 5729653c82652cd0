"""A network for real: each broker node and each daemon "host" in a network namespace of its
own, joined by veth pairs to one bridge in the test's namespace (which reaches them all, so the
test's own readers stay outside every fault). Faults are made with ``ip`` and ``tc``:

- ``isolate(ns)``: the namespace's link to the bridge down: nobody reaches it, it reaches nobody
  (a node split from the cluster, its controller from the quorum);
- ``block(src, dst)``: ``src`` can no longer reach ``dst`` while everyone else still can: its
  packets to ``dst`` are routed to a namespace that forwards nothing, where they vanish, so
  requests time out (a blackhole route would fail them at once, which a split network does
  not);
- ``slow(ns, delay_ms, loss_pct)``: ``tc netem`` on both ends of the namespace's link;
- ``throttle(ns, kbit)``: a token bucket (``tc tbf``) on both ends: a slow link.

Names carry a prefix unique to the test session (other sessions share the machine), and
``close()`` removes everything made (namespaces, bridge, links, qdiscs, routes go with them),
on failure too; a session killed before its end leaves its namespaces, which the next session's
``sweep_dead()`` removes.

Needs root, ``ip`` and ``tc``; netem also needs a kernel with ``sch_netem`` (``netem_problem``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import psutil

BRIDGE_SUFFIX = "br"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _tc(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["tc", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"tc {' '.join(args)}: {done.stderr.strip()}")
    return done


def network_problem() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not on PATH"
    return None


def session_prefix(pid: int | None = None) -> str:
    """``rm`` and four hex digits of the session's pid: short enough for interface names (15
    bytes, with a suffix), unique among the sessions running at once."""
    return f"rm{(pid or os.getpid()) % 0x10000:04x}"


def sweep_dead() -> list[str]:
    """Remove the namespaces and bridges of test sessions that no longer run; what went."""
    gone = []
    listed = _ip("netns", "list", check=False).stdout
    for name in re.findall(r"^(rm[0-9a-f]{4})-\S+", listed, re.M):
        if not _session_alive(name):
            gone.append(name)
    for prefix in sorted(set(gone)):
        _remove(prefix)
    return sorted(set(gone))


def _session_alive(prefix: str) -> bool:
    marker = f"/run/{prefix}.pid"
    try:
        return psutil.pid_exists(int(open(marker).read()))
    except (OSError, ValueError):
        return False


def _remove(prefix: str) -> None:
    for name in re.findall(rf"^({prefix}-\S+)", _ip("netns", "list", check=False).stdout, re.M):
        _ip("netns", "delete", name, check=False)
    _ip("link", "delete", f"{prefix}{BRIDGE_SUFFIX}", check=False)
    with contextlib.suppress(OSError):
        os.unlink(f"/run/{prefix}.pid")


@dataclass
class Network:
    """One bridge and the namespaces on it. ``add(name)`` gives a namespace its address."""

    prefix: str = field(default_factory=session_prefix)
    made: dict[str, str] = field(default_factory=dict)  # short name -> address
    _next: int = 10

    def __post_init__(self) -> None:
        pid = os.getpid()
        self.subnet = f"10.{200 + (pid >> 8) % 50}.{pid % 256}"
        self.bridge = f"{self.prefix}{BRIDGE_SUFFIX}"
        with open(f"/run/{self.prefix}.pid", "w") as f:
            f.write(str(pid))
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        self.sink = self.add("sink")  # forwards nothing (a new namespace's default): block()'s way

    @property
    def gateway(self) -> str:
        """The test's own address on the bridge."""
        return f"{self.subnet}.1"

    def ns(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def host_link(self, name: str) -> str:
        """The bridge's end of a namespace's link."""
        return f"{self.prefix}{name}"[:15]

    def add(self, name: str) -> str:
        """A namespace joined to the bridge; its address."""
        ns, outside = self.ns(name), self.host_link(name)
        address = f"{self.subnet}.{self._next}"
        self._next += 1
        _ip("netns", "add", ns)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", outside, "master", self.bridge)
        _ip("link", "set", outside, "up")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.made[name] = address
        return address

    def prefix_for(self, name: str, hostname: str | None = None) -> tuple[str, ...]:
        """The command that runs a process in the namespace (and, with ``hostname``, in a UTS
        namespace of its own under that host name, as another machine would be)."""
        enter = ("ip", "netns", "exec", self.ns(name))
        if hostname is None:
            return enter
        return (*enter, "unshare", "--uts", "--", "sh", "-c", f'hostname {hostname} && exec "$@"', "sh")

    # ------------------------------------------------------------------ faults
    def isolate(self, name: str) -> None:
        _ip("link", "set", self.host_link(name), "down")

    def rejoin(self, name: str) -> None:
        _ip("link", "set", self.host_link(name), "up")

    def block(self, src: str, dst: str) -> None:
        """``src`` can no longer reach ``dst``'s address (packets dropped, not refused)."""
        _ip("-n", self.ns(src), "route", "add", f"{self.made[dst]}/32", "via", self.sink)

    def unblock(self, src: str, dst: str) -> None:
        _ip("-n", self.ns(src), "route", "del", f"{self.made[dst]}/32", check=False)

    def slow(self, name: str, delay_ms: int = 0, loss_pct: float = 0.0) -> None:
        """netem on both ends of the namespace's link: each way ``delay_ms``, ``loss_pct``."""
        spec = [*(["delay", f"{delay_ms}ms"] if delay_ms else []),
                *(["loss", f"{loss_pct}%"] if loss_pct else [])]
        _tc("qdisc", "replace", "dev", self.host_link(name), "root", "netem", *spec)
        _ip("netns", "exec", self.ns(name), "tc", "qdisc", "replace", "dev", "eth0", "root", "netem", *spec)

    def throttle(self, name: str, kbit: int) -> None:
        """A token bucket of ``kbit`` on both ends of the namespace's link."""
        spec = ["tbf", "rate", f"{kbit}kbit", "burst", "16kbit", "latency", "500ms"]
        _tc("qdisc", "replace", "dev", self.host_link(name), "root", *spec)
        _ip("netns", "exec", self.ns(name), "tc", "qdisc", "replace", "dev", "eth0", "root", *spec)

    def mend(self, name: str) -> None:
        """Every qdisc of the namespace's link gone, the link up."""
        _tc("qdisc", "del", "dev", self.host_link(name), "root", check=False)
        _ip("netns", "exec", self.ns(name), "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        self.rejoin(name)

    def qdiscs(self) -> list[str]:
        """The qdiscs this network has left on its links (none but the kernel's default)."""
        left = []
        for name in self.made:
            for out in (_tc("qdisc", "show", "dev", self.host_link(name), check=False).stdout,
                        _ip("netns", "exec", self.ns(name), "tc", "qdisc", "show", "dev", "eth0",
                            check=False).stdout):
                left += [ln for ln in out.splitlines() if any(q in ln for q in ("netem", "tbf"))]
        return left

    def close(self) -> None:
        """Everything made goes: the namespaces (their links, qdiscs and routes with them) and
        the bridge."""
        _remove(self.prefix)
        self.made.clear()


def netem_problem() -> str | None:
    """Why ``tc netem`` cannot be used here (None: it can): some kernels are built without
    sch_netem (this project's development machine is one)."""
    probe = f"{session_prefix()}np"
    done = _ip("link", "add", probe, "type", "veth", "peer", "name", f"{probe}x", check=False)
    if done.returncode != 0:
        return f"cannot make a veth pair: {done.stderr.strip()}"
    try:
        tried = _tc("qdisc", "add", "dev", probe, "root", "netem", "delay", "1ms", check=False)
        if tried.returncode == 0:
            return None
        return f"tc netem: {tried.stderr.strip()} (no sch_netem in this kernel)"
    finally:
        _ip("link", "delete", probe, check=False)
