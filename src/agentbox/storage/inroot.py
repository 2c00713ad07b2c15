"""One way to open a path inside a directory tree that someone else controls (a sandbox's
root, a template an image built): resolved by the kernel as if the tree were ``/``.

``openat2(rootfd, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`` in one step: ``..``,
absolute symlinks and symlinks that climb up are clamped at the tree's root as in a
chroot, ``/proc`` magic links are refused, and the fd returned is the object acted on, so
no symlink swapped in between a check and a use can redirect it. ``symlinks=False`` also
refuses every symlink on the way (a mount target must be the very directory named).
The file API (``runtime.files``), the template finisher (``runtime.templates.harden``) and
the gVisor tier's host side (``runtime.gvisor_host``) all open through here.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Self

from agentbox.isolation import syscalls

IN_ROOT = syscalls.RESOLVE_IN_ROOT | syscalls.RESOLVE_NO_MAGICLINKS
# openat2 returns EAGAIN when a rename raced with ".." resolution; it is safe to retry.
_EAGAIN_RETRIES = 32


def open_in_root(
    rootfd: int, path: str, flags: int, mode: int = 0, *, symlinks: bool = True
) -> int:
    """Open ``path`` (absolute or relative: both start at the root) with every component
    resolved inside the tree ``rootfd`` is the root of; ``symlinks=False``: refuse any
    symlink on the way (ELOOP)."""
    rel = path.lstrip("/") or "."
    resolve = IN_ROOT if symlinks else IN_ROOT | syscalls.RESOLVE_NO_SYMLINKS
    for _ in range(_EAGAIN_RETRIES):
        try:
            return syscalls.openat2(rootfd, rel, flags, mode, resolve)
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise
    raise OSError(errno.EAGAIN, "path kept changing during resolution")


class InRoot:
    """A directory tree held open as a root (close it, or use ``with``)."""

    def __init__(self, root: Path, *, symlinks: bool = True) -> None:
        self.fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.symlinks = symlinks

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        os.close(self.fd)

    def open(self, path: str, flags: int, mode: int = 0) -> int:
        return open_in_root(self.fd, path, flags, mode, symlinks=self.symlinks)

    def exists(self, path: str, flags: int = 0) -> bool:
        """Whether ``path`` resolves (``flags``: ``O_DIRECTORY`` asks for a directory)."""
        try:
            os.close(self.open(path, os.O_PATH | flags))
        except OSError:
            return False
        return True

    def is_file(self, path: str) -> bool:
        try:
            fd = self.open(path, os.O_PATH)
        except OSError:
            return False
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def read(self, path: str, limit: int = -1) -> bytes | None:
        """A regular file's bytes (at most ``limit``), or None when it is missing or
        anything else (a FIFO planted there must not block the reader: O_NONBLOCK)."""
        try:
            fd = self.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # before open(): a directory raises there
            os.close(fd)
            return None
        with open(fd, "rb") as f:
            return f.read(limit)
