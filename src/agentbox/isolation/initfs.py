"""The sandbox init's binary on a small tmpfs per home (``$AGENTBOX_HOME/initfs``), from
where it is bound read-only into every sandbox as ``/.agentbox/init``.

A bind mount shows, in the sandbox's ``/proc/self/mountinfo``, the source file's path
inside its filesystem: bound from the host's filesystem that path names the home; from
this tmpfs it is only the file's name. One copy in memory serves every sandbox (a copy on
each sandbox's own disk cost ~3 ms of reads at every launch and a page cache per
sandbox). Mounted on first use and again after a reboot; ``release`` takes it down when a
home is thrown away.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from agentbox.fsutil import is_mountpoint, locked
from agentbox.isolation import disk, syscalls

SIZE_BYTES = 16 << 20  # a few versions of a <1 MB binary


def initfs_dir(home: Path) -> Path:
    return home / "initfs"


def ensure(home: Path, binary: Path) -> Path:
    """``binary``'s copy on the home's init tmpfs (mounted if need be). Its name carries
    the binary's digest, so a copy is never changed in place; older ones are removed
    (sandboxes running them keep theirs: a bind holds the file, not its name)."""
    root = initfs_dir(home)
    target = root / binary.name
    if target.is_file():
        return target
    with locked(home / "lib" / "initfs.lock"):
        root.mkdir(mode=0o755, exist_ok=True)
        if not is_mountpoint(root):
            syscalls.mount("agentbox-init", str(root), "tmpfs",
                           syscalls.MS_NOSUID | syscalls.MS_NODEV,
                           f"size={SIZE_BYTES},mode=0755")  # fmt: skip
        if not target.is_file():
            for old in root.iterdir():
                old.unlink()
            staging = root / f".{binary.name}.{os.getpid()}"
            shutil.copyfile(binary, staging)
            staging.chmod(0o755)
            staging.replace(target)
    return target


def release(home: Path) -> None:
    """Unmount the home's init tmpfs (for throwing a home away)."""
    root = initfs_dir(home)
    if is_mountpoint(root):
        disk.unmount(root)
