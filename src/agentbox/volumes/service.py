"""Named volumes of one home: create, list (with usage), remove; attach to a sandbox
being made (records first, then the tree handed over and the mount points made) and
detach when it goes; recovery after a crash or a reboot.

Where images go: ``dir`` (the gateway config's ``volumes.dir``), else
``$AGENTBOX_VOLUMES_DIR``, else ``$AGENTBOX_HOME/volumes/images``. Each volume's record
keeps its image's path, so every process finds existing ones whatever its settings.
``capacity``: the most bytes all volume sizes may add up to (default: the size of the
filesystem holding ``dir``, so sparse images can never be promised more than the disk).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.errors import AgentboxError, InvalidRequest
from agentbox.fsutil import is_mountpoint, locked
from agentbox.units import parse_size
from agentbox.volumes import image
from agentbox.volumes.spec import check_name
from agentbox.volumes.store import VolumeRecord, VolumeStore, not_found

log = logging.getLogger(__name__)
MIN_SIZE = 16 * 1024**2
MAX_SIZE = 16 * 1024**4  # ext4 files end at 16 TiB


@dataclass(frozen=True)
class Bind:
    """What the sandbox's launcher binds: ``source`` (a volume's data/) at ``path``;
    ``view``: the mount the launcher must show bubblewrap for it."""

    source: Path
    path: str
    readonly: bool
    view: Path


class Volumes:
    def __init__(self, home: Path, directory: Path | None = None, capacity: int | None = None):
        self.home = home
        env = os.environ.get("AGENTBOX_VOLUMES_DIR")
        self.dir = directory or (Path(env) if env else home / "volumes" / "images")
        self.capacity = capacity
        self.store = VolumeStore(home / "state.db")

    def _mountpoint(self, name: str) -> Path:
        return self.home / "volumes" / "mnt" / name

    @staticmethod
    def _checked(name: str) -> str:
        """``name``, if a volume could have it (it becomes a file name: never one with a
        slash or a dot-dot); else VolumeNotFound."""
        try:
            return check_name(name)
        except ValueError:
            raise not_found(name) from None

    def _lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        return locked(self.home / "lib" / "volumes" / f"{self._checked(name)}.lock")

    def _capacity(self) -> int:
        if self.capacity is not None:
            return self.capacity
        self.dir.mkdir(parents=True, exist_ok=True)
        st = os.statvfs(self.dir)
        return st.f_blocks * st.f_frsize

    # the API ----------------------------------------------------------------------------
    def create(self, name: str, size: int | str) -> dict[str, Any]:
        try:
            check_name(name)
        except ValueError as e:
            raise InvalidRequest(str(e), field="name", value=name) from None
        size = parse_size(size, "size")
        if not MIN_SIZE <= size <= MAX_SIZE:
            raise InvalidRequest("a volume's size must be from 16MiB to 16TiB", field="size")
        path = self.dir / f"{name}.img"
        with self._lock(name):
            record = self.store.add(name, str(path), size, self._capacity())
            try:
                path.unlink(missing_ok=True)  # a crash's leftover of a volume not recorded
                image.format_image(path, size)
                image.ensure_mounted(path, self._mountpoint(name))
            except BaseException:
                with contextlib.suppress(AgentboxError):
                    self.store.remove(name)
                path.unlink(missing_ok=True)
                raise
        return self.describe(record)

    def describe(self, record: VolumeRecord) -> dict[str, Any]:
        data = record.to_dict()
        with contextlib.suppress(AgentboxError, OSError):
            mountpoint = self._mountpoint(record.name)
            image.ensure_mounted(Path(record.image), mountpoint)
            data.update(image.usage(mountpoint))
        return data

    def exists(self, name: str) -> bool:
        return self.store.exists(name)

    def get(self, name: str) -> dict[str, Any]:
        return self.describe(self.store.get(self._checked(name)))

    def list(self) -> builtins.list[dict[str, Any]]:
        return [self.describe(r) for r in self.store.list()]

    def remove(self, name: str) -> None:
        """Destroy the volume and its data; refused (VolumeInUse) while mounted."""
        with self._lock(name):
            record = self.store.remove(name)
            image.unmount(self._mountpoint(name))
            Path(record.image).unlink(missing_ok=True)

    # sandboxes ---------------------------------------------------------------------------
    def attach(
        self, sandbox: str, mounts: Sequence[Any], uid: int, gid: int
    ) -> builtins.list[Bind]:
        """Record ``mounts`` (VolumeMount) for ``sandbox`` (VolumeInUse if a writer is in
        the way), hand each tree to the sandbox's uid, and return what to bind."""
        if not mounts:
            return []
        self.store.attach(sandbox, [(m.name, m.path, m.mode, m.if_busy == "skip")
                                    for m in mounts])  # fmt: skip
        try:
            binds = self.binds_for(sandbox)  # those attached: a busy "skip" one is not
            for bind in binds:
                with self._lock(bind.view.name):  # readers may attach side by side
                    image.hand_over(bind.source, uid, gid, writable=not bind.readonly)
            return binds
        except BaseException:
            self.store.detach(sandbox)
            raise

    def binds_for(self, sandbox: str) -> builtins.list[Bind]:
        """The binds of the volumes ``sandbox`` holds (mounting them if need be: after a
        reboot the first start remounts them), ordered by path."""
        binds = []
        for mount in self.store.mounts_for(sandbox):
            record = self.store.get(mount["name"])
            mountpoint = self._mountpoint(record.name)
            with self._lock(record.name):
                data = image.ensure_mounted(Path(record.image), mountpoint)
            binds.append(Bind(data, mount["path"], mount["mode"] == "ro", mountpoint))
        return binds

    def detach(self, sandbox: str) -> None:
        self.store.detach(sandbox)

    def recover(self) -> builtins.list[str]:
        """After a crash: forget mounts of sandboxes that are gone, mount every volume
        again (a reboot unmounted them). Returns the leftovers it cleared, for the
        recovery report."""
        done = []
        forgotten = self.store.forget_orphan_mounts()
        if forgotten:
            done.append(f"{forgotten} volume mount(s) of removed sandboxes")
        for record in self.store.list():
            mountpoint = self._mountpoint(record.name)
            if is_mountpoint(mountpoint):
                continue
            try:
                with self._lock(record.name):
                    image.ensure_mounted(Path(record.image), mountpoint)
                log.info("volume %s mounted again", record.name)
            except (AgentboxError, OSError) as e:
                log.warning("could not mount volume %s: %s", record.name, e)
        return done

    def release(self) -> None:
        """Unmount every volume of the home (throwing a home away; data stays)."""
        for record in self.store.list():
            image.unmount(self._mountpoint(record.name))
