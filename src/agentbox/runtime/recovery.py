"""Crash recovery: after a process died mid-work (the gateway killed with SIGKILL, a
power cut), bring the home back to "every sandbox either works or is cleanly gone".

Sandboxes outlive their creator by design (their init is detached), so a restart adopts
every running one as it is: nothing to do but check its init is alive. The rest:

* a ``creating`` record whose creator is gone (its create lock is free) is removed with
  everything it had made so far; one being created right now is left alone;
* a ``destroying`` or ``error`` record (a destroy cut short) is removed again;
* a ``running``/``paused`` record whose init is dead is destroyed (reason ``error``,
  ``oom`` or ``lifetime``);
* host resources no record owns: sandbox directories and their mounts, disk images in
  the pool (snapshot clones included), snapshot mounts, cgroups, and this home's veths;
* named volumes (``agentbox.volumes``): mounts held by sandboxes now gone are released,
  and every volume is mounted again (after a reboot); their data is never touched.

Tokens and pending approvals live in ``gateway.db`` and survive as they are.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

from agentbox.errors import AgentboxError
from agentbox.isolation import disk, diskpool
from agentbox.isolation.cgroups import GROUP_PARENT
from agentbox.network import plane
from agentbox.runtime.create_lock import creator_alive
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.tiers import found_isolation, host_for

log = logging.getLogger(__name__)
LIVE_STATES = ("running", "paused", "stopped", "pooled")


@dataclass
class Recovery:
    adopted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)  # records finished off
    orphans: list[str] = field(default_factory=list)  # host resources without a record

    def to_dict(self) -> dict[str, list[str]]:
        return {"adopted": self.adopted, "removed": self.removed, "orphans": self.orphans}


def recover(runtime: Runtime) -> Recovery:
    """One pass; safe to run while other processes use the home."""
    result = Recovery()
    home = runtime.home
    for record in runtime.store.list():
        if record.state == "creating" and creator_alive(home, record.id):
            continue
        if record.state in ("creating", "destroying", "error"):
            with contextlib.suppress(AgentboxError, OSError):
                runtime.destroy(record.id, reason="error", actor="agentbox")
            result.removed.append(record.id)
        elif record.state in ("running", "paused", "pooled") and not runtime.alive(record):
            with contextlib.suppress(AgentboxError, OSError):
                runtime.destroy(record.id, reason=runtime.end_reason(record), actor="agentbox")
            result.removed.append(record.id)
        elif record.state in LIVE_STATES:
            result.adopted.append(record.id)
    owned = {r.id for r in runtime.store.list()}
    result.orphans += _orphan_directories(home, owned)
    result.orphans += _orphan_images(home, owned)
    result.orphans += _orphan_cgroups(runtime, owned)
    result.orphans += _orphan_links(runtime)
    if (home / "volumes").is_dir():  # a home that never made a volume has nothing here
        result.orphans += runtime.volumes.recover()
    if result.removed or result.orphans:
        log.warning("recovery: %s", result.to_dict())
    return result


def _orphan_directories(home: Path, owned: set[str]) -> list[str]:
    found = []
    sandboxes = home / "sandboxes"
    for directory in sorted(sandboxes.glob("sb-*")) if sandboxes.is_dir() else []:
        if directory.name in owned:
            continue
        host = host_for(home, directory.name, 0, found_isolation(directory))
        with contextlib.suppress(AgentboxError, OSError):
            host.teardown()  # unmounts root and disk, removes the image and the directory
            found.append(f"directory {directory.name}")
    scratch = home / "lib" / "snapshot-tmp"
    for mountpoint in sorted(scratch.glob(".snapshot-*")) if scratch.is_dir() else []:
        with contextlib.suppress(AgentboxError, OSError):
            disk.unmount(mountpoint)
            mountpoint.rmdir()
            found.append(f"snapshot mount {mountpoint.name}")
    return found


def _orphan_images(home: Path, owned: set[str]) -> list[str]:
    found = []
    pool = diskpool.pool_dir(home)
    for image in sorted(pool.glob("*.img")) if pool.is_dir() else []:
        name = image.name.removesuffix(".img")
        if name in owned or _in_use(image):
            continue
        image.unlink(missing_ok=True)
        found.append(f"image {image.name}")
    for image in sorted(pool.glob(".snapshot-*.img")) if pool.is_dir() else []:
        if not _in_use(image):
            image.unlink(missing_ok=True)
            found.append(f"image {image.name}")
    return found


def _in_use(image: Path) -> bool:
    """Whether a loop device is backed by this file (a mount the walk has not undone)."""
    with contextlib.suppress(FileNotFoundError):
        for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
            with contextlib.suppress(OSError):
                if backing.read_text().strip() == str(image):
                    return True
    return False


def _orphan_cgroups(runtime: Runtime, owned: set[str]) -> list[str]:
    found = []
    layout = runtime.layout
    roots = [layout.unified / GROUP_PARENT, *(p / GROUP_PARENT for p in layout.v1.values())]
    names = {
        child.name
        for root in roots
        if root.is_dir()
        for child in root.iterdir()
        if child.is_dir() and child.name.startswith("sb-")
    }
    for name in sorted(names - owned):
        if not _this_home_made(runtime, name):
            continue
        with contextlib.suppress(AgentboxError, OSError):
            layout.sandbox(name).remove()
            found.append(f"cgroup {name}")
    return found


def _this_home_made(runtime: Runtime, sandbox_id: str) -> bool:
    """Cgroups are host-wide; another home's sandbox is none of our business. Ours left
    a trace: an event (created, destroyed) in this home's state.db."""
    return bool(runtime.store.events_after(0, limit=1, sandbox=sandbox_id))


def _orphan_links(runtime: Runtime) -> list[str]:
    net = plane.registered_home_net(runtime.home)
    if net is None:
        return []
    busy = {
        r.slot for r in runtime.store.list()
        if r.state in ("running", "paused", "creating", "pooled")
    }  # fmt: skip
    found = []
    prefix = net.ifname_prefix
    for path in sorted(Path("/sys/class/net").glob(f"{prefix}*")):
        suffix = path.name.removeprefix(prefix)
        if not suffix.isdigit() or int(suffix) in busy:
            continue
        with contextlib.suppress(AgentboxError, OSError):
            plane.detach(net.link(int(suffix)))
            found.append(f"link {path.name}")
    return found
