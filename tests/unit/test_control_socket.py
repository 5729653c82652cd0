"""The control socket (runtime/ops/control_socket.py) and the commands room that serves it
(runtime/supervisor/control/commands.py): a Unix socket only the daemon's user can use, one JSON
request and one reply per connection, never blocking the loop; and the `ringmaster reload` /
`scale` commands, which never import the plugin."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import runtime.ops.control_socket as cs
from runtime.config import Settings, load_settings
from runtime.errors import CommandTimeout, ConfigError, ControlDirUnusable, DaemonUnreachable
from runtime.ops.control_socket import ControlServer, Request, control_socket_path, send_command
from runtime.supervisor.control.commands import Commands
from runtime.supervisor.control.rollout import Operation, OpKind, OpState
from runtime.supervisor.control.signals import Asked, Intent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short directory (a socket path is at most 107 bytes; pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="rmctl-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def serve_until(server: ControlServer, n: int = 1, rounds: int = 400) -> list[Request]:
    """Poll as the loop does (each poll returns at once) until n requests are complete."""
    got: list[Request] = []
    for _ in range(rounds):
        got += server.poll()
        if len(got) >= n:
            return got
        threading.Event().wait(0.005)
    raise AssertionError(f"{len(got)} requests, expected {n}")


def in_thread(fn: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn(*args))
        except Exception as exc:
            out.append(exc)
    t = threading.Thread(target=run)
    t.start()
    return t, out


def settings(**supervisor: Any) -> Settings:
    return Settings.model_validate({
        "kafka": {"bootstrap_servers": "x:1", "group_id": "g/with spaces", "topics": ["t"]},
        "workers": {"plugin": "workers.enrich"}, "supervisor": supervisor})


# ---------------------------------------------------------------------- where it is
def test_the_default_path_comes_from_the_config_alone_and_fits_a_socket_address() -> None:
    path = control_socket_path(settings())
    assert path == Path(f"/tmp/ringmaster-{os.getuid()}/g_with_spaces.sock")
    long = Settings.model_validate({"kafka": {"bootstrap_servers": "x:1", "group_id": "g" * 300,
                                              "topics": ["t"]}, "workers": {"plugin": "p"}})
    long_path = control_socket_path(long)
    assert long_path is not None and len(os.fsencode(long_path)) < 108
    other = long.model_copy(update={"kafka": long.kafka.model_copy(update={"group_id": "g" * 299})})
    assert control_socket_path(other) != long_path, "a hash keeps long names apart"
    assert control_socket_path(settings(control_socket="")) is None, '"" turns it off'
    assert control_socket_path(settings(control_socket="/run/rm/a.sock")) == Path("/run/rm/a.sock")


@pytest.mark.parametrize(("value", "error"), [
    ("relative/ctl.sock", "must be an absolute path"),
    ("/" + "x" * 120, "shorter than 108 bytes"),
])
def test_a_control_socket_path_that_cannot_work_is_a_config_error(value: str, error: str) -> None:
    with pytest.raises(ConfigError, match=r"supervisor\.control_socket") as info:
        env = {"RINGMASTER__KAFKA__BOOTSTRAP_SERVERS": "x:1", "RINGMASTER__KAFKA__GROUP_ID": "g",
               "RINGMASTER__KAFKA__TOPICS": "t", "RINGMASTER__WORKERS__PLUGIN": "p",
               "RINGMASTER__SUPERVISOR__CONTROL_SOCKET": value}
        load_settings(None, env=env, check_plugin=False)
    assert error in str(info.value)


# ---------------------------------------------------------------------- the server
def test_the_socket_is_private_and_a_request_gets_its_reply_when_the_loop_gives_it(sockdir: Path) -> None:
    path = sockdir / "ctl.sock"
    server = ControlServer(path)
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
        t, out = in_thread(send_command, path, {"command": "reload"}, 10.0)
        [req] = serve_until(server)
        assert req.body == {"command": "reload"}
        assert t.is_alive(), "the client waits until the operation is over"
        req.reply({"ok": True, "message": "reloaded"})
        t.join(10)
        assert out == [{"ok": True, "message": "reloaded"}] and req.answered
    finally:
        server.close()
    assert not path.exists(), "nothing left behind"


def test_a_client_that_sends_nothing_is_dropped_without_blocking_the_loop(sockdir: Path) -> None:
    clock = Clock()
    server = ControlServer(sockdir / "ctl.sock", clock)
    try:
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(str(sockdir / "ctl.sock"))
        slow.sendall(b'{"command": "rel')  # half a request, and silence
        assert server.poll() == [] and server.poll() == []
        clock.now += 6
        assert server.poll() == []
        slow.settimeout(5)
        reply = json.loads(slow.recv(4096))
        assert reply["ok"] is False and "no complete request" in reply["message"]
        slow.close()
    finally:
        server.close()


def test_a_request_that_is_not_json_is_answered_not_fatal(sockdir: Path) -> None:
    server = ControlServer(sockdir / "ctl.sock")
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(str(sockdir / "ctl.sock"))
        c.sendall(b"reload please\n")
        [req] = serve_until(server)
        assert req.body == {"command": None}
        c.close()
        req.reply({"ok": False, "message": "x"})  # the client went away: no error
    finally:
        server.close()


def test_a_socket_left_by_a_killed_daemon_is_replaced_and_a_second_daemon_gets_its_own(sockdir: Path) -> None:
    path = sockdir / "ctl.sock"
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(path))
    left.close()  # bound, never unlinked: what a SIGKILLed daemon leaves
    server = ControlServer(path)
    try:
        second = ControlServer(path)  # same config, same host: it just works, beside the first
        try:
            assert second.path == sockdir / f"ctl.{os.getpid()}.sock"
            assert server.path == path and path.exists(), "the live daemon's socket is untouched"
            assert cs.candidates(path) == [path, second.path], "the CLI finds both"
        finally:
            second.close()
        assert not (sockdir / f"ctl.{os.getpid()}.sock").exists()
    finally:
        server.close()
    path.write_text("not a socket")
    with pytest.raises(ConfigError, match="exists and is not a socket"):
        ControlServer(path)


def test_pid_named_sockets_of_killed_daemons_are_removed_and_other_groups_left_alone(sockdir: Path) -> None:
    base = sockdir / "g.sock"
    for name in ("g.4242.sock", "g.x.4242.sock", "g.sock.4242", "gg.4242.sock"):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(sockdir / name))
        s.close()
    assert cs.candidates(base) == [sockdir / "g.4242.sock"], "only this group's pid-named sockets"
    ControlServer(base).close()
    assert sorted(p.name for p in sockdir.iterdir()) == ["g.sock.4242", "g.x.4242.sock", "gg.4242.sock"]


def test_closing_leaves_a_socket_that_replaced_ours_alone(sockdir: Path) -> None:
    path = sockdir / "ctl.sock"
    server = ControlServer(path)
    path.unlink()
    path.write_text("someone else's")
    server.close()
    assert path.read_text() == "someone else's"


def test_the_default_directory_must_be_private(sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "_DEFAULT_ROOT", sockdir)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    shared = cs.default_dir()
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(ControlDirUnusable, match="not private to this user") as info:
        ControlServer(shared / "g.sock")
    assert info.value.exit_code == 4, "a fault of the host: a service manager restarts it"
    os.chmod(shared, 0o700)
    ControlServer(shared / "g.sock").close()
    shared.rmdir()
    ControlServer(shared / "g.sock").close()  # created when missing
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o700


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to create a directory as another user")
def test_a_default_directory_another_user_created_first_is_refused_with_a_restartable_exit(
        sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "_DEFAULT_ROOT", sockdir)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    squatted = cs.default_dir()
    squatted.mkdir(mode=0o700)
    os.chown(squatted, 65534, 65534)  # nobody got there first
    with pytest.raises(ControlDirUnusable, match="owned by uid 65534") as info:
        ControlServer(squatted / "g.sock")
    assert info.value.exit_code == 4 and "XDG_RUNTIME_DIR" in str(info.value)


def test_the_session_runtime_directory_comes_first_when_it_is_private(
        sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cs, "_DEFAULT_ROOT", sockdir / "tmp")
    runtime_dir = sockdir / "run"
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    assert cs.default_dirs() == [runtime_dir / "ringmaster", sockdir / "tmp" / f"ringmaster-{os.getuid()}"]
    server = ControlServer(control_socket_path(settings()))
    try:
        assert server.path.parent == runtime_dir / "ringmaster"
        monkeypatch.delenv("XDG_RUNTIME_DIR")  # a CLI without the session's environment
        found, _ = cs.find_daemons(settings())
        assert found == [], "it cannot know the session's directory"
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
        assert cs.find_daemons(settings())[0] == [server.path]
    finally:
        server.close()
    os.chmod(runtime_dir, 0o755)  # not private: not used
    assert cs.default_dirs() == [sockdir / "tmp" / f"ringmaster-{os.getuid()}"]


def _listen_as_another_user(path: Path) -> subprocess.Popen[str]:
    """A process of uid 65534 listening on ``path`` (what a local attacker could leave there)."""
    code = ("import os, socket, sys\n"
            "os.setgid(65534); os.setuid(65534)\n"
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.bind(sys.argv[1]); s.listen(1)\n"
            "print('up', flush=True)\n"
            "while True:\n"
            "    c, _ = s.accept()\n"
            "    try:\n"
            "        c.recv(100); c.sendall(b'{\"ok\": true, \"message\": \"lies\"}\\n')\n"
            "    except OSError:\n"
            "        pass\n"
            "    c.close()\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "up\n"
    return proc


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to listen as another user")
def test_the_client_refuses_a_socket_another_user_listens_on(sockdir: Path) -> None:
    os.chmod(sockdir, 0o777)  # a shared directory (its owner, root, is not the listener)
    proc = _listen_as_another_user(sockdir / "ctl.sock")
    try:
        with pytest.raises(DaemonUnreachable, match="runs as uid 65534") as info:
            send_command(sockdir / "ctl.sock", {"command": "reload"}, 5.0)
        assert info.value.exit_code == 11
        os.chown(sockdir, 65534, 65534)  # a service user's own directory: root may talk to it
        assert send_command(sockdir / "ctl.sock", {"command": "reload"}, 5.0)["message"] == "lies"
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.skipif(os.getuid() == 0, reason="root trusts its own processes, whatever the uid pretended")
def test_the_client_refuses_a_peer_of_another_uid(sockdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = ControlServer(sockdir / "ctl.sock")
    real = os.getuid()
    try:
        monkeypatch.setattr(os, "getuid", lambda: real + 1)  # the daemon now looks like another user's
        with pytest.raises(DaemonUnreachable, match=f"runs as uid {real}"):
            send_command(sockdir / "ctl.sock", {"command": "reload"}, 5.0)
    finally:
        monkeypatch.undo()
        server.close()


def test_the_client_tells_no_daemon_from_no_answer(sockdir: Path) -> None:
    with pytest.raises(DaemonUnreachable, match="does not exist") as info:
        send_command(sockdir / "none.sock", {"command": "reload"}, 1.0)
    assert info.value.exit_code == 11
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(sockdir / "stale.sock"))
    left.close()
    with pytest.raises(DaemonUnreachable, match="no daemon listens"):
        send_command(sockdir / "stale.sock", {"command": "reload"}, 1.0)
    server = ControlServer(sockdir / "ctl.sock")  # accepts, never answers
    try:
        with pytest.raises(CommandTimeout, match=r"no answer within 0\.3 s") as timeout:
            send_command(sockdir / "ctl.sock", {"command": "reload"}, 0.3)
        assert timeout.value.exit_code == 12
    finally:
        server.close()


# ---------------------------------------------------------------------- the commands room
class FakeRollout:
    """Operations that finish when the test says so."""

    def __init__(self) -> None:
        self.target = 4
        self.limit = 8
        self.current: Operation | None = None
        self.last: dict[OpKind, Operation] = {}
        self.calls: list[tuple[str, Any]] = []
        self.refuse = False
        self.code = type("Code", (), {"plugin": "p"})()
        self.version = "v1"
        self.workforce = type("WF", (), {"in_use": lambda _self: [0, 1, 2, 3]})()

    @property
    def busy(self) -> bool:
        return self.current is not None

    def _op(self, kind: OpKind) -> Operation:
        op = Operation(kind, "t", 0.0, 0, self.target, self.target, "v1")
        if self.refuse:
            op.state, op.message = OpState.FAILED, "refused"
        else:
            self.current = op
        self.last[kind] = op
        return op

    def reload(self, requested_by: str) -> Operation:
        self.calls.append(("reload", requested_by))
        return self._op(OpKind.RELOAD)

    def scale(self, processes: int, requested_by: str) -> Operation:
        self.calls.append(("scale", processes))
        return self._op(OpKind.SCALE)

    def finish(self, ok: bool, message: str) -> None:
        assert self.current is not None
        self.current.state = OpState.SUCCEEDED if ok else OpState.FAILED
        self.current.message = message

    def step(self) -> Operation | None:
        op = self.current
        if op is not None and op.state is not OpState.RUNNING:
            self.current = None
            return op
        return None


class Conn:
    """The server's end of a connection: what the room replies."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def settimeout(self, _t: float) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.sent.append(json.loads(data))

    def close(self) -> None:
        pass


