"""Thin ctypes wrappers for the Linux syscalls Python 3.11 does not expose.

Each raises ``OSError`` with errno on failure, like the functions in ``os``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import struct
from collections.abc import Sequence


def _load_libc() -> ctypes.CDLL:
    # glibc's soname first: find_library runs `ldconfig -p` in a subprocess, milliseconds
    # of every process's first sandbox operation.
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        from ctypes.util import find_library

        return ctypes.CDLL(find_library("c"), use_errno=True)


_libc = _load_libc()

_SYS_OPENAT2 = 437  # x86_64 and aarch64 share this number

RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MNT_DETACH = 0x2


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2): open ``path`` relative to ``dirfd`` under ``resolve`` restrictions."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0, resolve)
    fd = _libc.syscall(
        _SYS_OPENAT2,
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    return _check(fd, f"openat2 {path!r}")


PROC_SUPER_MAGIC = 0x9FA0


def fstatfs_type(fd: int) -> int:
    """fstatfs(2)'s ``f_type`` (which filesystem ``fd`` is on); works on O_PATH fds."""
    buf = ctypes.create_string_buffer(256)  # struct statfs: 120 bytes on 64-bit Linux
    _check(_libc.fstatfs(ctypes.c_int(fd), buf), "fstatfs")
    return int(struct.unpack_from("=q", buf)[0])


def mount(source: str, target: str, fstype: str, flags: int = 0, data: str = "") -> None:
    _check(
        _libc.mount(
            os.fsencode(source),
            os.fsencode(target),
            os.fsencode(fstype),
            ctypes.c_ulong(flags),
            os.fsencode(data) if data else None,
        ),
        f"mount {fstype} on {target}",
    )


FALLOC_FL_KEEP_SIZE = 0x01


def reserve_blocks(fd: int, length: int) -> None:
    """Allocate ``length`` bytes of blocks to ``fd``'s file without changing its size
    (``fallocate`` with KEEP_SIZE): a later write there needs no free block."""
    _check(
        _libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(0), ctypes.c_long(length)),
        "fallocate",
    )


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(os.fsencode(target), ctypes.c_int(flags)), f"umount {target}")


def syncfs(fd: int) -> None:
    """Write out the filesystem ``fd`` is on (its data reaches the device, and through a
    loop device the image file)."""
    _check(_libc.syncfs(ctypes.c_int(fd)), "syncfs")


def setfsuid(uid: int) -> int:
    """Set this *thread's* filesystem uid; returns the previous one.

    Changing it from 0 to non-zero drops the thread's filesystem capabilities
    (CAP_DAC_OVERRIDE, CAP_FOWNER, ...), so file access is checked like the sandbox user's.
    """
    return int(_libc.setfsuid(ctypes.c_uint(uid)))


def setfsgid(gid: int) -> int:
    return int(_libc.setfsgid(ctypes.c_uint(gid)))


# Project quotas (ext4/xfs), through the generic quotactl(2) interface.
_Q_SETQUOTA = 0x800008
_PRJQUOTA = 2
_QIF_BLIMITS = 1
_QIF_ILIMITS = 4


def _qcmd(cmd: int, qtype: int) -> int:
    return (cmd << 8) | (qtype & 0xFF)


class _DqBlk(ctypes.Structure):
    _fields_ = [
        ("bhardlimit", ctypes.c_uint64),
        ("bsoftlimit", ctypes.c_uint64),
        ("curspace", ctypes.c_uint64),
        ("ihardlimit", ctypes.c_uint64),
        ("isoftlimit", ctypes.c_uint64),
        ("curinodes", ctypes.c_uint64),
        ("btime", ctypes.c_uint64),
        ("itime", ctypes.c_uint64),
        ("valid", ctypes.c_uint32),
    ]


def set_project_quota(device: str, project_id: int, max_bytes: int, max_inodes: int = 0) -> None:
    """Limit project ``project_id`` on the filesystem of ``device`` (0 removes a limit)."""
    blocks = (max_bytes + 1023) // 1024  # quota blocks are 1 KiB
    dq = _DqBlk(blocks, blocks, 0, max_inodes, max_inodes, 0, 0, 0, _QIF_BLIMITS | _QIF_ILIMITS)
    _check(
        _libc.quotactl(
            ctypes.c_int(_qcmd(_Q_SETQUOTA, _PRJQUOTA)),
            os.fsencode(device),
            ctypes.c_int(project_id),
            ctypes.byref(dq),
        ),
        f"quotactl project {project_id}",
    )


# struct fsxattr { __u32 xflags, extsize, nextents, projid, cowextsize; __u8 pad[8]; }
_FSXATTR = struct.Struct("=IIIII8s")
_FS_IOC_FSGETXATTR = 0x801C581F
_FS_IOC_FSSETXATTR = 0x401C5820
FS_XFLAG_PROJINHERIT = 0x00000200


def set_project_id(fd: int, project_id: int) -> None:
    """Put the directory ``fd`` in project ``project_id``; new entries inherit it."""
    buf = bytearray(_FSXATTR.size)
    fcntl.ioctl(fd, _FS_IOC_FSGETXATTR, buf)
    xflags, extsize, nextents, _, cow, pad = _FSXATTR.unpack(buf)
    fcntl.ioctl(
        fd,
        _FS_IOC_FSSETXATTR,
        _FSXATTR.pack(xflags | FS_XFLAG_PROJINHERIT, extsize, nextents, project_id, cow, pad),
    )


