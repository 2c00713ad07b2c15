# Whole on purpose: each file operation beside the one in-root resolution it must go through
"""The sandbox file API: the host works on a sandbox's files without ever leaving its root.

Resolution strategy
-------------------
* A path is a *sandbox* path. A relative one is joined to ``cwd``; the result is normalised
  as text (``a/../b`` -> ``b``, like ``realpath -s``) so that its last component is always a
  real name. Normalising is convenience, not the protection.
* The protection is the kernel: every path is resolved in one step with
  ``openat2(rootfd, path, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)``
  (:func:`agentbox.storage.inroot.open_in_root`). ``..``, absolute
  symlinks and symlinks that climb up are clamped at the sandbox root exactly as in a
  chroot, ``/proc`` magic links are refused, and there is no check-then-use gap: the fd
  we get back is the object we act on. A symlink swapped in between two calls is simply
  resolved again, inside the root.
* Operations on a *name* (mkdir, unlink, rmdir, rename, link, symlink, lstat) resolve the
  parent directory that way into an ``O_PATH`` fd and act on the final name with the
  ``*at`` syscall (``dir_fd=``), which never follows it: a symlink there is acted on itself.
* Walks (``list`` with depth, recursive ``remove``, ``download_tar``) descend through
  directory fds, opening each child with ``O_NOFOLLOW`` + ``RESOLVE_BENEATH |
  RESOLVE_NO_SYMLINKS``: a directory swapped for a symlink mid-walk fails, never redirects.
* ``write`` follows a symlink in the final component, inside the root, because that is
  what the sandbox's shell does with ``echo > link``. Tar extraction instead replaces an
  existing entry (unlink, then ``O_CREAT|O_EXCL``), as ``tar`` does.
* **Guards** (``guard=``; the gateway passes its file policy): the path must be judged
  by its *canonical* name, which the kernel's walk does not report. Then the path is
  resolved by :func:`_walk` instead: the same in-root semantics, one component at a time
  through ``O_PATH`` fds (each opened with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``,
  symlinks read from their own fd and spliced in, ``..`` back to the canonical parent),
  so the names it returns are those of the directory fd it returns. The guard judges that
  name; the call acts on that fd and final name without following anything more. A
  symlink swapped in afterwards cannot redirect the call (it acts on the fd it judged, or
  refuses a symlink that appeared at the final name). Writes and edits are judged at a
  final symlink's target, name operations (remove, move, mkdir, stat) at the link itself;
  upload entries where they land, a symlink entry also at where its target resolves, a
  hard link entry at its source.

Credentials
-----------
Every call runs on its thread as the sandbox user (``sandbox_credentials``): fsuid/fsgid
set to the user, no supplementary groups, empty effective capability set. The kernel then
checks permissions, quotas (CAP_SYS_RESOURCE would bypass them), ``protected_hardlinks``
and sticky directories just as for the sandbox's shell, and new files belong to the user.

Errors are mapped from ``errno`` to the agentbox error tree; messages name sandbox paths
only, never the host path of the root.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno
import io
import os
import posixpath
import stat
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal, Unpack

from agentbox.errors import (
    AgentboxError,
    Conflict,
    EditMismatch,
    FileExists,
    FileNotFound,
    HostUnsupported,
    InvalidRequest,
    LimitExceeded,
    PermissionDenied,
    SandboxError,
    SandboxNotRunning,
)
from agentbox.fsutil import Access, required_text
from agentbox.hints import Hint
from agentbox.isolation import syscalls
from agentbox.runtime import archive, export_safety
from agentbox.runtime.requests import ExportOptions, WriteMode
from agentbox.runtime.requests_extra import DownloadRequest, WriteRequest
from agentbox.storage.inroot import open_in_root

FileType = Literal["file", "dir", "symlink", "other"]
Guard = Callable[[str, Access], None]
"""Judges a canonical sandbox path (symlinks resolved inside the root) just before the file
API acts on it, and raises to refuse. The file API knows no policy; the gateway passes one."""

DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024
MAX_LIST_DEPTH = 64
MAX_LIST_ENTRIES = 100_000
# Walks hold one fd per level and recurse in Python: bounded well below both limits.
MAX_WALK_DEPTH = 128
_IO_CHUNK = 1 << 20
_MAX_SYMLINKS = 40  # as the kernel's path walk

_CHILD = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_SYMLINKS | syscalls.RESOLVE_NO_MAGICLINKS


# What to tell the agent for an errno: the error class, the reason, and optionally a next
# call: an action of agentbox.hints, the path it takes ("path" or "parent") and the
# sentence naming it ({call}, spelled for the caller's surface).
_ErrnoError = tuple[type[AgentboxError], str, tuple[str, str, str] | None]
_NOT_ALLOWED: _ErrnoError = (
    PermissionDenied,
    "the sandbox user is not allowed to; work under {cwd}, or check the owner and mode",
    ("fs_stat", "path", "{call} to see them"),
)
_NO_SPACE: _ErrnoError = (
    LimitExceeded,
    "the sandbox's disk space or quota is used up; remove files you no longer need, then retry",
    None,
)
_IN_USE: _ErrnoError = (
    Conflict,
    "it is a non-empty directory, a mount point or in use",
    ("fs_remove_tree", "path", "to delete a directory tree, {call}"),
)
# errno -> what to tell the agent. Unlisted errnos become SandboxError.
_ERRNO_ERRORS: dict[int, _ErrnoError] = {
    errno.ENOENT: (
        FileNotFound,
        "it (or a directory on the way) does not exist",
        ("fs_list", "parent", "{call} to see what exists"),
    ),
    errno.EEXIST: (
        FileExists,
        "something already exists there; remove it first, pick another name, "
        "or use the overwrite option",
        None,
    ),
    errno.ENOTEMPTY: _IN_USE,
    errno.EBUSY: _IN_USE,
    errno.ETXTBSY: _IN_USE,
    errno.EACCES: _NOT_ALLOWED,
    errno.EPERM: _NOT_ALLOWED,
    errno.EROFS: (
        PermissionDenied,
        "that filesystem is read-only; write under {cwd} instead",
        None,
    ),
    errno.ENOSPC: _NO_SPACE,
    errno.EDQUOT: _NO_SPACE,
    errno.EFBIG: _NO_SPACE,
    errno.EMLINK: _NO_SPACE,
    errno.EISDIR: (
        InvalidRequest,
        "it is a directory",
        ("fs_list", "path", "{call} to see its entries"),
    ),
    errno.ENOTDIR: (
        InvalidRequest,
        "a component of the path is not a directory",
        ("fs_list", "parent", "{call} to check"),
    ),
    errno.ELOOP: (
        InvalidRequest,
        "too many levels of symbolic links, or a /proc magic link (those are never "
        "followed); point the path at the real file",
        None,
    ),
    errno.ENXIO: (InvalidRequest, "it is a fifo, socket or device, not a regular file", None),
    errno.EXDEV: (
        InvalidRequest,
        "source and destination are on different filesystems; copy it (read, then write) "
        "and remove the source",
        None,
    ),
    errno.EINVAL: (InvalidRequest, "{strerror} (e.g. a directory moved into itself)", None),
    errno.ENAMETOOLONG: (InvalidRequest, "a name or the path is too long; shorten it", None),
    errno.EAGAIN: (Conflict, "the path kept changing while it was resolved; retry", None),
    errno.ENOSYS: (
        HostUnsupported,
        "the host kernel lacks openat2/renameat2 (Linux 5.6+ is needed)",
        None,
    ),
}


@dataclass(frozen=True)
class FileInfo:
    """One entry as the sandbox sees it."""

    path: str
    name: str
    type: FileType
    size: int
    mode: int
    mtime: float
    symlink_target: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _file_info(spath: str, st: os.stat_result, target: str | None = None) -> FileInfo:
    kind: FileType
    if stat.S_ISREG(st.st_mode):
        kind = "file"
    elif stat.S_ISDIR(st.st_mode):
        kind = "dir"
    elif stat.S_ISLNK(st.st_mode):
        kind = "symlink"
    else:
        kind = "other"
    return FileInfo(
        path=spath,
        name=posixpath.basename(spath) or "/",
        type=kind,
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        mtime=st.st_mtime,
        symlink_target=target,
    )


@contextlib.contextmanager
def sandbox_credentials(uid: int, gid: int) -> Iterator[None]:
    """Run the body on this thread with the file credentials of host ``uid``/``gid``.

    Credentials are per thread in Linux, so other threads of the daemon keep theirs. Not
    re-entrant, and the body must not yield to unrelated code (no generators across it).
    """
    groups = os.getgroups()  # the kernel's per-thread list (glibc does not cache it)
    caps = syscalls.thread_capabilities()
    drop_groups = bool(groups) and bool(caps[0] & (1 << syscalls.CAP_SETGID))
    if drop_groups:
        # Supplementary groups (often 0) would grant group access the sandbox user lacks.
        syscalls.thread_setgroups([])
    old_euid, old_egid = os.geteuid(), os.getegid()
    # The effective ids, not only the filesystem ones: some checks (procfs sysctls) look
    # at the euid, and a host-root euid would let the file API write host sysctls.
    # The filesystem ids follow the effective ones.
    syscalls.thread_set_effective_ids(uid, gid)
    try:
        # setfsuid cannot report failure; asking with an invalid id (-1) returns the current.
        if syscalls.setfsuid(0xFFFFFFFF) != uid or syscalls.setfsgid(0xFFFFFFFF) != gid:
            raise SandboxError(
                "could not switch to the sandbox user's file credentials; the daemon needs "
                "CAP_SETUID and CAP_SETGID (run it as root)"
            )
        # An empty effective set also drops what fsuid keeps: CAP_SYS_RESOURCE (quota and
        # reserved-block bypass), CAP_SYS_PTRACE (/proc/PID/mem), CAP_SYS_ADMIN, ...
        # Leaving euid 0 has emptied it already (unless SECBIT_NO_SETUID_FIXUP is set):
        # checked with a capget, which costs a third of a capset (a credential change).
        if syscalls.thread_capabilities()[0] != 0:
            syscalls.set_thread_capabilities(0, caps[1], caps[2])
        yield
    finally:
        try:
            # Root again first: that restores the capabilities the rest needs (euid 0
            # brings back effective = permitted; a capset only when that is not what was).
            syscalls.thread_restore_effective_ids(old_euid, old_egid)
            if syscalls.thread_capabilities() != caps:
                syscalls.set_thread_capabilities(*caps)
            if drop_groups:
                syscalls.thread_setgroups(groups)
        except BaseException:
            # This thread (perhaps the daemon's event loop) would go on running other work
            # with a sandbox user's ids: stopping the process is the only safe outcome.
            sys.stderr.write("agentbox: could not restore a thread's credentials; exiting\n")
            os._exit(70)


def _normalize(path: str, cwd: str) -> str:
    """Absolute, lexically normalised sandbox path; refuses what no filesystem can name."""
    required_text(path, "the path", f"name a file, e.g. {cwd}/notes.txt")
    full = path if path.startswith("/") else f"{cwd}/{path}"
    return "/" + posixpath.normpath(full).lstrip("/")  # normpath keeps a leading "//"


def _open_child(dirfd: int, name: str, flags: int, mode: int = 0) -> int:
    """Open the entry ``name`` of ``dirfd`` itself: never a symlink, never elsewhere."""
    return syscalls.openat2(dirfd, name, flags | os.O_NOFOLLOW, mode, _CHILD)


def _open_subdir(dirfd: int, name: str, spath: str) -> int:
    """Descend into ``name`` during a walk; if it stopped being a directory since we looked
    (a swapped-in symlink), say so instead of following it."""
    try:
        return _open_child(dirfd, name, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
    raise Conflict(f"{spath} changed while it was being walked (no longer a directory); retry")


def _dir_path(names: builtins.list[str]) -> str:
    return "/" + "/".join(names)


def _walk(rootfd: int, spath: str, follow: bool, rest_ok: bool = False) -> tuple[int, str, str]:
    """Resolve ``spath`` inside the root as ``RESOLVE_IN_ROOT`` does, one component at a
    time, keeping the canonical names: (O_PATH fd of the directory that holds the final
    entry, that directory's canonical sandbox path, the final name).

    Each step opens one name of the directory fd in hand, never following anything
    (``_open_child``); a symlink found is read from its own fd and its target spliced into
    the rest of the path (absolute: from the root), ``..`` goes back to the parent by its
    canonical names, clamped at the root. So the walk cannot leave the root, and the names
    returned are those of the objects the fd was reached through: the caller judges the
    name and acts on the fd, with no second lookup. Symlinks on procfs (magic links) are
    refused with ELOOP, as the kernel's walk refuses them.

    ``follow``: follow a symlink in the final component too (the final name is then not a
    symlink, or does not exist); the final name is ``"."`` when the path ends at a
    directory reached through ``..`` or a symlink. ``rest_ok``: when a directory on the
    way is missing (or not a directory, or the links loop), return the unresolved rest as
    the "name" (``a/b``) instead of failing.
    """
    todo = [c for c in reversed(spath.split("/")) if c not in ("", ".")]
    names: builtins.list[str] = []
    fd = os.dup(rootfd)
    links = 0

    def unresolved(error: int) -> tuple[int, str, str]:
        if not rest_ok:
            raise OSError(error, os.strerror(error))
        return fd, _dir_path(names), "/".join([comp, *reversed(todo)])

    try:
        while todo:
            comp = todo.pop()
            if comp == "..":
                if names:
                    names.pop()
                    up = syscalls.openat2(
                        rootfd, "/".join(names) or ".", os.O_PATH | os.O_DIRECTORY, 0, _CHILD
                    )
                    os.close(fd)
                    fd = up
                continue
            if not todo and not follow:
                return fd, _dir_path(names), comp
            try:
                child = _open_child(fd, comp, os.O_PATH)
            except FileNotFoundError:
                if not todo:
                    return fd, _dir_path(names), comp  # a new entry
                return unresolved(errno.ENOENT)
            mode = os.fstat(child).st_mode
            if stat.S_ISLNK(mode):
                try:
                    # /proc links: refused, as by RESOLVE_NO_MAGICLINKS (those on procfs
                    # that are not magic, like /proc/self, name nothing the daemon sees).
                    magic = syscalls.fstatfs_type(child) == syscalls.PROC_SUPER_MAGIC
                    target = "" if magic else os.readlink("", dir_fd=child)  # this link's
                finally:
                    os.close(child)
                links += 1
                if magic or links > _MAX_SYMLINKS or not target:
                    return unresolved(errno.ELOOP if magic or target else errno.ENOENT)
                if target.startswith("/"):
                    names.clear()
                    os.close(fd)
                    fd = os.dup(rootfd)
                todo.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
                continue
            if not todo:
                os.close(child)
                return fd, _dir_path(names), comp
            if not stat.S_ISDIR(mode):
                os.close(child)
                return unresolved(errno.ENOTDIR)
            names.append(comp)
            os.close(fd)
            fd = child
        return fd, _dir_path(names), "."
    except BaseException:
        os.close(fd)
        raise


def _entry_path(directory: str, name: str) -> str:
    return directory if name == "." else posixpath.join(directory, name)


def _link_target(rootfd: int, link: str, target: str) -> str:
    """The canonical sandbox path a symlink at ``link`` (canonical) with ``target`` leads
    to now: resolved inside the root as far as it exists, the rest as written."""
    fd, directory, rest = _walk(rootfd, posixpath.join(posixpath.dirname(link), target),
                                follow=True, rest_ok=True)  # fmt: skip
    os.close(fd)
    return _normalize(_entry_path(directory, rest), "/")


def _judge_new_name(rootfd: int, guard: Guard | None, dirfd: int, name: str, path: str) -> None:
    """The entry ``name`` of ``dirfd`` is about to get the new name ``path`` (a hard link,
    a move). A symlink's relative target then leads somewhere else: judge where."""
    if guard is None:
        return
    if stat.S_ISLNK(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
        guard(_link_target(rootfd, path, os.readlink(name, dir_fd=dirfd)), "symlink_to")


@contextlib.contextmanager
def _parent_of(
    rootfd: int, spath: str, guard: Guard | None = None, access: Access = "write"
) -> Iterator[tuple[int, str, str]]:
    """(O_PATH fd of the parent directory resolved in root, final name, the entry's path).

    With a ``guard`` the parent is resolved by :func:`_walk`, the entry's canonical path
    is judged before anything is done, and that is the path returned; without one the
    kernel resolves the parent and the path is ``spath`` as given."""
    parent, name = posixpath.split(spath)
    if name in ("", ".", ".."):
        raise InvalidRequest(f"{spath} is the sandbox root, not an entry: name a path below it")
    if guard is None:
        fd, path = open_in_root(rootfd, parent, os.O_PATH | os.O_DIRECTORY), spath
    else:
        fd, directory, name = _walk(rootfd, spath, follow=False)
        path = posixpath.join(directory, name)
    try:
        if guard is not None:
            guard(path, access)
        yield fd, name, path
    finally:
        os.close(fd)


Opener = Callable[[int, int], int]
"""Opens the resolved object: ``(flags, mode) -> fd``."""


@contextlib.contextmanager
def _opener(
    rootfd: int, spath: str, guard: Guard | None, access: Access, follow: bool = True
) -> Iterator[Opener]:
    """How to open what ``spath`` names, symlinks followed inside the root: by the kernel's
    ``RESOLVE_IN_ROOT``, or with a ``guard`` by :func:`_walk`, judged at its canonical path
    and then opened without following anything more (a symlink swapped in since: ELOOP)."""
    if guard is None:
        yield lambda flags, mode: open_in_root(rootfd, spath, flags, mode)
        return
    fd, directory, name = _walk(rootfd, spath, follow)
    try:
        guard(_entry_path(directory, name), access)
        yield lambda flags, mode: _open_child(fd, name, flags, mode)
    finally:
        os.close(fd)


def _parent_is_git_dir(rootfd: int, spath: str) -> bool:
    """Whether the directory holding the downloaded entry may be a git directory (so
    that downloading ``.git/hooks`` or ``.git/config`` alone is judged like a tree)."""
    parent = posixpath.dirname(spath)
    try:
        fd = open_in_root(rootfd, parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return True  # unreadable: assume the worst, only vetting follows from it
    try:
        return export_safety.is_git_dir(posixpath.basename(parent), os.listdir(fd))
    finally:
        os.close(fd)


def _read_upto(fd: int, limit: int) -> bytes:
    chunks: builtins.list[bytes] = []
    size = 0
    while size < limit and (chunk := os.pread(fd, min(_IO_CHUNK, limit - size), size)):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view) :]


def _lstat_at(dirfd: int, name: str) -> tuple[os.stat_result, str | None]:
    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    target = None
    if stat.S_ISLNK(st.st_mode):
        with contextlib.suppress(OSError):  # replaced since the stat: report it without target
            target = os.readlink(name, dir_fd=dirfd)
    return st, target


def _xattrs_at(dirfd: int, name: str, prefix: str) -> dict[str, bytes]:
    where = f"/proc/self/fd/{dirfd}/{name}"  # the final name is not followed
    try:
        names = os.listxattr(where, follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP):
            return {}
        raise
    out = {}
    for attr in names:
        if attr.startswith(prefix):
            with contextlib.suppress(OSError):  # ENODATA: removed since the listing
                out[attr[len(prefix) :]] = os.getxattr(where, attr, follow_symlinks=False)
    return out


def _unlink_if_not_dir(dirfd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dirfd)


def _set_regular_blocking(fd: int, spath: str) -> None:
    """Refuse anything but a regular file (opened O_NONBLOCK so a fifo cannot hang us)."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise InvalidRequest(
            f"{spath} is not a regular file (a directory, fifo, socket or device)",
            hint=Hint("fs_stat", {"path": spath}, "{call} to see what it is"),
        )
    os.set_blocking(fd, True)


class _SizedReader:
    """Exactly ``size`` bytes of ``fd`` for tarfile: a file that shrank while being archived
    is padded with zeros, one that grew is cut, so the archive stays well-formed."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._left = size

    def read(self, n: int = -1, /) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        parts: list[bytes] = []
        got = 0
        while got < n:
            chunk = os.read(self._fd, n - got)
            if not chunk:
                parts.append(b"\0" * (n - got))
                break
            parts.append(chunk)
            got += len(chunk)
        self._left -= n
        return b"".join(parts)


class SandboxFiles:
    """Files of one sandbox, seen from the host.

    ``root`` is a host path to the directory that is the sandbox's ``/`` (in production
    ``/proc/<pid>/root`` of its init: the caller must make sure that pid is still the
    sandbox's); ``uid``/``gid`` are the host ids the sandbox user maps to; relative paths
    are relative to ``cwd``, a sandbox path. Sizes are in **bytes**.
    """

    def __init__(
        self,
        root: str,
        uid: int,
        gid: int,
        cwd: str = "/workspace",
        *,
        max_read_bytes: int = DEFAULT_MAX_READ_BYTES,
    ) -> None:
        for what, value in (("uid", uid), ("gid", gid)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**32 - 1:
                # 0 would make the sandbox user host root; -1 is "no change" to setfsuid.
                raise InvalidRequest(f"sandbox {what} must be a non-root host id, got {value!r}")
        if not isinstance(cwd, str) or not cwd.startswith("/"):
            raise InvalidRequest(f"cwd must be an absolute sandbox path, got {cwd!r}")
        if isinstance(max_read_bytes, bool) or max_read_bytes < 1:
            raise InvalidRequest(f"max_read_bytes must be positive, got {max_read_bytes!r}")
        self._root = root
        self._uid = uid
        self._gid = gid
        self._cwd = _normalize(cwd, "/")
        self._max_read = max_read_bytes

    # -- paths and errors --------------------------------------------------------------

    def _sandbox_path(self, path: str) -> str:
        return _normalize(path, self._cwd)

    def _error(self, exc: OSError, action: str, spath: str) -> AgentboxError:
        """Map an OSError to the error tree; the message names ``spath`` and a next step."""
        code = exc.errno or 0
        cls, text, next_call = _ERRNO_ERRORS.get(code, (SandboxError, "{strerror}", None))
        paths = {"path": spath, "parent": posixpath.dirname(spath) or "/"}
        hint = None
        if next_call is not None:
            name, which, sentence = next_call
            hint = Hint(name, {"path": paths[which]}, sentence)
        reason = text.format(**paths, cwd=self._cwd, strerror=os.strerror(code))
        errname = errno.errorcode.get(code, str(code))
        return cls(f"cannot {action} {spath}: {reason}", hint=hint, path=spath, errno=errname)

    @contextlib.contextmanager
    def _mapped(self, action: str, spath: str) -> Iterator[None]:
        """OSErrors raised in the body become agentbox errors naming ``spath``."""
        try:
            yield
        except OSError as exc:
            raise self._error(exc, action, spath) from None

    @contextlib.contextmanager
    def _session(self, action: str, spath: str) -> Iterator[int]:
        """Root fd (opened with the daemon's credentials) + the sandbox user's credentials."""
        try:
            rootfd = os.open(self._root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ESRCH):
                raise SandboxNotRunning(
                    f"cannot {action} {spath}: the sandbox's filesystem is gone; "
                    "is the sandbox still running?"
                ) from None
            raise SandboxError(
                f"cannot {action} {spath}: the sandbox's filesystem is not reachable "
                f"({os.strerror(exc.errno or 0)})"
            ) from None
        try:
            with self._mapped(action, spath), sandbox_credentials(self._uid, self._gid):
                yield rootfd
        finally:
            os.close(rootfd)

    # -- reading -----------------------------------------------------------------------

    def _open_regular(self, open_: Opener, spath: str, flags: int) -> int:
        fd = open_(flags | os.O_NONBLOCK | os.O_NOCTTY, 0)
        try:
            _set_regular_blocking(fd, spath)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _read_fd(self, fd: int, spath: str, offset: int, length: int | None) -> bytes:
        if length is not None and length > self._max_read:
            raise LimitExceeded(
                f"cannot read {length} bytes of {spath} at once (cap {self._max_read})",
                hint=self._read_in_parts(spath),
                path=spath,
            )
        limit = self._max_read + 1 if length is None else length
        parts: builtins.list[bytes] = []
        got = 0
        while got < limit:
            # Read to EOF rather than trusting st_size: /proc files report 0.
            chunk = os.pread(fd, min(_IO_CHUNK, limit - got), offset + got)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        if length is None and got > self._max_read:
            raise LimitExceeded(
                f"{spath} is larger than the read cap of {self._max_read} bytes",
                hint=self._read_in_parts(spath),
                path=spath,
            )
        return b"".join(parts)

    def _read_in_parts(self, spath: str) -> Hint:
        args = {"path": spath, "length": self._max_read}
        return Hint("fs_read_range", args, "{call} (then the next offset) to read it in parts")

    def read(
        self, path: str, offset: int = 0, length: int | None = None, *, guard: Guard | None = None
    ) -> bytes:
        """Bytes of a regular file from ``offset``; ``length`` None reads to the end."""
        return self.read_sized(path, offset, length, guard=guard)[0]

    def read_sized(
        self, path: str, offset: int = 0, length: int | None = None, *, guard: Guard | None = None
    ) -> tuple[bytes, int]:
        """:meth:`read` plus the file's size, from the same open (one lookup, no race)."""
        spath = self._sandbox_path(path)
        if offset < 0 or (length is not None and length < 0):
            raise InvalidRequest(f"offset and length must not be negative (reading {spath})")
        with self._session("read", spath) as rootfd, _opener(rootfd, spath, guard, "read") as op:
            fd = self._open_regular(op, spath, os.O_RDONLY)
            try:
                return self._read_fd(fd, spath, offset, length), os.fstat(fd).st_size
            finally:
                os.close(fd)

    def read_stream(self, path: str, chunk_size: int = 1 << 20) -> Iterator[bytes]:
        """Chunks of at most ``chunk_size`` bytes. Opening errors are raised here, not on
        first iteration; close the iterator (or exhaust it) to release the file."""
        spath = self._sandbox_path(path)
        if not 0 < chunk_size <= 64 * _IO_CHUNK:
            raise InvalidRequest(f"chunk_size must be between 1 byte and 64 MiB, got {chunk_size}")
        with self._session("read", spath) as rootfd, _opener(rootfd, spath, None, "read") as op:
            fd = self._open_regular(op, spath, os.O_RDONLY)
        # Wrapped in a file object so that an iterator dropped unstarted still closes (and
        # warns); the reads need no credentials, the open already checked access.
        return self._chunks(io.FileIO(fd, "rb", closefd=True), spath, chunk_size)

    def _chunks(self, f: io.FileIO, spath: str, chunk_size: int) -> Iterator[bytes]:
        with f, self._mapped("read", spath):
            while chunk := f.read(chunk_size):
                yield chunk

    # -- writing -----------------------------------------------------------------------

    def _open_for_write(self, open_: Opener, spath: str, mode: WriteMode, perms: int) -> int:
        base = os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY
        created = True
        if mode == "create":
            fd = open_(base | os.O_CREAT | os.O_EXCL, perms)
        else:
            base |= os.O_TRUNC if mode == "overwrite" else os.O_APPEND
            try:
                fd = open_(base, 0)
                created = False
            except FileNotFoundError:
                # O_EXCL tells us we created it, so perms apply to new files only.
                try:
                    fd = open_(base | os.O_CREAT | os.O_EXCL, perms)
                except FileExistsError:
                    # Appeared meanwhile, or a dangling symlink: create through it, in root.
                    fd = open_(base | os.O_CREAT, perms)
                    created = False
        try:
            _set_regular_blocking(fd, spath)
            if created:
                os.fchmod(fd, perms)  # exact, whatever the daemon's umask
        except BaseException:
            os.close(fd)
            raise
        return fd

    def download(self, request: DownloadRequest) -> int:
        """``download_tar`` with the SDK's request object (``client.interfaces.FilesAPI``)."""
        r = request
        return self.download_tar(
            r.path, r.fileobj, include_unsafe=r.include_unsafe, withheld=r.withheld
        )

    def put(self, request: WriteRequest) -> FileInfo:
        """``write`` with the SDK's request object (``client.interfaces.FilesAPI``)."""
        r = request
        return self.write(r.path, r.data, r.mode, r.perms, r.make_parents)

    def write(
        self,
        path: str,
        data: bytes | Iterable[bytes],
        mode: WriteMode = "overwrite",
        perms: int = 0o644,
        make_parents: bool = True,
        *,
        guard: Guard | None = None,
    ) -> FileInfo:
        """Write ``data`` (bytes, or an iterable of bytes chunks streamed one at a time).

        ``overwrite`` truncates, ``append`` appends, ``create`` refuses an existing file.
        ``perms`` apply to a newly created file; an existing one keeps its mode. A symlink
        at ``path`` is followed, inside the sandbox, like the shell's ``>``. Not atomic: a
        failing iterable leaves what was written so far. The iterable is consumed on this
        thread while it holds the sandbox user's file credentials: it must not open host
        files itself. With ``guard``, the path judged is where the data goes: a final
        symlink's target (except in ``create`` mode, which never writes through one).
        """
        spath = self._sandbox_path(path)
        if mode not in ("overwrite", "append", "create"):
            raise InvalidRequest(f"mode must be overwrite, append or create, got {mode!r}")
        if isinstance(perms, bool) or not isinstance(perms, int) or not 0 <= perms <= 0o777:
            raise InvalidRequest(f"perms must be permission bits 0o000-0o777, got {perms!r}")
        if isinstance(data, str):
            raise InvalidRequest(f"data for {spath} must be bytes: encode text with .encode()")
        chunks: Iterable[Any] = [data] if isinstance(data, bytes | bytearray | memoryview) else data
        with self._session("write", spath) as rootfd:
            if make_parents:
                self._make_dirs(rootfd, posixpath.dirname(spath), guard=guard)
            with _opener(rootfd, spath, guard, "write", follow=mode != "create") as op:
                fd = self._open_for_write(op, spath, mode, perms)
            try:
                for chunk in chunks:
                    if not isinstance(chunk, bytes | bytearray | memoryview):
                        raise InvalidRequest(
                            f"data for {spath} must be bytes chunks, got {type(chunk).__name__}"
                            " (the chunks before it were written)"
                        )
                    _write_all(fd, chunk)
                st = os.fstat(fd)
            finally:
                os.close(fd)
        return _file_info(spath, st)

    def edit(
        self, path: str, old: str, new: str, count: int | None = 1, *, guard: Guard | None = None
    ) -> int:
        """Replace exact text ``old`` by ``new`` in a UTF-8 file; returns replacements made.

        With ``count`` given the file must hold exactly that many occurrences, otherwise
        ``EditMismatch`` says how many were found and nothing changes. ``count=None``
        replaces all (possibly none). The file is rewritten in place, keeping its inode.
        """
        spath = self._sandbox_path(path)
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            raise InvalidRequest(f"edit of {spath} needs old (non-empty) and new as strings")
        if count is not None and (isinstance(count, bool) or count < 1):
            raise InvalidRequest(f"count must be a positive number or None, got {count!r}")
        try:
            new.encode()
        except UnicodeEncodeError:
            raise InvalidRequest("the new text is not valid Unicode") from None
        with self._session("edit", spath) as rootfd, _opener(rootfd, spath, guard, "write") as op:
            fd = self._open_regular(op, spath, os.O_RDWR)
            try:
                try:
                    text = self._read_fd(fd, spath, 0, None).decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidRequest(
                        f"{spath} is not UTF-8 text (bad byte at offset {exc.start}); edit "
                        "works on text only",
                        hint=Hint("fs_binary", {"path": spath}, "to change binary data, {call}"),
                        path=spath,
                    ) from None
                found = text.count(old)
                if count is not None and found != count:
                    what = f"expected {count} occurrence(s) of the old text in {spath} but found "
                    if found == 0:
                        raise EditMismatch(
                            f"{what}0; nothing was changed: read the file again and copy the "
                            "old text exactly, whitespace included",
                            path=spath,
                            expected=count,
                            found=found,
                        )
                    raise EditMismatch(
                        f"{what}{found}; nothing was changed: add surrounding lines to old to "
                        "make it unique",
                        hint=Hint(
                            "fs_edit_count", {"count": found}, "to replace every one, {call}"
                        ),
                        path=spath,
                        expected=count,
                        found=found,
                    )
                if found:
                    out = text.replace(old, new).encode()
                    _pwrite_all(fd, out)
                    os.ftruncate(fd, len(out))
            finally:
                os.close(fd)
        return found

    # -- directories -------------------------------------------------------------------

    def _mkdir_one(
        self,
        rootfd: int,
        dpath: str,
        exist_ok: bool,
        perms: int = 0o755,
        guard: Guard | None = None,
        access: Access = "create_dir",
    ) -> bool:
        """Create one directory; True if it was created (an existing one must be a dir)."""
        with _parent_of(rootfd, dpath, guard, access) as (pfd, name, _):
            try:
                os.mkdir(name, perms, dir_fd=pfd)
            except FileExistsError:
                if not exist_ok:
                    raise
                try:  # a symlink to a directory (in root) is fine, as for mkdir -p
                    os.close(open_in_root(rootfd, dpath, os.O_PATH | os.O_DIRECTORY))
                except (FileNotFoundError, NotADirectoryError):
                    raise FileExistsError(errno.EEXIST, "exists and is not a directory") from None
                return False
            fd = _open_child(pfd, name, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fchmod(fd, perms)  # exact, whatever the daemon's umask
            finally:
                os.close(fd)
            return True

    def _make_dirs(
        self, rootfd: int, dpath: str, perms: int = 0o755, guard: Guard | None = None
    ) -> None:
        """mkdir -p: create ``dpath`` and missing ancestors (``perms`` for ``dpath`` only)."""
        missing: builtins.list[str] = []
        cur = dpath
        while cur != "/":
            try:
                os.close(open_in_root(rootfd, cur, os.O_PATH | os.O_DIRECTORY))
                break
            except FileNotFoundError:
                missing.append(cur)
                cur = posixpath.dirname(cur)
        for d in reversed(missing):
            with self._mapped("create directory", d):
                perm = perms if d == dpath else 0o755
                self._mkdir_one(rootfd, d, exist_ok=True, perms=perm, guard=guard)

    def mkdir(
        self,
        path: str,
        parents: bool = True,
        exist_ok: bool = True,
        *,
        guard: Guard | None = None,
    ) -> FileInfo:
        """With ``guard`` the directory is judged as a write (like the lexical check of a
        directory that contains protected paths), the parents made on the way by name."""
        spath = self._sandbox_path(path)
        with self._session("create directory", spath) as rootfd:
            if spath != "/":
                if parents:
                    self._make_dirs(rootfd, posixpath.dirname(spath), guard=guard)
                self._mkdir_one(rootfd, spath, exist_ok, guard=guard, access="write")
            elif not exist_ok:
                raise FileExistsError(errno.EEXIST, "the root exists")
            return self._stat(rootfd, spath)

    def _stat(self, rootfd: int, spath: str, guard: Guard | None = None) -> FileInfo:
        if spath == "/":
            return _file_info(spath, os.fstat(rootfd))
        with _parent_of(rootfd, spath, guard, "read") as (pfd, name, _):
            return _file_info(spath, *_lstat_at(pfd, name))

    def stat(self, path: str, *, guard: Guard | None = None) -> FileInfo:
        """The entry itself: a symlink is reported as a symlink, with its target."""
        spath = self._sandbox_path(path)
        with self._session("stat", spath) as rootfd:
            return self._stat(rootfd, spath, guard)

    def exists(self, path: str) -> bool:
        """True if the entry exists (a dangling symlink counts, as for ``stat``)."""
        try:
            self.stat(path)
        except FileNotFound:
            return False
        except InvalidRequest as exc:
            if exc.details.get("errno") == "ENOTDIR":  # /file/x: x cannot exist
                return False
            raise
        return True

    def list(
        self, path: str, depth: int = 1, *, guard: Guard | None = None
    ) -> builtins.list[FileInfo]:
        """Entries below ``path`` down to ``depth`` levels, sorted by path, directories
        before their contents. Symlinks are listed, never descended into; unreadable
        subdirectories are listed but not descended into."""
        spath = self._sandbox_path(path)
        if isinstance(depth, bool) or not 1 <= depth <= MAX_LIST_DEPTH:
            raise InvalidRequest(f"depth must be between 1 and {MAX_LIST_DEPTH}, got {depth!r}")
        out: builtins.list[FileInfo] = []
        with self._directory("list", spath, guard) as fd:
            self._list_into(fd, spath, depth, out)
        return out

    @contextlib.contextmanager
    def _directory(self, what: str, spath: str, guard: Guard | None) -> Iterator[int]:
        """An fd of directory ``spath``, on the sandbox user's credentials for the block."""
        with self._session(what, spath) as rootfd, _opener(rootfd, spath, guard, "read") as op:
            fd = op(os.O_RDONLY | os.O_DIRECTORY, 0)
            try:
                yield fd
            finally:
                os.close(fd)

    def _list_into(self, dirfd: int, spath: str, depth: int, out: builtins.list[FileInfo]) -> None:
        for name in sorted(os.listdir(dirfd)):
            child = posixpath.join(spath, name)
            try:
                st, target = _lstat_at(dirfd, name)
            except FileNotFoundError:  # removed since listdir
                continue
            out.append(_file_info(child, st, target))
            if len(out) > MAX_LIST_ENTRIES:
                raise LimitExceeded(
                    f"{spath} holds more than {MAX_LIST_ENTRIES} entries at this depth; "
                    "list with a smaller depth or a deeper path",
                    path=spath,
                )
            if depth > 1 and stat.S_ISDIR(st.st_mode):
                try:
                    fd = _open_subdir(dirfd, name, child)
                except (PermissionError, FileNotFoundError, Conflict):
                    continue
                try:
                    self._list_into(fd, child, depth - 1, out)
                finally:
                    os.close(fd)

    # -- extended attributes (user.*: what E2B keeps as file metadata) ---------------------

    def xattrs(self, path: str, prefix: str) -> dict[str, bytes]:
        """The entry's own extended attributes named ``prefix`` + key, as {key: value}
        (a symlink's own, never its target's; none where the filesystem has none)."""
        spath = self._sandbox_path(path)
        with (
            self._session("read the attributes of", spath) as rootfd,
            _parent_of(rootfd, spath, None, "read") as (pfd, name, _),
        ):
            return _xattrs_at(pfd, name, prefix)

    def set_xattrs(self, path: str, prefix: str, values: dict[str, bytes]) -> None:
        """Make ``values`` the attributes named ``prefix`` + key of what ``path`` names (a
        final symlink followed inside the root, as ``write`` does): others under
        ``prefix`` are removed. Checked by the kernel as for the sandbox user."""
        spath = self._sandbox_path(path)
        with (
            self._session("set the attributes of", spath) as rootfd,
            _opener(rootfd, spath, None, "write") as op,
        ):
            fd = op(os.O_PATH, 0)
            try:
                where = f"/proc/self/fd/{fd}"  # the object opened in root, nothing else
                try:
                    present = os.listxattr(where)
                except OSError as exc:  # a filesystem without them: nothing to clear
                    if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP) or values:
                        raise
                    return
                for attr in present:
                    if attr.startswith(prefix) and attr[len(prefix) :] not in values:
                        os.removexattr(where, attr)
                for key, value in values.items():
                    os.setxattr(where, prefix + key, value)
            finally:
                os.close(fd)

    def visit_dirs(self, path: str, depth: int, visit: Callable[[str, int], bool]) -> None:
        """``visit(sandbox_path, fd)`` for directory ``path``, then for its subdirectories
        down to ``depth`` levels below it. ``path`` is resolved inside the root; below it
        each directory is opened with ``O_NOFOLLOW`` and no symlink resolution (a symlink
        is never descended into), all on the sandbox user's credentials, which ``visit``
        runs with. Each fd is closed once ``visit`` returns (nothing stays open to pin the
        sandbox's mounts); ``visit`` returns False to skip what is below that directory."""
        spath = self._sandbox_path(path)
        with self._directory("watch", spath, None) as fd:
            self._visit(fd, spath, depth, visit)

    def _visit(self, dirfd: int, spath: str, depth: int, visit: Callable[[str, int], bool]) -> None:
        if not visit(spath, dirfd) or depth < 1:
            return
        for name in sorted(os.listdir(dirfd)):
            child = posixpath.join(spath, name)
            try:
                if not stat.S_ISDIR(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode):
                    continue
                fd = _open_subdir(dirfd, name, child)
            except (PermissionError, FileNotFoundError, Conflict):  # gone or closed meanwhile
                continue
            try:
                self._visit(fd, child, depth - 1, visit)
            finally:
                os.close(fd)

    # -- moving and removing ------------------------------------------------------------

    def move(
        self, src: str, dst: str, overwrite: bool = False, *, guard: Guard | None = None
    ) -> FileInfo:
        """Rename ``src`` to exactly ``dst`` (not into it), within one filesystem.

        A symlink is moved itself. Without ``overwrite`` an existing ``dst`` is refused
        atomically (RENAME_NOREPLACE); with it, a file or empty directory is replaced.
        """
        s = self._sandbox_path(src)
        d = self._sandbox_path(dst)
        if "/" in (s, d):
            raise InvalidRequest("the sandbox root cannot be moved, nor replaced by a move")
        with (
            self._session("move", s) as rootfd,
            _parent_of(rootfd, s, guard) as (sfd, sname, _),
            self._mapped("move to", d),
            _parent_of(rootfd, d, guard) as (dfd, dname, dpath),
        ):
            try:
                _judge_new_name(rootfd, guard, sfd, sname, dpath)
                if overwrite:
                    os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                else:
                    self._rename_noreplace(sfd, sname, dfd, dname)
            except OSError as exc:
                # Most failures are about the destination; a missing source is not.
                if exc.errno == errno.ENOENT:
                    raise self._error(exc, "move", s) from None
                raise
            return self._stat(rootfd, d)

    @staticmethod
    def _rename_noreplace(sfd: int, sname: str, dfd: int, dname: str) -> None:
        try:
            syscalls.renameat2(sfd, sname, dfd, dname, syscalls.RENAME_NOREPLACE)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # The filesystem lacks RENAME_NOREPLACE (or the move itself is invalid): check,
            # then rename; the window only lets the sandbox race against itself.
            try:
                os.stat(dname, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
                return
            raise FileExistsError(errno.EEXIST, "destination exists") from None

    def remove(self, path: str, recursive: bool = False, *, guard: Guard | None = None) -> None:
        """Remove a file, symlink (itself, not its target) or directory (``recursive`` for
        a non-empty one; symlinks inside are removed, never followed)."""
        spath = self._sandbox_path(path)
        with (
            self._session("remove", spath) as rootfd,
            _parent_of(rootfd, spath, guard) as (pfd, name, _),
        ):
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(name, dir_fd=pfd)
                return
            if recursive:
                fd = _open_subdir(pfd, name, spath)
                try:
                    self._empty_dir(fd, spath, 1)
                finally:
                    os.close(fd)
            os.rmdir(name, dir_fd=pfd)

    def _empty_dir(self, dirfd: int, spath: str, depth: int) -> None:
        if depth > MAX_WALK_DEPTH:
            raise LimitExceeded(
                f"{spath} is nested deeper than {MAX_WALK_DEPTH} levels; "
                "remove it from the sandbox's shell (rm -rf)",
                path=spath,
            )
        for name in os.listdir(dirfd):
            child = posixpath.join(spath, name)
            with self._mapped("remove", child):
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    fd = _open_subdir(dirfd, name, child)
                    try:
                        self._empty_dir(fd, child, depth + 1)
                    finally:
                        os.close(fd)
                    os.rmdir(name, dir_fd=dirfd)
                else:
                    os.unlink(name, dir_fd=dirfd)

    # -- tar ---------------------------------------------------------------------------

    def upload_tar(self, dest_dir: str, fileobj: IO[bytes], *, guard: Guard | None = None) -> int:
        """Extract a tar stream (plain, gz, bz2 or xz) into ``dest_dir``, created if missing.

        Entries are written one by one through the same in-root resolution, as the sandbox
        user: files (setuid/setgid/sticky bits stripped), directories, symlinks (any target:
        they are resolved inside the sandbox when used) and hard links to entries inside the
        sandbox. Absolute names, ``..``, devices and fifos are refused; entries before a
        refused one stay written. Returns the number of entries written.

        With ``guard`` every entry is judged at its canonical path (through symlinks that
        earlier entries made), a symlink also at where its target resolves now, and a hard
        link at its source: a link may not be made to point at a guarded path.
        """
        dest = self._sandbox_path(dest_dir)
        written = 0
        # Opened before switching credentials: compression modules may be imported here.
        tar = archive.open_reader(fileobj)
        with tar, self._session("extract into", dest) as rootfd:
            self._make_dirs(rootfd, dest, guard=guard)
            try:
                for member in tar:
                    entry = archive.checked(member, archive.UPLOAD)
                    if not entry.parts:  # "./": the destination itself
                        continue
                    target = posixpath.join(dest, *entry.parts)
                    with self._mapped("extract", target):
                        self._extract(rootfd, tar, member, dest, target, guard, entry.link)
                    written += 1
            except (tarfile.TarError, EOFError) as exc:
                raise InvalidRequest(
                    f"the upload is not a valid tar stream or is truncated ({exc}); "
                    f"{written} entries were written to {dest} before the error",
                    path=dest,
                ) from None
        return written

    def _extract(
        self,
        rootfd: int,
        tar: tarfile.TarFile,
        member: tarfile.TarInfo,
        dest: str,
        target: str,
        guard: Guard | None,
        link: tuple[str, ...] | None,
    ) -> None:
        mode = archive.member_mode(member)
        if member.isdir():
            self._make_dirs(rootfd, target, perms=mode, guard=guard)
            return
        self._make_dirs(rootfd, posixpath.dirname(target), guard=guard)
        if member.issym():
            with _parent_of(rootfd, target, guard) as (pfd, name, path):
                if guard is not None:
                    guard(_link_target(rootfd, path, member.linkname), "symlink_to")
                _unlink_if_not_dir(pfd, name)
                os.symlink(member.linkname, name, dir_fd=pfd)
        elif link is not None:
            source = posixpath.join(dest, *link)
            if source == target:
                return  # a link to itself: already there
            # The source's directory is resolved inside the root and its final name is not
            # followed, so the link can only ever point at an inode inside the sandbox.
            with contextlib.ExitStack() as stack:
                dfd, dname, path = stack.enter_context(_parent_of(rootfd, target, guard))
                source_entry = _parent_of(rootfd, source, guard, "hardlink_to")
                sfd, sname, _ = stack.enter_context(source_entry)
                _judge_new_name(rootfd, guard, sfd, sname, path)
                _unlink_if_not_dir(dfd, dname)
                os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
        else:
            src = tar.extractfile(member)
            assert src is not None  # regular files always have data
            with _parent_of(rootfd, target, guard) as (pfd, name, _):
                _unlink_if_not_dir(pfd, name)  # replace, never write through a symlink
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
                fd = _open_child(pfd, name, flags, 0o600)
                try:
                    while chunk := src.read(_IO_CHUNK):
                        _write_all(fd, chunk)
                    os.fchmod(fd, mode)
                    with contextlib.suppress(OverflowError, ValueError):
                        os.utime(fd, (member.mtime, member.mtime))
                finally:
                    os.close(fd)

    def download_tar(
        self,
        path: str,
        fileobj: IO[bytes],
        *,
        guard: Guard | None = None,
        **options: Unpack[ExportOptions],
    ) -> int:
        """Stream a tar of ``path`` (a file, symlink or directory tree) to ``fileobj``.

        Entries are named from the basename of ``path`` (``/workspace/proj`` gives
        ``proj/...``), like ``tar -C /workspace -c proj``, so ``upload_tar(dir, ...)``
        recreates ``dir/proj``. Symlinks are stored as symlinks, never followed; fifos,
        sockets and devices are skipped. Returns the number of entries.

        Safe export: entries the host would run or trust (git hooks and any git config
        that is not allowlisted, editor/agent/tool settings, shell rc files, setuid bits,
        symlinks that may leave the tree: see ``export_safety``) are left out unless
        ``include_unsafe``; each one is appended to ``withheld`` as (path in the tar,
        reason). ``guard`` judges ``path`` itself (with its directory's symlinks resolved);
        the walk below follows none.
        """
        spath = self._sandbox_path(path)
        withheld = options.get("withheld")
        export = _ExportGuard(
            not options.get("include_unsafe", False), withheld if withheld is not None else []
        )
        tar = tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT)  # noqa: SIM115
        with tar, self._session("archive", spath) as rootfd:
            if spath == "/":
                fd = open_in_root(rootfd, "/", os.O_RDONLY | os.O_DIRECTORY)
                try:
                    return self._add_dir(tar, fd, ".", spath, 1, export)
                finally:
                    os.close(fd)
            in_git_dir = export.active and _parent_is_git_dir(rootfd, spath)
            with _parent_of(rootfd, spath, guard, "read") as (pfd, name, _):
                return self._add_entry(tar, pfd, name, name, spath, 1, export, in_git_dir)

    def _add_entry(
        self,
        tar: tarfile.TarFile,
        dirfd: int,
        name: str,
        arcname: str,
        spath: str,
        depth: int,
        guard: _ExportGuard,
        in_git_dir: bool,
    ) -> int:
        with self._mapped("archive", spath):
            try:
                st, target = _lstat_at(dirfd, name)
            except FileNotFoundError:
                if depth == 1:
                    raise
                return 0  # removed while we walked
            if guard.withholds(arcname, st.st_mode, target, in_git_dir):
                return 0
            if stat.S_ISLNK(st.st_mode):
                tar.addfile(archive.symlink_entry(arcname, st, target or ""))
                return 1
            if stat.S_ISREG(st.st_mode):
                fd = _open_child(dirfd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
                try:
                    st = os.fstat(fd)  # the object we actually read
                    if not stat.S_ISREG(st.st_mode):
                        return 0
                    if guard.active and export_safety.vets_content(arcname, in_git_dir):
                        # The bytes judged are the bytes sent: the agent may rewrite the
                        # file between a check and a second read.
                        content = _read_upto(fd, export_safety.MAX_VETTED + 1)
                        if guard.withholds_content(arcname, content):
                            return 0
                        info = archive.regular_entry(arcname, st)
                        info.size = len(content)
                        tar.addfile(info, io.BytesIO(content))
                        return 1
                    tar.addfile(archive.regular_entry(arcname, st), _SizedReader(fd, st.st_size))
                finally:
                    os.close(fd)
                return 1
            if stat.S_ISDIR(st.st_mode):
                fd = _open_subdir(dirfd, name, spath)
                try:
                    return self._add_dir(tar, fd, arcname, spath, depth, guard)
                finally:
                    os.close(fd)
            return 0

    def _add_dir(
        self,
        tar: tarfile.TarFile,
        fd: int,
        arcname: str,
        spath: str,
        depth: int,
        guard: _ExportGuard,
    ) -> int:
        if depth > MAX_WALK_DEPTH:
            raise LimitExceeded(
                f"{spath} is nested deeper than {MAX_WALK_DEPTH} levels; archive a deeper "
                "directory, or use tar in the sandbox's shell",
                path=spath,
            )
        tar.addfile(archive.dir_entry(arcname, os.fstat(fd)))
        count = 1
        # Judged on this one listing: only names in it are sent, so the host sees no
        # git-directory sign this did not.
        children = sorted(os.listdir(fd))
        in_git_dir = guard.active and export_safety.is_git_dir(
            posixpath.basename(arcname), children
        )
        for child in children:
            count += self._add_entry(
                tar, fd, child, f"{arcname}/{child}", posixpath.join(spath, child), depth + 1,
                guard, in_git_dir,
            )  # fmt: skip
        return count


@dataclasses.dataclass
class _ExportGuard:
    """Safe export for one download: what to leave out, and the report of what was."""

    active: bool
    withheld: builtins.list[tuple[str, str]]

    def withholds(self, arcname: str, mode: int, target: str | None, in_git_dir: bool) -> bool:
        reason = (
            export_safety.withhold_reason(arcname, mode, target, in_git_dir)
            if self.active
            else None
        )
        if reason is not None:
            self.withheld.append((arcname, reason))
        return reason is not None

    def withholds_content(self, arcname: str, content: bytes) -> bool:
        reason = export_safety.content_reason(arcname, content)
        if reason is not None:
            self.withheld.append((arcname, reason))
        return reason is not None


def _pwrite_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], done)
