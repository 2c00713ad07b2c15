"""Walk a tree that belongs to a sandbox (hostile) through directory descriptors.

Each directory is opened relative to its parent's descriptor with O_NOFOLLOW, so neither a
symlink nor a directory replaced by one mid-walk leads out of the tree. Depth first,
iteratively (no recursion limit), one descriptor per level, entries in name order (the
same tree, the same order: a snapshot's id is the hash of its tar). What cannot be listed
or opened, and what is deeper than ``MAX_DEPTH``, is reported, never silently skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentbox.errors import InvalidRequest

MAX_DEPTH = 200  # one open descriptor per level; deeper trees are reported, not walked
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Entry:
    dir_fd: int  # the directory holding it (its own for the root)
    name: str  # in dir_fd; "" for the root
    path: str  # relative to the root, POSIX; "" for the root, no trailing "/"
    fd: int | None = None  # a directory's own descriptor, open while it is walked


def walk(root: Path, unreadable: list[str], *, directories: bool = False) -> Iterator[Entry]:
    """Every entry under ``root``: a directory (with ``directories``; the root first) is
    followed by its other entries, then by its subdirectories, each walked in turn.
    Directories that could not be listed or opened go to ``unreadable`` ("." for the
    root's listing, "a/b/" for a subdirectory)."""
    try:
        top = os.open(root, _DIR_FLAGS)
    except OSError as e:
        raise InvalidRequest(f"cannot scan {root}: {e.strerror}", path=str(root)) from e
    stack: list[tuple[int, str, list[str]]] = []  # (fd, relative path, subdirectories left)
    pending: tuple[int, int, str, str] | None = (top, top, "", "")  # fd, parent, name, rel
    try:
        while pending or stack:
            if pending:
                fd, parent, name, rel = pending
                pending = None
                subdirs: list[str] = []
                stack.append((fd, rel, subdirs))
                if directories:
                    yield Entry(parent, name, rel.rstrip("/"), fd)
                try:
                    with os.scandir(fd) as it:
                        entries = sorted(it, key=lambda e: e.name)
                except OSError:
                    unreadable.append(rel or ".")
                    entries = []
                for entry in entries:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        continue  # gone meanwhile
                    if is_dir:
                        subdirs.append(entry.name)
                    else:
                        yield Entry(fd, entry.name, f"{rel}{entry.name}")
                subdirs.reverse()  # popped from the end: alphabetical order
                continue
            fd, rel, subdirs = stack[-1]
            if not subdirs:
                os.close(stack.pop()[0])
                continue
            name = subdirs.pop()
            if len(stack) >= MAX_DEPTH:
                unreadable.append(f"{rel}{name}/")
                continue
            try:
                pending = (os.open(name, _DIR_FLAGS, dir_fd=fd), fd, name, f"{rel}{name}/")
            except FileNotFoundError:
                pass  # removed meanwhile
            except OSError:  # e.g. ELOOP: swapped for a symlink since it was listed
                unreadable.append(f"{rel}{name}/")
    finally:
        for fd, _, _ in stack:
            os.close(fd)
        if pending:
            os.close(pending[0])


__all__ = ["MAX_DEPTH", "Entry", "walk"]
