"""cgroup limits (memory, pids, CPU) and whole-tree kill, on unified v2 or hybrid v1+v2 hosts.

Layout per sandbox ``ID`` (``agentbox/ID`` in each hierarchy used):

* unified v2 (production hosts): ``/sys/fs/cgroup/agentbox/ID`` carries memory.max,
  pids.max and cpu.max; processes live in leaves ``ID/init`` (the sandbox's first
  process) and ``ID/cN`` (one per command, so a timeout kills exactly that command's tree,
  ``setsid`` daemons included).
* hybrid (these hosts): the v1 ``memory``, ``pids``, ``cpu`` and ``freezer`` hierarchies
  carry the limits on ``agentbox/ID``; the v2 mount at ``/sys/fs/cgroup/unified`` has no
  controllers but offers ``cgroup.kill``, so the same ``init``/``cN`` leaves live there.

The layout is detected once from ``/proc/self/mounts``. Killing always goes through
``cgroup.kill`` (atomic for the whole subtree; a process cannot escape by forking).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agentbox.errors import HostUnsupported, SandboxError

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PARENT = "agentbox"
_V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What a sandbox's cgroups enforce: memory in bytes, tasks, CPUs (a fraction of one
    or more)."""

    memory_bytes: int
    pids: int
    cpus: float


@dataclass(frozen=True)
class CgroupLayout:
    """Where the hierarchies are on this host."""

    mode: Literal["unified", "hybrid"]
    unified: Path  # the v2 mount (kill, freeze, leaves)
    v1: dict[str, Path]  # controller -> v1 mount (hybrid only)

    @staticmethod
    def detect(mounts_file: Path = Path("/proc/self/mounts")) -> CgroupLayout:
        v2: Path | None = None
        v1: dict[str, Path] = {}
        for line in mounts_file.read_text().splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            # Only cgroup lines are parsed further: a busy host has thousands of mounts
            # (every sandbox has some) and this runs on a process's first create.
            fstype = fields[2]
            if fstype == "cgroup2":
                v2 = Path(fields[1])
            elif fstype == "cgroup":
                options = fields[3].split(",")
                for ctrl in _V1_CONTROLLERS:
                    if ctrl in options:
                        v1[ctrl] = Path(fields[1])
        if v2 is None:
            raise HostUnsupported(
                "no cgroup v2 mount found; agentbox needs cgroup v2 (unified) or the hybrid "
                "layout (v1 controllers + v2 at /sys/fs/cgroup/unified) for cgroup.kill"
            )
        controllers_file = v2 / "cgroup.controllers"
        v2_controllers = controllers_file.read_text().split() if controllers_file.exists() else []
        if {"memory", "pids", "cpu"} <= set(v2_controllers):
            return CgroupLayout("unified", v2, {})
        missing = [c for c in ("memory", "pids", "cpu") if c not in v1]
        if missing:
            raise HostUnsupported(
                f"cgroup controllers {missing} are neither in cgroup v2 nor mounted as v1; "
                "enable them (systemd.unified_cgroup_hierarchy=1 on the kernel command line)"
            )
        return CgroupLayout("hybrid", v2, v1)

    def sandbox(self, sandbox_id: str) -> SandboxCgroup:
        return SandboxCgroup(self, sandbox_id)


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