class FakeServer:
    def __init__(self) -> None:
        self.waiting: list[Request] = []
        self.closed = False

    def ask(self, body: dict[str, Any]) -> Conn:
        conn = Conn()
        self.waiting.append(Request(body, conn))  # type: ignore[arg-type]
        return conn

    def poll(self) -> list[Request]:
        out, self.waiting = self.waiting, []
        return out

    def close(self) -> None:
        self.closed = True


def room() -> tuple[Commands, FakeServer, FakeRollout]:
    server, rollout = FakeServer(), FakeRollout()
    return Commands(server, rollout), server, rollout  # type: ignore[arg-type]


def test_commands_run_one_at_a_time_and_each_is_answered_when_it_is_over() -> None:
    commands, server, rollout = room()
    first = server.ask({"command": "reload"})
    second = server.ask({"command": "scale", "processes": 6})
    commands.step()
    assert rollout.calls == [("reload", "ringmaster reload")] and not first.sent
    rollout.finish(True, "reloaded: 4 workers run plugin 'p' version v2 (was v1)")
    commands.step()
    assert first.sent[0]["ok"] is True and first.sent[0]["message"].startswith("reloaded")
    assert first.sent[0]["operation"]["kind"] == "reload"
    assert rollout.calls[-1] == ("scale", 6) and not second.sent
    rollout.finish(False, "cannot run 6 workers")
    commands.step()
    assert second.sent[0]["ok"] is False and second.sent[0]["message"] == "cannot run 6 workers"


