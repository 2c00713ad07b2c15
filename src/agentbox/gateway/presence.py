"""Which gateway serves a home: ``HOME/gateway.json``, locked by the gateway that wrote it.

A running gateway owns the home's audit chain (one writer), so local tools that would
otherwise open it (``agentbox mcp``) talk to that gateway instead. The file holds the
gateway's URL; the gateway keeps an exclusive ``flock`` on it for as long as it serves,
so a reader that can take a shared lock knows the file is stale (its writer is gone, and
its port may now belong to anyone: nothing is sent there). The gateway advertises before
its socket is bound (and a bind can fail because another local user holds the port), so
a client sends its token only once :func:`listening` finds the port's listening socket
among the advertising process's own file descriptors.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger(__name__)
ADVERT = "gateway.json"


@dataclass(frozen=True)
class Served:
    """A live gateway's advert: where it listens, and which process it is."""

    url: str
    pid: int

    @property
    def port(self) -> int:
        return int(urlsplit(self.url).port or 0)


class Advert:
    """This process's claim to serve a home; ``close`` withdraws it."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self.fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                self.path.unlink()
        os.close(self.fd)


def advertise(home: Path, url: str) -> Advert | None:
    """Publish ``url`` as the gateway of ``home``; None if another live gateway already is."""
    path = home / ADVERT
    other = serving(home)
    if other is not None:
        log.warning(
            "another gateway (%s) serves %s; agentbox mcp will talk to that one", other, home
        )
        return None
    # Written and locked under a temporary name, then renamed: a reader never sees a
    # half-written file, nor an unlocked one that is current.
    tmp = home / f".{ADVERT}.{secrets.token_hex(4)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps({"url": url, "pid": os.getpid()}).encode())
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(tmp, path)
    except OSError:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return Advert(path, fd)


def serving(home: Path) -> Served | None:
    """The gateway serving ``home`` now, or None."""
    try:
        f = (home / ADVERT).open("rb")
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:  # its gateway holds it: alive
            advert = json.loads(f.read())
            return Served(str(advert["url"]), int(advert["pid"]))
        return None  # stale: the lock died with its writer (the shared lock goes on close)


def listening(served: Served) -> bool:
    """Whether the advertising process itself holds a listening TCP socket on its port
    (so what answers there is the gateway, not whoever else bound the port)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as rows:
            next(rows)  # the header
            for row in rows:
                fields = row.split()
                port = int(fields[1].rpartition(":")[2], 16)
                if fields[3] == "0A" and port == served.port:  # 0A: LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        fds = list(os.scandir(f"/proc/{served.pid}/fd"))
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd.path) in inodes:
                return True
    return False
