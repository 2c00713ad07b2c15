"""Where sandbox disk images live: a filesystem that can clone a file in O(1).

A fork (and a create from the formatted-image cache) copies a whole disk image. On a
filesystem with reflinks (XFS, btrfs) ``ioctl(FICLONE)`` shares the extents instead of
copying bytes: the cost does not grow with the data. The host's own filesystem here is
ext4 (no reflinks), so when ``$AGENTBOX_HOME/disks`` cannot clone, it becomes the mount
of a sparse XFS image (``lib/disk-pool.img``, created on first use, ``reflink=1``): a few
tens of MB on the host until sandboxes write. The mount outlives processes (like the
sandboxes on it) and is set up again after a reboot; ``release`` takes it down when a
home is thrown away.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from agentbox.errors import HostUnsupported, SandboxError
from agentbox.fsutil import is_mountpoint, locked
from agentbox.isolation import disk

FIFREEZE = 0xC0045877
FITHAW = 0xC0045878
POOL_BYTES = 1 << 40  # virtual; sparse, so only what sandboxes write takes host space
_MKFS = ["mkfs.xfs", "-q", "-f", "-m", "reflink=1", "-l", "size=64m"]


def pool_dir(home: Path) -> Path:
    return home / "disks"


def ensure(home: Path) -> Path:
    """The home's disk directory, able to clone (mounting the XFS pool if need be)."""
    directory = pool_dir(home)
    directory.mkdir(mode=0o711, exist_ok=True)
    if is_mountpoint(directory) or can_clone(directory):
        return directory
    with locked(home / "lib" / "disk-pool.lock"):
        if is_mountpoint(directory):
            return directory
        image = home / "lib" / "disk-pool.img"
        if not image.exists():
            _format(image)
        try:
            disk.mount_disk(image, directory, fstype="xfs")
        except SandboxError as e:
            raise HostUnsupported(
                f"cannot mount the disk pool {image} (XFS): {e}; sandboxes need a kernel "
                "with XFS (agentbox doctor)"
            ) from e
        directory.chmod(0o711)
    return directory


def release(home: Path) -> None:
    """Unmount the home's pool (its loop device goes with it). For throwing a home away:
    sandboxes still on it lose their disks."""
    directory = pool_dir(home)
    if is_mountpoint(directory):
        disk.unmount(directory)


def can_clone(directory: Path) -> bool:
    """Whether files in ``directory`` can be reflinked (tried on two scratch files)."""
    source, target = directory / ".clone-probe-a", directory / ".clone-probe-b"
    try:
        source.write_bytes(b"x")
        disk.clone_file(source, target)
        return True
    except OSError:
        return False
    finally:
        source.unlink(missing_ok=True)
        target.unlink(missing_ok=True)


@contextlib.contextmanager
def frozen(mountpoint: Path) -> Iterator[None]:
    """The filesystem at ``mountpoint`` flushed and with writers blocked (FIFREEZE) for
    the block: a consistent image to clone. Always thawed afterwards."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.ioctl(fd, FIFREEZE, 0)
        except OSError as e:
            if e.errno != errno.EBUSY:  # EBUSY: frozen already (another fork)
                raise SandboxError(f"could not freeze {mountpoint} for a copy: {e}") from e
            yield
            return
        try:
            yield
        finally:
            fcntl.ioctl(fd, FITHAW, 0)
    finally:
        os.close(fd)


def _format(image: Path) -> None:
    image.parent.mkdir(parents=True, exist_ok=True)
    staging = image.with_name(f".{image.name}.{os.getpid()}")
    with staging.open("wb") as f:
        f.truncate(POOL_BYTES)
    try:
        result = subprocess.run([*_MKFS, str(staging)], capture_output=True, text=True)
    except FileNotFoundError:
        staging.unlink(missing_ok=True)
        raise HostUnsupported(
            "mkfs.xfs is not installed; the sandbox disk pool needs it: apt-get install -y xfsprogs"
        ) from None
    if result.returncode != 0:
        staging.unlink(missing_ok=True)
        raise SandboxError(f"could not format the disk pool: {result.stderr.strip()}")
    staging.replace(image)
