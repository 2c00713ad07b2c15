"""The gateway's unix socket in its home: ``HOME/gateway.sock``, mode 0600 (root's).

SDK scripts on the host reach the home's gateway there (``AGENTBOX_URL=unix://HOME/
gateway.sock``, client/unixhttp.py) without a port, a Host header that must match, or an
HTTP library to import. Authentication is unchanged: every request carries a bearer token.

One gateway owns a home's socket: it holds an exclusive ``flock`` on
``HOME/gateway.sock.lock`` for as long as it serves (the kernel drops it when the process
dies, however it dies). A gateway that finds the lock taken serves TCP only, naming the
pid that holds it, and never touches the socket; one that takes the lock knows any socket
file left there is a dead gateway's, and replaces it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import stat
from pathlib import Path
from typing import Any

from agentbox.endpoint import SOCKET_NAME
from agentbox.errors import Conflict, InvalidConfig

LOCK_SUFFIX = ".lock"


class HomeSocket:
    """A bound, listening socket at ``path`` and the lock that makes it this process's."""

    def __init__(self, path: Path, sock: socket.socket, lock_fd: int) -> None:
        self.path = path
        self.socket = sock
        self._lock_fd = lock_fd
        self._ino = os.stat(path).st_ino

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def close(self) -> None:
        """Remove the socket file (if it is still ours) and release the lock (once)."""
        if self._lock_fd < 0:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._ino:
                self.path.unlink()
        self.socket.close()
        os.close(self._lock_fd)
        self._lock_fd = -1


def bind(home: Path, backlog: int = 2048) -> HomeSocket:
    """Listen on ``home/gateway.sock`` (mode 0600), replacing a dead gateway's socket file;
    ``Conflict`` when a live gateway holds it."""
    home.mkdir(parents=True, exist_ok=True)
    path = home / SOCKET_NAME
    lock_path = home / (SOCKET_NAME + LOCK_SUFFIX)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise Conflict(
            f"another gateway (pid {holder}) serves {home} on {path}: it is left alone "
            f"(for this one to serve it, stop that one first or give this one another "
            f"AGENTBOX_HOME)"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _remove_stale(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            # Created 0600: no moment when another user could connect (the umask is the
            # process's; serve binds before any thread starts).
            mask = os.umask(0o177)
            try:
                sock.bind(str(path))
            finally:
                os.umask(mask)
            os.chmod(path, 0o600)
            sock.listen(backlog)
            sock.setblocking(False)
            return HomeSocket(path, sock, fd)
        except BaseException:
            sock.close()
            raise
    except BaseException:
        os.close(fd)
        raise


def _remove_stale(path: Path) -> None:
    """The socket file a dead gateway left (we hold the lock: no live one owns it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise InvalidConfig(f"{path} exists and is not a socket: move it away")
    path.unlink()


def serve(config: Any, home_socket: HomeSocket | None) -> None:
    """Run uvicorn with ``config`` (its TCP address, TLS there if configured) and, on the
    same event loop and app, the home's socket (plain HTTP: the kernel's file mode is its
    access check, and a token is still required)."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if home_socket is None:
                return
            loop = asyncio.get_running_loop()
            cfg = self.config

            def protocol() -> asyncio.Protocol:
                return cfg.http_protocol_class(  # type: ignore[call-arg]
                    config=cfg,
                    server_state=self.server_state,
                    app_state=self.lifespan.state,
                    _loop=loop,
                )

            server = await loop.create_server(protocol, sock=home_socket.socket)
            self.servers.append(server)  # closed with the others on shutdown

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            await super().shutdown(sockets)
            # Here, not after run(): uvicorn raises the signal that stopped it again once
            # it returns, and the default action ends the process on the spot.
            if home_socket is not None:
                home_socket.close()

    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        server.run()
    if not server.started:  # its error is logged already (a port in use, a failed lifespan)
        raise SystemExit(3)  # uvicorn's STARTUP_FAILURE
