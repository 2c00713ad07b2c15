"""Small filesystem primitives several modules need exactly alike: durable renames, atomic
whole-file writes, an exclusive lock held on a file, whether a path is a mount, and text
the OS can take (exec arguments, environment, stdin); and the kinds of access to a path
that the file API asks its guard about (here, below the policy that judges them)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

from agentbox.errors import InvalidRequest

Access = Literal["read", "write", "create_dir", "symlink_to", "hardlink_to"]
"""What a guarded call is about to do with a path: read it; write, edit, remove or move it
(a move: both ends); create a directory there (judged by its name alone: it is empty); make
a symlink point at it (writes through the link are judged where they land); make a hard
link to it (writes through that one are not: it is the same file)."""


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable: the entry lives in the directory, not the file."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(target: Path, mode: int = 0o600, suffix: str = "") -> Iterator[IO[bytes]]:
    """A temp file beside ``target`` that replaces it on success, fsynced first so that a
    crash leaves the old content or the new, never a part; removed on failure."""
    import tempfile  # here: tempfile (with shutil, random) is no create's, command's or kill's

    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(target.parent)


@contextlib.contextmanager
def locked(path: Path, remove: bool = False) -> Iterator[None]:
    """An exclusive flock on ``path`` (created 0600, never through a symlink) for the block;
    ``remove``: delete the file before letting go (a lock that marks work in progress)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if remove:
            path.unlink(missing_ok=True)
        os.close(fd)


def is_mountpoint(path: Path) -> bool:
    """Whether something is mounted at ``path`` (a device change from its parent)."""
    try:
        return path.stat().st_dev != path.parent.stat().st_dev
    except FileNotFoundError:
        return False


def exec_text(text: str, what: str) -> str:
    """``text`` as exec takes it, else InvalidRequest naming ``what``: no NUL byte, and
    bytes for every character (a lone surrogate outside surrogateescape's range has
    none: subprocess raised UnicodeEncodeError)."""
    if "\0" in text:
        raise InvalidRequest(f"{what} contains a NUL byte; remove it", field=what)
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"{what} holds a lone surrogate, which is not valid Unicode; send valid text",
            field=what,
        ) from None
    return text


def required_text(text: object, what: str, example: str, *, blank: bool = False) -> str:
    """The runtime's one check of a text argument an in-process caller passes (the
    gateway's tool schemas say the same to theirs): a string, not empty (``blank``: nor
    only white space), then ``exec_text``'s checks. ``example`` says what to pass instead.
    """
    if not isinstance(text, str):
        raise InvalidRequest(f"{what} must be a string, got {type(text).__name__}", field=what)
    if not (text.strip() if blank else text):
        raise InvalidRequest(f"{what} is empty: {example}", field=what)
    return exec_text(text, what)


def stdin_bytes(data: bytes | str, what: str = "stdin") -> bytes:
    """Text for a process's stdin as UTF-8, else InvalidRequest naming ``what``."""
    if isinstance(data, bytes):
        return data
    try:
        return data.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(
            f"{what} holds a lone surrogate, which is not valid Unicode; send valid text "
            "(or bytes)",
            field=what,
        ) from None
