"""Start the home's egress daemon (``agentbox.egressd.daemon``) unless one runs.

Apart from the daemon's module, which imports asyncio, the proxy and the audit log: a
process creating a networked sandbox only needs to check that a daemon listens, or
spawn one, and pays for none of that.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from agentbox.errors import SandboxError
from agentbox.network import plane

SPAWN_LOCK = "egress.spawn.lock"
_READY_TIMEOUT = 15.0


def lock_path(home: Path) -> Path:
    """Held by the serving daemon for its whole life (it locks, then listens)."""
    return home / "egress.lock"


@contextlib.contextmanager
def _held(path: Path, blocking: bool) -> Iterator[bool]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def ensure_running(home: Path) -> None:
    """Start the home's egress daemon unless one runs; return once it is listening."""
    plane.ensure_host_setup(plane.home_net(home))
    with _held(home / SPAWN_LOCK, blocking=True):
        with _held(lock_path(home), blocking=False) as free:
            if not free:
                return  # a daemon holds the lock: it is listening (it locks, then listens)
        ready_r, ready_w = os.pipe()
        try:
            with (home / "egress.log").open("ab") as log_file:
                # The daemon forks once more and this child exits at once: the daemon is
                # nobody's child (no zombie, nothing tied to this process's lifetime).
                subprocess.run(
                    [sys.executable, "-m", "agentbox.egressd.daemon", "--home", str(home),
                     "--ready-fd", str(ready_w)],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log_file,
                    pass_fds=(ready_w,),
                    start_new_session=True,
                    check=True,
                )  # fmt: skip
            os.close(ready_w)
            ready_w = -1
            if not _wait_ready(ready_r):
                raise SandboxError(f"the egress proxy did not start; see {home / 'egress.log'}")
        finally:
            os.close(ready_r)
            if ready_w != -1:
                os.close(ready_w)


def _wait_ready(fd: int) -> bool:
    deadline = time.monotonic() + _READY_TIMEOUT
    while (left := deadline - time.monotonic()) > 0:
        if select.select([fd], [], [], left)[0]:
            return os.read(fd, 16).startswith(b"ready")
    return False
