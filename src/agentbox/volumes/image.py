"""One volume on the host: a sparse ext4 image (its size is its quota: a write past it
fails with ENOSPC in the sandbox, and the host never holds more than that for it),
mounted nosuid,nodev at ``mnt/NAME``; sandboxes get its ``data/`` directory.

Everything here that touches the tree a sandbox wrote goes by descriptor, one component
at a time, never following a symlink (``O_NOFOLLOW``), as the file API's in-root
resolution does: a link planted in a volume points nowhere on the host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import subprocess
from pathlib import Path

from agentbox.errors import HostUnsupported, InvalidRequest, SandboxError
from agentbox.fsutil import is_mountpoint
from agentbox.isolation import disk

DATA = "data"  # what sandboxes see; the filesystem's root keeps lost+found to itself
# A journal (unlike a sandbox disk's): a volume outlives sandboxes and host crashes.
MKFS = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^resize_inode",
        "-E", "lazy_itable_init=1,nodiscard,root_owner=0:0"]  # fmt: skip
_DIR = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def format_image(image: Path, size: int) -> None:
    """A new sparse image of ``size`` bytes at ``image`` (which must not exist)."""
    image.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    try:
        result = subprocess.run([*MKFS, str(image)], capture_output=True, text=True)
    except FileNotFoundError:
        image.unlink(missing_ok=True)
        raise HostUnsupported("mkfs.ext4 is missing: apt-get install -y e2fsprogs") from None
    if result.returncode != 0:
        image.unlink(missing_ok=True)
        raise SandboxError(f"could not format the volume image: {result.stderr.strip()}")


def ensure_mounted(image: Path, mountpoint: Path) -> Path:
    """The volume mounted at ``mountpoint`` (nosuid,nodev; a no-op when it is), with its
    ``data/`` directory; returns that directory."""
    if not is_mountpoint(mountpoint):
        if not image.exists():
            raise SandboxError(f"the volume image {image} is missing; remove the volume")
        mountpoint.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
        disk.mount_disk(image, mountpoint)
    mountpoint.chmod(0o711)  # sandbox uids traverse to data/, never list the root
    data = mountpoint / DATA
    with contextlib.suppress(FileExistsError):
        data.mkdir(mode=0o755)
    if data.is_symlink() or not data.is_dir():  # the root is ours; this cannot happen
        raise SandboxError(f"{data} is not a directory")
    return data


def unmount(mountpoint: Path) -> None:
    disk.unmount(mountpoint)
    with contextlib.suppress(OSError):
        mountpoint.rmdir()


def usage(mountpoint: Path) -> dict[str, int]:
    """Bytes used and free on the mounted volume (the filesystem's own count)."""
    st = os.statvfs(mountpoint)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    return {"used_bytes": total - st.f_bfree * st.f_frsize, "free_bytes": free}


def hand_over(data: Path, uid: int, gid: int, writable: bool) -> None:
    """Make the tree under ``data`` usable by the sandbox ``uid``: with ``writable``,
    owned by it (the previous writer was another uid); else readable by every uid. Set-id
    bits are cleared either way. Called while no sandbox writes to it (a rw mount is
    exclusive), and it never follows a symlink."""
    fd = os.open(data, os.O_RDONLY | _DIR)
    try:
        _fix(fd, None, uid, gid, writable)
        _walk(fd, uid, gid, writable, depth=0)
    finally:
        os.close(fd)


def _fix(dirfd: int, name: str | None, uid: int, gid: int, writable: bool) -> None:
    """Owner and mode of one entry (``name`` in ``dirfd``, or ``dirfd`` itself)."""
    st = os.fstat(dirfd) if name is None else os.stat(name, dir_fd=dirfd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        if writable:
            os.chown(name or ".", uid, gid, dir_fd=dirfd, follow_symlinks=False)
        return
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return  # fifos, sockets: left as they are (device nodes cannot be made here)
    if name is None:
        fd = os.dup(dirfd)
    else:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dirfd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOENT):
                return
            raise
    try:
        if writable:
            os.fchown(fd, uid, gid)  # also clears set-id bits of a regular file
        mode = stat.S_IMODE(os.fstat(fd).st_mode) & ~0o6000
        if not writable:
            mode |= 0o005 if stat.S_ISDIR(st.st_mode) else 0o004
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _walk(dirfd: int, uid: int, gid: int, writable: bool, depth: int) -> None:
    if depth > 256:
        raise InvalidRequest("the volume's tree is deeper than 256 directories")
    with os.scandir(dirfd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        _fix(dirfd, name, uid, gid, writable)
        if is_dir:
            try:
                child = os.open(name, os.O_RDONLY | _DIR, dir_fd=dirfd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                    continue
                raise
            try:
                _walk(child, uid, gid, writable, depth + 1)
            finally:
                os.close(child)


def make_mountpoint(root: Path, path: str, uid: int, gid: int) -> None:
    """The directory ``path`` inside the sandbox root ``root`` (its overlay), made one
    component at a time below the root, new ones owned by the sandbox. A component that
    is a symlink or not a directory is refused: bubblewrap would follow it when it binds
    the volume there."""
    fd = os.open(root, os.O_PATH | _DIR)
    try:
        for name in path.strip("/").split("/"):
            try:
                next_fd = os.open(name, os.O_PATH | _DIR, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(name, 0o755, dir_fd=fd)
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
                next_fd = os.open(name, os.O_PATH | _DIR, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise InvalidRequest(
                        f"cannot mount a volume at {path}: {name} in it is a symlink or "
                        "not a directory in the sandbox; choose another path",
                        field="volumes",
                        value=path,
                    ) from None
                raise
            os.close(fd)
            fd = next_fd
    finally:
        os.close(fd)