def test_a_refused_command_is_answered_at_once_and_bad_requests_say_why() -> None:
    commands, server, rollout = room()
    rollout.refuse = True
    refused = server.ask({"command": "scale", "change": 1})
    bad = [server.ask(b) for b in ({"command": "scale", "processes": "7"}, {"command": "scale", "change": 0},
                                   {"command": "scale", "processes": True}, {"command": None},
                                   {"command": "restart"})]
    commands.step()
    assert refused.sent[0] == {"ok": False, "message": "refused", "operation": refused.sent[0]["operation"]}
    assert rollout.calls == [("scale", 5)], "a change is applied to the size aimed at when it starts"
    for conn in bad:
        assert conn.sent and conn.sent[0]["ok"] is False, conn.sent


def test_signals_coalesce_and_carry_on_after_the_operation_in_progress() -> None:
    commands, _server, rollout = room()
    hup, ttin = Asked(Intent.RELOAD, "SIGHUP"), Asked(Intent.GROW, "SIGTTIN")
    ttou = Asked(Intent.SHRINK, "SIGTTOU")
    commands.on_signal(hup)
    commands.step()
    assert rollout.calls == [("reload", "SIGHUP")]
    commands.on_signal(hup)
    commands.on_signal(hup)  # the same reload: it has not started yet
    commands.on_signal(ttin)
    commands.on_signal(ttin)
    commands.on_signal(ttou)
    rollout.finish(True, "done")
    commands.step()
    assert rollout.calls[1] == ("reload", "SIGHUP") and len(rollout.calls) == 2
    rollout.finish(True, "done")
    commands.step()
    assert rollout.calls[2] == ("scale", 5), "TTIN, TTIN, TTOU: one worker more"


