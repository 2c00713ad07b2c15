"""Finishing a built or imported tree (:mod:`.debian`, :mod:`.oci`): the ``user`` account
(uid/gid 1000), ``/workspace``, an empty ``/etc/resolv.conf``, then hardening: device nodes
dropped, setuid/setgid bits and file capabilities removed, every entry owned by root:root
and writable by no group or other (why: :mod:`agentbox.runtime.templates.store`). Every
path is resolved inside the tree (``_Tree``), so a symlink the image planted cannot point
a write at the host."""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from collections.abc import Callable
from pathlib import Path

from agentbox.digest import token_hex
from agentbox.storage.inroot import InRoot

Progress = Callable[[str], None]
USER_UID = 1000
USER_NAME = "user"
_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


class _Unsafe(Exception):
    """An entry that would leave the tree or cannot be placed; it is skipped."""


class _Tree(InRoot):
    """A directory tree whose paths resolve as if it were ``/`` (:mod:`agentbox.storage.inroot`).

    A symlink ``etc -> /host/etc`` planted in the tree then means ``<tree>/host/etc``, and
    ``..`` stops at the tree's root: nothing can be reached outside it.
    """

    def open_dir(self, rel: str, *, create: bool) -> int | None:
        """An fd for directory ``rel``; missing ones are made (0755) when ``create``.

        Returns None when it is missing and not created; raises _Unsafe when it cannot be
        a directory (a file, a dangling symlink, a loop).
        """
        try:
            return self._resolve(rel)
        except FileNotFoundError:
            if not create:
                return None
        # Walk down from the root, resolving each prefix afresh (so symlinks stay in the
        # tree) and making what is missing inside the directory resolved just before.
        parent = os.dup(self.fd)
        try:
            parts = rel.split("/")
            for i, part in enumerate(parts, 1):
                try:
                    fd = self._resolve("/".join(parts[:i]))
                except FileNotFoundError:
                    try:
                        os.mkdir(part, 0o755, dir_fd=parent)
                        fd = os.open(part, _DIR_NOFOLLOW, dir_fd=parent)
                    except OSError as exc:  # EEXIST: a dangling symlink sits there
                        raise _Unsafe from exc
                os.close(parent)
                parent = fd
        except BaseException:
            os.close(parent)
            raise
        return parent

    def _resolve(self, rel: str) -> int:
        try:
            return self.open(rel, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise
        except OSError as exc:  # ENOTDIR, ELOOP, EXDEV: not a usable directory
            raise _Unsafe from exc

    def write(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """Replace ``rel`` with a root-owned file: write a temp file, rename over the name."""
        parent_rel, base = posixpath.split(rel)
        parent = self.open_dir(parent_rel, create=True)
        assert parent is not None
        tmp = f".agentbox-{token_hex(6)}"
        try:
            st = os.stat(base, dir_fd=parent, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                import shutil  # here: shutil (bz2, lzma) is no create's, command's or kill's

                shutil.rmtree(base, dir_fd=parent)
        except FileNotFoundError:
            pass
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, 0o600, dir_fd=parent)
            with open(fd, "wb") as f:
                f.write(data)
                if os.geteuid() == 0:
                    os.fchown(fd, 0, 0)
                os.fchmod(fd, mode)
            os.rename(tmp, base, src_dir_fd=parent, dst_dir_fd=parent)  # replaces, never follows
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)
            os.close(parent)

    def ensure_dir(self, rel: str, mode: int) -> None:
        fd = self.open_dir(rel, create=True)
        assert fd is not None
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)


def _finish_rootfs(rootfs: Path, say: Progress) -> int:
    """Add what every template needs, harden it; returns its size in bytes."""
    with _Tree(rootfs) as tree:
        _ensure_user(tree)
        tree.ensure_dir(f"home/{USER_NAME}", 0o755)
        tree.ensure_dir("workspace", 0o755)
        tree.write("etc/resolv.conf", b"")  # mmdebstrap copies the host's; never ship that
        tree.write("etc/hostname", b"agentbox\n")  # likewise
        if tree.read("etc/hosts") is None:
            tree.write("etc/hosts", _HOSTS.encode())
    return _harden(rootfs, say)


def _ensure_user(tree: _Tree) -> None:
    """``user`` with uid/gid 1000 and home /home/user, in passwd, group and shadow."""
    shell = "/bin/bash" if tree.is_file("bin/bash") else "/bin/sh"
    # A scratch image may have no passwd at all: root comes first then.
    starts = {"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n", "etc/group": "root:x:0:\n"}
    entries = {
        "etc/passwd": f"{USER_NAME}:x:{USER_UID}:{USER_UID}::/home/{USER_NAME}:{shell}",
        "etc/group": f"{USER_NAME}:x:{USER_UID}:",
        "etc/shadow": f"{USER_NAME}:!:19000:0:99999:7:::",  # no password: locked
        "etc/gshadow": f"{USER_NAME}:!::",
    }
    for rel, entry in entries.items():
        old = tree.read(rel)
        if old is None and rel not in starts:
            continue  # images without shadow files (busybox) manage fine without them
        text = old.decode(errors="replace") if old is not None else starts[rel]
        lines = text.splitlines()
        if entry in lines:
            continue
        kept = [line for line in lines if not line.startswith(f"{USER_NAME}:")]
        new = "\n".join([*kept, entry]) + "\n"
        tree.write(rel, new.encode(), 0o640 if "shadow" in rel else 0o644)


def _harden(rootfs: Path, say: Progress) -> int:
    """Root owns everything, only root writes, no devices/setuid/setgid/capabilities.

    Returns the apparent size of the regular files (hard links counted once).
    """
    as_root = os.geteuid() == 0
    size = dropped = stripped = 0
    seen_inodes: set[tuple[int, int]] = set()
    for dirpath, dirnames, filenames, dirfd in os.fwalk(rootfs, follow_symlinks=False):
        for name in dirnames + filenames:
            st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
            kind = stat.S_IFMT(st.st_mode)
            if kind in (stat.S_IFCHR, stat.S_IFBLK):
                os.unlink(name, dir_fd=dirfd)
                dropped += 1
                continue
            if as_root and (st.st_uid, st.st_gid) != (0, 0):
                os.chown(name, 0, 0, dir_fd=dirfd, follow_symlinks=False)
            if kind == stat.S_IFLNK:
                continue
            mode = stat.S_IMODE(st.st_mode)
            new = mode & ~(stat.S_IWGRP | stat.S_IWOTH)
            if kind == stat.S_IFREG:
                new &= ~(stat.S_ISUID | stat.S_ISGID)
                stripped += bool(mode & (stat.S_ISUID | stat.S_ISGID))
                if (st.st_dev, st.st_ino) not in seen_inodes:
                    seen_inodes.add((st.st_dev, st.st_ino))
                    size += st.st_size
                with contextlib.suppress(OSError):  # ENODATA: the usual case
                    # xattr calls take no dir_fd; the staging tree is private to us
                    os.removexattr(
                        f"{dirpath}/{name}", "security.capability", follow_symlinks=False
                    )
            # Always: chown above may have cleared setuid bits behind our back.
            # Not a symlink (checked above) and nothing else writes this private tree.
            os.chmod(name, new, dir_fd=dirfd)
    if dropped or stripped:
        say(f"hardened: dropped {dropped} device nodes, cleared setuid/setgid on {stripped} files")
    return size