# renameat2(2) flags.
RENAME_NOREPLACE = 1 << 0
RENAME_EXCHANGE = 1 << 1


def renameat2(olddirfd: int, oldpath: str, newdirfd: int, newpath: str, flags: int = 0) -> None:
    """renameat2(2): ``RENAME_NOREPLACE`` makes "move unless the target exists" atomic."""
    _check(
        _libc.renameat2(
            ctypes.c_int(olddirfd),
            os.fsencode(oldpath),
            ctypes.c_int(newdirfd),
            os.fsencode(newpath),
            ctypes.c_uint(flags),
        ),
        f"renameat2 {oldpath!r} -> {newpath!r}",
    )


# The raw syscall, because glibc's setgroups() broadcasts the change to every thread.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(os.uname().machine)


def thread_setgroups(groups: Sequence[int]) -> None:
    """setgroups(2) for the calling thread only (the kernel keeps credentials per thread)."""
    if _SYS_SETGROUPS is None:
        raise OSError(errno.ENOSYS, f"setgroups syscall number unknown on {os.uname().machine}")
    arr = (ctypes.c_uint * len(groups))(*groups)
    _check(_libc.syscall(_SYS_SETGROUPS, ctypes.c_size_t(len(groups)), arr), "setgroups")


# Raw too: glibc's setresuid/setresgid also broadcast to every thread.
_SYS_SETRESUID = {"x86_64": 117, "aarch64": 147}.get(os.uname().machine)
_SYS_SETRESGID = {"x86_64": 119, "aarch64": 149}.get(os.uname().machine)
_UNCHANGED = ctypes.c_uint(0xFFFFFFFF)


def thread_set_effective_ids(uid: int, gid: int) -> None:
    """Set the calling thread's effective gid then uid (real and saved ids unchanged).

    Permission checks that look at the effective uid rather than the fsuid (procfs
    sysctls, for one) then see the sandbox user. Going back to 0 is allowed because the
    real and saved uids stay 0; leaving 0 clears the thread's effective capabilities.
    """
    if _SYS_SETRESUID is None or _SYS_SETRESGID is None:
        raise OSError(errno.ENOSYS, f"setresuid syscall number unknown on {os.uname().machine}")
    _check(_libc.syscall(_SYS_SETRESGID, _UNCHANGED, ctypes.c_uint(gid), _UNCHANGED), "setresgid")
    _check(_libc.syscall(_SYS_SETRESUID, _UNCHANGED, ctypes.c_uint(uid), _UNCHANGED), "setresuid")


def thread_restore_effective_ids(uid: int, gid: int) -> None:
    """Undo ``thread_set_effective_ids``: uid first (it brings back CAP_SETGID), then gid."""
    assert _SYS_SETRESUID is not None and _SYS_SETRESGID is not None
    _check(_libc.syscall(_SYS_SETRESUID, _UNCHANGED, ctypes.c_uint(uid), _UNCHANGED), "setresuid")
    _check(_libc.syscall(_SYS_SETRESGID, _UNCHANGED, ctypes.c_uint(gid), _UNCHANGED), "setresgid")


CAP_SETGID = 6
CAP_SETUID = 7
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def thread_capabilities() -> tuple[int, int, int]:
    """(effective, permitted, inheritable) capability masks of the calling thread."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data), "capget")
    return (
        data[0].effective | data[1].effective << 32,
        data[0].permitted | data[1].permitted << 32,
        data[0].inheritable | data[1].inheritable << 32,
    )


def set_thread_capabilities(effective: int, permitted: int, inheritable: int) -> None:
    """capset(2) on the calling thread only (pid 0); a thread may always lower its sets."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    low, high = 0xFFFFFFFF, 32
    data = (_CapData * 2)(
        _CapData(effective & low, permitted & low, inheritable & low),
        _CapData(effective >> high, permitted >> high, inheritable >> high),
    )
    _check(_libc.capset(ctypes.byref(header), data), "capset")


CLONE_NEWNET = 0x40000000


def setns(fd: int, nstype: int) -> None:
    """setns(2) for the calling thread (Python 3.11 has no os.setns)."""
    _check(_libc.setns(fd, nstype), "setns")


# inotify(7): the event bits agentbox watches for, and the flags of the instance.
IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
INOTIFY_EVENT = struct.Struct("=iIII")  # wd, mask, cookie, len; then len bytes of name


def inotify_init1(flags: int) -> int:
    return _check(_libc.inotify_init1(ctypes.c_int(flags)), "inotify_init1")


def inotify_add_watch(fd: int, path: str, mask: int) -> int:
    """Watch what ``path`` names (symlinks followed: pass ``/proc/self/fd/N`` of a directory
    opened safely to watch exactly that directory)."""
    wd = _libc.inotify_add_watch(
        ctypes.c_int(fd), ctypes.c_char_p(os.fsencode(path)), ctypes.c_uint32(mask)
    )
    return _check(wd, "inotify_add_watch")


def inotify_rm_watch(fd: int, wd: int) -> None:
    _check(_libc.inotify_rm_watch(ctypes.c_int(fd), ctypes.c_int(wd)), "inotify_rm_watch")