def test_the_status_command_is_answered_at_once_and_stopping_answers_whoever_waits() -> None:
    commands, server, _rollout = room()
    waiting = server.ask({"command": "reload"})
    queued = server.ask({"command": "scale", "processes": 2})
    commands.step()
    status = server.ask({"command": "status"})
    commands.step()
    assert status.sent[0]["ok"] and "4 workers run plugin 'p' version v1; reload in progress" in \
        status.sent[0]["message"]
    assert status.sent[0]["status"]["target"] == 4
    commands.close("the daemon is stopping")
    for conn in (waiting, queued):
        assert conn.sent == [{"ok": False, "message": "not done: the daemon is stopping"}]
    assert server.closed


# ---------------------------------------------------------------------- the CLI
def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=60)


def config_file(tmp: Path, sock: Path, plugin: str = "no_such_plugin_module") -> Path:
    path = tmp / "c.toml"
    path.write_text(f'[kafka]\nbootstrap_servers = "x:1"\ngroup_id = "g"\ntopics = ["t"]\n'
                    f'[workers]\nplugin = "{plugin}"\n[supervisor]\ncontrol_socket = "{sock}"\n')
    return path


def test_reload_without_a_daemon_says_so_in_one_line_and_never_imports_the_plugin(sockdir: Path) -> None:
    cfg = config_file(sockdir, sockdir / "ctl.sock")  # the plugin does not even exist
    r = cli("reload", "-c", str(cfg))
    assert r.returncode == 11, r.stderr
    assert r.stderr.count("\n") == 1 and "ringmaster: error: no daemon:" in r.stderr
    assert "Traceback" not in r.stderr
    r = cli("scale", "-c", str(cfg), "--processes", "many")
    assert r.returncode == 2 and "expected a number N, +N or -N" in r.stderr


