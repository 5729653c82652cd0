"""``ringmaster console``'s process: one GroupState and its followers per config, the pages under
uvicorn, on loopback unless told otherwise. Runs in: the console process (its main thread runs
the event loop; followers are daemon threads; actions run in uvicorn's worker threads)."""

from __future__ import annotations

import errno
import logging
import socket

import uvicorn

from runtime.config import Settings, parse_listen
from runtime.console.app import Group, build
from runtime.console.followers import Followers
from runtime.console.security import Guard
from runtime.console.state import GroupState
from runtime.errors import AdminListenFailed, ConfigError

log = logging.getLogger("ringmaster.console")


def serve(settings: list[Settings], listen: str, allow_remote: bool, token: str | None,
          read_only: bool) -> None:
    host, port = parse_listen(listen, allow_remote, "--listen",
                              "add --allow-remote (a token is then required for every page)")
    if allow_remote and not token:
        raise ConfigError("--allow-remote needs a token (--token-file FILE or RINGMASTER_CONSOLE_TOKEN): "
                          "every page and action would otherwise be open to whoever reaches the port")
    groups: dict[str, Group] = {}
    for s in settings:
        name = s.kafka.group_id
        if name in groups:
            raise ConfigError(f"two configs name the group {name!r}: give each group once")
        groups[name] = Group(s, GroupState(name))
    listener = _listen(host, port)  # before any reader starts: a port in use is one line, exit 13
    for g in groups.values():
        g.followers = Followers(g.settings, g.state).start()
    app = build(groups, Guard(token, read_only))
    config = uvicorn.Config(app, log_level="warning", access_log=False, server_header=False,
                            date_header=False)
    server = uvicorn.Server(config)
    log.info("console listening", extra={"url": f"http://{host}:{listener.getsockname()[1]}/",
                                         "groups": ",".join(groups), "read_only": read_only,
                                         "token": token is not None})
    try:
        server.run(sockets=[listener])
    finally:
        for g in groups.values():
            if g.followers is not None:
                g.followers.stop()


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, or one line: in use or not on this host (exit 13: it may pass), else
    the option's fault (exit 2)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=128)
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EADDRNOTAVAIL):
            raise AdminListenFailed(f"--listen: cannot listen on {host}:{port}: {exc.strerror} (another "
                                    "process holds it? `ss -ltnp` says which)") from None
        raise ConfigError(f"--listen: cannot listen on {host}:{port}: {exc.strerror}") from None
