"""The lock a process holds while it creates a sandbox: recovery (``runtime/recovery.py``)
leaves a ``creating`` record alone while its creator holds it. Apart from recovery, which
imports the runtime, because the runtime takes this lock."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path

from agentbox.fsutil import locked


def creating_lock(home: Path, sandbox_id: str) -> Path:
    return home / "lib" / "creating" / f"{sandbox_id}.lock"


def creating(home: Path, sandbox_id: str) -> contextlib.AbstractContextManager[None]:
    """Held by the process creating a sandbox, for as long as it does: recovery leaves a
    ``creating`` record alone while its lock is taken."""
    return locked(creating_lock(home, sandbox_id), remove=True)


def creator_alive(home: Path, sandbox_id: str) -> bool:
    try:
        fd = os.open(creating_lock(home, sandbox_id), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return True
        raise
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return False