def test_reload_and_scale_print_the_daemons_answer_and_exit_by_its_outcome(sockdir: Path) -> None:
    sock = sockdir / "ctl.sock"
    cfg = config_file(sockdir, sock)
    server = ControlServer(sock)
    try:
        answers = iter([{"ok": True, "message": "reloaded: 2 workers run plugin 'p' version v2 (was v1)"},
                        {"ok": False, "message": "cannot run 9 workers: workers.max_processes is 4"}])
        seen: list[dict[str, Any]] = []

        def daemon() -> None:
            for req in serve_until(server, 1, rounds=4000):
                seen.append(req.body)
                req.reply(next(answers))

        for args, code, line in ((("reload",), 0, "reloaded: 2 workers"),
                                 (("scale", "-n", "+5"), 10, "ringmaster: error: cannot run 9 workers")):
            t = threading.Thread(target=daemon)
            t.start()
            r = cli(*args, "-c", str(cfg))
            t.join(30)
            assert r.returncode == code, r.stderr
            assert line in (r.stdout + r.stderr) and (r.stdout + r.stderr).count("\n") == 1
        assert seen == [{"command": "reload"}, {"command": "scale", "change": 5}]
    finally:
        server.close()


def test_commands_reach_every_daemon_of_the_group_on_the_host_and_say_which_answered_what(
        sockdir: Path) -> None:
    sock = sockdir / "ctl.sock"
    cfg = config_file(sockdir, sock)
    first = ControlServer(sock)
    second = ControlServer(sock)  # the same config twice on one host
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sockdir / "ctl.999999.sock"))  # left by a killed third: passed over
    stale.close()
    try:
        seen: list[tuple[str, dict[str, Any]]] = []
        done = threading.Event()

        def daemon(server: ControlServer, ok: bool) -> None:
            while not done.wait(0.005):  # as the loop polls, until the command has returned
                for req in server.poll():
                    seen.append((server.path.name, req.body))
                    req.reply({"ok": ok, "message": f"{server.path.name} "
                                                    f"{'reloaded' if ok else 'rolled back'}"})

        threads = [threading.Thread(target=daemon, args=(first, True)),
                   threading.Thread(target=daemon, args=(second, False))]
        for t in threads:
            t.start()
        try:
            r = cli("reload", "-c", str(cfg))
        finally:
            done.set()
            for t in threads:
                t.join(30)
        assert sorted(name for name, _ in seen) == sorted([sock.name, second.path.name])
        assert r.returncode == 10, "one of them refused"
        assert f"{sock}: ctl.sock reloaded" in r.stdout
        assert f"ringmaster: error: {second.path}: {second.path.name} rolled back" in r.stderr
    finally:
        first.close()
        second.close()


def test_a_directory_that_cannot_be_read_is_used_without_the_lock(sockdir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def no_read(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECTORY:
            raise PermissionError(13, "Permission denied")  # mode 0300: enter and write, not read
        return real_open(path, flags, *args)

    # Undone before sockdir's teardown, whose rmtree opens the directory too: left patched,
    # the directory stayed behind in /tmp on every run.
    with monkeypatch.context() as patched:
        patched.setattr(os, "open", no_read)
        server = ControlServer(sockdir / "ctl.sock")
        server.close()