class SandboxCgroup:
    """The cgroups of one sandbox."""

    def __init__(self, layout: CgroupLayout, sandbox_id: str) -> None:
        self.layout = layout
        self.id = sandbox_id
        self.unified = layout.unified / GROUP_PARENT / sandbox_id
        self.v1 = {c: p / GROUP_PARENT / sandbox_id for c, p in layout.v1.items()}

    # creation -----------------------------------------------------------------------
    def create(self, limits: Limits) -> None:
        try:
            if self.layout.mode == "unified":
                self._create_unified(limits)
            else:
                self._create_hybrid(limits)
            (self.unified / "init").mkdir(exist_ok=True)
        except OSError as e:
            self.remove()
            raise SandboxError(f"could not set up the sandbox's cgroups: {e}") from e

    def _create_unified(self, limits: Limits) -> None:
        parent = self.unified.parent
        if not parent.exists():
            parent.mkdir(exist_ok=True)
        # Controllers must be enabled down the path for the limits files to exist.
        for node in (self.layout.unified, parent):
            enabled = (node / "cgroup.subtree_control").read_text().split()
            for ctrl in ("memory", "pids", "cpu"):
                if ctrl not in enabled:
                    _write(node / "cgroup.subtree_control", f"+{ctrl}")
        self.unified.mkdir()
        _write(self.unified / "memory.max", str(limits.memory_bytes))
        with contextlib.suppress(FileNotFoundError):  # no swap accounting configured
            _write(self.unified / "memory.swap.max", "0")
        _write(self.unified / "pids.max", str(limits.pids))
        quota = max(1000, int(limits.cpus * _CPU_PERIOD_US))
        _write(self.unified / "cpu.max", f"{quota} {_CPU_PERIOD_US}")

    def _create_hybrid(self, limits: Limits) -> None:
        for path in self.v1.values():
            path.mkdir(parents=True, exist_ok=True)
        mem = self.v1["memory"]
        _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
        memsw = mem / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            _write(memsw, str(limits.memory_bytes))
        _write(self.v1["pids"] / "pids.max", str(limits.pids))
        cpu = self.v1["cpu"]
        _write(cpu / "cpu.cfs_period_us", str(_CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(max(1000, int(limits.cpus * _CPU_PERIOD_US))))
        self.unified.mkdir(parents=True, exist_ok=True)

    # joining ------------------------------------------------------------------------
    def dirs_for(self, leaf: str) -> list[str]:
        """The cgroup directories a process joins to run as ``leaf`` of this sandbox."""
        return [*self.v1_dirs(), self.leaf_dir(leaf)]

    def v1_dirs(self) -> list[str]:
        return [str(p) for p in self.v1.values()]

    def leaf_dir(self, leaf: str) -> str:
        return str(self.unified / leaf)

    def new_leaf(self, name: str) -> str:
        (self.unified / name).mkdir(exist_ok=True)
        return name

    def kill_leaf(self, name: str) -> None:
        """SIGKILL every process of one command's leaf (never anything above it)."""
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup leaf name {name!r}")
        with contextlib.suppress(FileNotFoundError):
            _write(self.unified / name / "cgroup.kill", "1")

    def remove_leaf(self, name: str) -> None:
        self.kill_leaf(name)
        self._rmdir_when_empty(self.unified / name)

    def remove_leaf_dir(self, name: str) -> None:
        """Remove a leaf whose processes were moved out (kept while some remain)."""
        with contextlib.suppress(OSError):
            (self.unified / name).rmdir()

    # state --------------------------------------------------------------------------
    def populated(self, node: Path | None = None) -> bool:
        events = (node or self.unified) / "cgroup.events"
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() == "1"
        except FileNotFoundError:
            return False
        return False

    def pids(self) -> list[int]:
        out: list[int] = []
        for root, _dirs, _files in os.walk(self.unified):
            with contextlib.suppress(FileNotFoundError):
                out.extend(int(p) for p in (Path(root) / "cgroup.procs").read_text().split())
        return out

    def memory_current(self) -> int:
        if self.layout.mode == "unified":
            path = self.unified / "memory.current"
        else:
            path = self.v1["memory"] / "memory.usage_in_bytes"
        try:
            return int(path.read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def populated_leaves(self, prefix: str) -> list[str]:
        """Names of the sub-groups starting with ``prefix`` that hold a process."""
        try:
            children = [c for c in self.unified.iterdir() if c.name.startswith(prefix)]
        except FileNotFoundError:
            return []
        return [c.name for c in children if c.is_dir() and self.populated(c)]

    def cpu_usage_us(self) -> int:
        """CPU time used by every process of the sandbox so far, in microseconds (the v2
        ``cpu.stat`` core counter, present with or without the cpu controller)."""
        try:
            for line in (self.unified / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value)
        except (FileNotFoundError, ValueError):
            pass
        return 0

    def oom_kills(self) -> int:
        """How many processes of the sandbox the OOM killer has ended."""
        if self.layout.mode == "unified":
            path, key = self.unified / "memory.events", "oom_kill"
        else:
            path, key = self.v1["memory"] / "memory.oom_control", "oom_kill"
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (FileNotFoundError, ValueError):
            pass
        return 0

    # pause ---------------------------------------------------------------------------
    def freeze(self, timeout: float = 10.0) -> None:
        """Stop every process of the sandbox (cgroup v2 freezer); returns once frozen.
        Memory and open files stay; a fatal signal (destroy) still gets through."""
        self._set_frozen(True, timeout)

    def thaw(self, timeout: float = 10.0) -> None:
        self._set_frozen(False, timeout)

    def frozen(self) -> bool:
        try:
            return (self.unified / "cgroup.freeze").read_text().strip() == "1"
        except FileNotFoundError:
            return False

    def _set_frozen(self, frozen: bool, timeout: float) -> None:
        want = "1" if frozen else "0"
        _write(self.unified / "cgroup.freeze", want)
        deadline = time.monotonic() + timeout
        while self._event("frozen") != want:
            if time.monotonic() > deadline:
                raise SandboxError(
                    f"the sandbox's cgroup did not become {'frozen' if frozen else 'thawed'} "
                    f"within {timeout:g} s"
                )
            time.sleep(0.001)

    def _event(self, key: str) -> str:
        with contextlib.suppress(FileNotFoundError):
            for line in (self.unified / "cgroup.events").read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return value.strip()
        return ""

    # teardown -----------------------------------------------------------------------
    def kill(self) -> None:
        """SIGKILL every process of the sandbox, wherever it moved in the subtree."""
        with contextlib.suppress(FileNotFoundError):
            _write(self.unified / "cgroup.kill", "1")

    def end_processes(self, timeout: float = 10.0) -> None:
        """Kill everything and wait until the tree is empty; the groups stay."""
        self.kill()
        self._wait_unpopulated(time.monotonic() + timeout)

    def remove_processes(self, timeout: float = 10.0, keep: tuple[str, ...] = ("init",)) -> None:
        """Kill everything, wait until the tree is empty, remove the sub-groups but
        ``keep`` (the sandbox's own groups and limits stay for its next start)."""
        self.kill()
        deadline = time.monotonic() + timeout
        self._wait_unpopulated(deadline)  # cgroup.kill is asynchronous; exit takes a moment
        if self.unified.exists():
            for child in sorted(self.unified.iterdir()):
                if child.is_dir() and child.name not in keep:
                    self._rmdir_when_empty(child, deadline)

    def remove(self, timeout: float = 10.0) -> None:
        """Kill everything, wait until the tree is empty, remove every directory."""
        deadline = time.monotonic() + timeout
        self.remove_processes(timeout, keep=())
        if self.unified.exists():
            self._rmdir_when_empty(self.unified, deadline)
        for path in self.v1.values():
            self._rmdir_when_empty(path, deadline)

    def _wait_unpopulated(self, deadline: float) -> None:
        """Return once no process is left in the sandbox's tree (or at ``deadline``).
        The kernel notifies a change of cgroup.events to poll (POLLPRI): woken the moment
        the last process exits, not at the next tick of a sleep loop (a sleep's 2 ms were
        most of a kill's wait, the processes' exit a fraction of one)."""
        try:
            fd = os.open(self.unified / "cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            poller = select.poll()
            poller.register(fd, select.POLLPRI | select.POLLERR)
            while b"populated 1" in os.pread(fd, 4096, 0):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # Re-read at least every 50 ms: a bound on a missed wake-up, not a tick.
                poller.poll(min(left, 0.05) * 1000)
        finally:
            os.close(fd)

    @staticmethod
    def _rmdir_when_empty(path: Path, deadline: float | None = None) -> None:
        deadline = deadline if deadline is not None else time.monotonic() + 10.0
        while True:
            try:
                path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise SandboxError(f"could not remove cgroup {path}: {e}") from e
                time.sleep(0.002)
