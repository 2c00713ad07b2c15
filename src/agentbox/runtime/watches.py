"""Directory watches in sandboxes: the kernel's inotify events, as they happen, in order.

The host watches the very inodes the sandbox writes through: each directory is opened
inside the sandbox root by :meth:`SandboxFiles.visit_dirs` (in-root resolution, never
through a symlink, on the sandbox user's credentials, so a watch reaches only what the
sandbox user may read) and watched as ``/proc/self/fd/N`` of that open directory; the fd
is closed at once, so no watch pins a sandbox's mounts (its unmount ends the watch).
An event carries a directory's watch and a *name*; the host never opens a path built
from it except through ``SandboxFiles`` again (a new subdirectory of a recursive watch).

One inotify instance serves every watch of the process (``fs.inotify.max_user_instances``
is small and shared by every root process on the host); a reader thread drains it while
any watch exists, and :meth:`Watches.drain` lets a caller settle the queue itself (after
its own mkdir, so that a recursive watch covers the new directory before the next call).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import select
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentbox.errors import AgentboxError, LimitExceeded
from agentbox.isolation import syscalls as sc
from agentbox.runtime.files import SandboxFiles

log = logging.getLogger(__name__)
EventKind = Literal["create", "write", "remove", "rename", "chmod"]
_MASK = (
    sc.IN_CREATE
    | sc.IN_MODIFY
    | sc.IN_ATTRIB
    | sc.IN_DELETE
    | sc.IN_MOVED_FROM
    | sc.IN_MOVED_TO
    | sc.IN_ONLYDIR
    | sc.IN_EXCL_UNLINK
)
# The order fsnotify (and so E2B's envd) reports the bits of one event in.
_KINDS: tuple[tuple[int, EventKind], ...] = (
    (sc.IN_CREATE | sc.IN_MOVED_TO, "create"),
    (sc.IN_MOVED_FROM, "rename"),
    (sc.IN_ATTRIB, "chmod"),
    (sc.IN_MODIFY, "write"),
    (sc.IN_DELETE, "remove"),
)
MAX_DIRS = 4096  # directories one watch may cover
MAX_PENDING = 65536  # events kept for a watch nobody reads; the oldest go first
MAX_DEPTH = 64
_READ_SIZE = 64 * 1024


@dataclass(frozen=True)
class DirEvent:
    path: str  # the entry's sandbox path
    kind: EventKind
    is_dir: bool


@dataclass(eq=False)
class DirWatch:
    """One watch: a directory, its subdirectories when recursive, the events not yet read."""

    files: SandboxFiles
    path: str
    depth: int  # levels below ``path`` covered: 0 = the directory alone
    on_event: Callable[[], None] | None = None  # told (from any thread) that events came
    dirs: dict[int, str] = field(default_factory=dict)  # wd -> sandbox path
    pending: list[DirEvent] = field(default_factory=list)
    dropped: int = 0

    def take(self) -> list[DirEvent]:
        events, self.pending = self.pending, []
        return events

    def _level(self, path: str) -> int:
        rel = posixpath.relpath(path, self.path)
        return 0 if rel == "." else rel.count("/") + 1

    def _push(self, event: DirEvent) -> None:
        self.pending.append(event)
        if len(self.pending) > MAX_PENDING:
            del self.pending[0]
            self.dropped += 1


class Watches:
    """Every directory watch of this process, on one inotify instance."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._fd: int | None = None
        self._wds: dict[int, set[DirWatch]] = {}
        self._reader: threading.Thread | None = None
        self._generation = 0  # of the inotify instance: a reader serves one
        self._wake_r, self._wake_w = -1, -1

    def add(
        self,
        files: SandboxFiles,
        path: str,
        depth: int,
        on_event: Callable[[], None] | None = None,
    ) -> DirWatch:
        """Watch directory ``path`` and ``depth`` levels below it (errors as the file API's:
        FileNotFound, not a directory, permission)."""
        watch = DirWatch(files, path, min(max(depth, 0), MAX_DEPTH), on_event)
        with self._lock:
            self._open()
            try:
                self._cover(watch, path, announce=False)
            except BaseException:
                self._drop(watch)
                raise
            self._start_reader()
        return watch

    def remove(self, watch: DirWatch) -> None:
        with self._lock:
            self._drop(watch)
            if not self._wds:
                self._close()

    def take(self, watch: DirWatch) -> list[DirEvent]:
        """The events of ``watch`` not taken yet, oldest first."""
        with self._lock:  # the reader appends under it
            return watch.take()

    def drain(self) -> None:
        """Read and dispatch every event queued now (callable from any thread)."""
        with self._lock:
            fd = self._fd
            if fd is None:
                return
            while True:
                try:
                    data = os.read(fd, _READ_SIZE)
                except BlockingIOError:
                    return
                self._dispatch(data)

    # -- inside the lock -------------------------------------------------------------------

    def _open(self) -> None:
        if self._fd is None:
            self._fd = sc.inotify_init1(sc.IN_NONBLOCK | sc.IN_CLOEXEC)
            self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            self._generation += 1

    def _close(self) -> None:
        if self._fd is None:
            return
        os.close(self._fd)
        self._fd = None
        os.write(self._wake_w, b"x")  # the reader sees the fd gone and ends
        os.close(self._wake_w)
        self._reader = None

    def _start_reader(self) -> None:
        if self._reader is None and self._fd is not None:
            self._reader = threading.Thread(
                target=self._read,
                args=(self._fd, self._wake_r, self._generation),
                daemon=True,
                name="dir-watches",
            )
            self._reader.start()

    def _read(self, fd: int, wake: int, generation: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(wake, select.POLLIN)
        try:
            while True:
                ready = {f for f, _ in poller.poll()}
                with self._lock:
                    if self._generation != generation or self._fd is None:
                        return  # closed: the last watch went
                    if fd in ready:
                        self.drain()
        except Exception:  # a dispatch bug must not pass silently, nor kill the gateway
            log.exception("directory watches: the reader stopped")
        finally:
            os.close(wake)

    def _cover(self, watch: DirWatch, path: str, announce: bool) -> None:
        """Add the watches for ``path`` and below it as deep as ``watch`` reaches; with
        ``announce``, entries found inside (made before the watch saw them) are reported
        as created, so a quick ``mkdir -p a/b; touch a/b/f`` is not lost."""
        assert self._fd is not None
        ifd = self._fd

        def visit(spath: str, dirfd: int) -> bool:
            if len(watch.dirs) >= MAX_DIRS:
                if not announce:
                    raise LimitExceeded(
                        f"{watch.path} holds more than {MAX_DIRS} directories to watch; "
                        "watch a deeper directory, or without recursion"
                    )
                log.warning("watch of %s: over %d directories, %s not watched", watch.path,
                            MAX_DIRS, spath)  # fmt: skip
                return False
            wd = sc.inotify_add_watch(ifd, f"/proc/self/fd/{dirfd}", _MASK)
            watch.dirs[wd] = spath
            self._wds.setdefault(wd, set()).add(watch)
            if announce:
                for name in sorted(os.listdir(dirfd)):
                    with contextlib.suppress(OSError):
                        st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                        is_dir = stat.S_ISDIR(st.st_mode)
                        watch._push(DirEvent(posixpath.join(spath, name), "create", is_dir))
            return watch._level(spath) < watch.depth

        watch.files.visit_dirs(path, watch.depth - watch._level(path), visit)

    def _drop(self, watch: DirWatch) -> None:
        for wd in watch.dirs:
            holders = self._wds.get(wd)
            if holders is None:
                continue
            holders.discard(watch)
            if not holders:
                del self._wds[wd]
                if self._fd is not None:
                    with contextlib.suppress(OSError):  # EINVAL: the kernel dropped it
                        sc.inotify_rm_watch(self._fd, wd)
        watch.dirs.clear()

    def _dispatch(self, data: bytes) -> None:
        told: set[DirWatch] = set()
        at = 0
        while at < len(data):
            wd, mask, _cookie, size = sc.INOTIFY_EVENT.unpack_from(data, at)
            at += sc.INOTIFY_EVENT.size
            name = os.fsdecode(data[at : at + size].rstrip(b"\0"))
            at += size
            if mask & sc.IN_Q_OVERFLOW:
                log.warning("directory watches: the kernel's event queue overflowed")
                continue
            for watch in list(self._wds.get(wd, ())):
                directory = watch.dirs.get(wd)
                if mask & sc.IN_IGNORED:  # removed, unmounted: that directory's watch ended
                    watch.dirs.pop(wd, None)
                elif directory is not None and name:
                    self._event(watch, posixpath.join(directory, name), mask)
                    told.add(watch)
            if mask & sc.IN_IGNORED:
                self._wds.pop(wd, None)
        for watch in told:
            if watch.on_event is not None:
                try:
                    watch.on_event()
                except Exception:  # e.g. a stream whose event loop has closed
                    log.debug("directory watch of %s: its listener failed", watch.path)

    def _event(self, watch: DirWatch, path: str, mask: int) -> None:
        is_dir = bool(mask & sc.IN_ISDIR)
        for bits, kind in _KINDS:
            if mask & bits:
                watch._push(DirEvent(path, kind, is_dir))
        if is_dir and mask & (sc.IN_CREATE | sc.IN_MOVED_TO) and watch._level(path) <= watch.depth:
            try:
                self._cover(watch, path, announce=True)
            except (AgentboxError, OSError) as e:
                if not isinstance(e, OSError) or e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    log.info("watch of %s: %s not watched: %s", watch.path, path, e)
