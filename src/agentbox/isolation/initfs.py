"""The sandbox init's binary on a small tmpfs per home (``$AGENTBOX_HOME/initfs``), from
where it is bound read-only into every sandbox as ``/.agentbox/init`` (and, beside it, the
locale archive of sandboxes on the host's /usr: ``isolation.locales``).

A bind mount shows, in the sandbox's ``/proc/self/mountinfo``, the source file's path
inside its filesystem: bound from the host's filesystem that path names the home; from
this tmpfs it is only the file's name. One copy in memory serves every sandbox (a copy on
each sandbox's own disk cost ~3 ms of reads at every launch and a page cache per
sandbox). Mounted on first use and again after a reboot; ``release`` takes it down when a
home is thrown away.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from agentbox.errors import SandboxError
from agentbox.fsutil import is_mountpoint, locked
from agentbox.isolation import disk, syscalls

SIZE_BYTES = 16 << 20  # a few versions of a <1 MB binary


def initfs_dir(home: Path) -> Path:
    return home / "initfs"


def ensure(home: Path, binary: Path) -> Path:
    """``binary``'s copy on the home's init tmpfs (mounted if need be). Its name carries
    the binary's digest, so a copy is never changed in place, and other versions stay (a
    process of another agentbox version may be about to bind one); only when the tmpfs
    is full are they cleared (running sandboxes keep theirs: a bind holds the file)."""
    root = initfs_dir(home)
    target = root / binary.name
    if target.is_file():
        return target
    with locked(home / "lib" / "initfs.lock"):
        root.mkdir(mode=0o755, exist_ok=True)
        try:
            if not is_mountpoint(root):
                syscalls.mount("agentbox-init", str(root), "tmpfs",
                               syscalls.MS_NOSUID | syscalls.MS_NODEV,
                               f"size={SIZE_BYTES},mode=0755")  # fmt: skip
            if not target.is_file():
                try:
                    _install(binary, target)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    for other in root.iterdir():
                        if not other.is_dir():  # a locale directory (isolation.locales)
                            other.unlink()  # stays: running sandboxes see into it
                    _install(binary, target)
        except OSError as e:
            raise SandboxError(f"could not set up the sandbox init at {root}: {e}") from e
    return target


def _install(binary: Path, target: Path) -> None:
    staging = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        import shutil  # here: once per home, not on every create

        shutil.copyfile(binary, staging)
        staging.chmod(0o755)
        staging.replace(target)
    finally:
        staging.unlink(missing_ok=True)


def release(home: Path) -> None:
    """Unmount the home's init tmpfs (for throwing a home away)."""
    root = initfs_dir(home)
    if is_mountpoint(root):
        disk.unmount(root)
