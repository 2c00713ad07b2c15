"""Host-side observation helpers shared by the integration and security tests.

Everything here reads the host's view (``/proc``, ``/sys/fs/cgroup``, ``/proc/self/mounts``,
``losetup``), never the sandbox's, so a sandbox cannot lie to these checks.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

CGROUP_ROOT = Path("/sys/fs/cgroup")
STATUS_FIELDS = (
    "Uid", "Gid", "Groups",
    "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
    "NoNewPrivs", "Seccomp", "Seccomp_filters",
)  # fmt: skip
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


def host_resources(home: Path, ids: Iterable[str] | None = None) -> dict[str, list[str]]:
    """Everything a sandbox may leave on the host: mounts, cgroups, dirs, loop devices.

    ``ids`` restricts the cgroups to those sandboxes (other homes on the same host may be
    running sandboxes of their own at the same time).
    """
    wanted = set(ids) if ids is not None else None
    mounts = [
        line.split()[1]
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if str(home) in line.split()[1]
    ]
    cgroups = []
    for root in [*CGROUP_ROOT.glob("*/agentbox"), CGROUP_ROOT / "agentbox"]:
        if root.is_dir():
            cgroups += [
                str(p)
                for p in root.iterdir()
                if p.is_dir() and (wanted is None or p.name in wanted)
            ]
    sandboxes = home / "sandboxes"
    dirs = [str(p) for p in sandboxes.iterdir()] if sandboxes.exists() else []
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True).stdout
    return {
        "mounts": sorted(mounts),
        "cgroups": sorted(cgroups),
        "dirs": sorted(dirs),
        "loops": sorted(line for line in loops.splitlines() if str(home) in line),
    }


def nsfs_mounts() -> list[str]:
    """Bind-mounted namespaces (``ip netns add`` style): each keeps a namespace alive.
    Those of another home's sandboxes (``HOME/sandboxes/ID/netns`` of another agentbox on
    this host, e.g. a second test run) are not this run's to count."""
    ours = os.environ.get("AGENTBOX_HOME", "").rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        fields = line.split()
        if fields[2] != "nsfs":
            continue
        home, sep, _ = fields[1].partition("/sandboxes/sb-")
        if sep and home + "/" != ours:
            continue
        found.append(fields[1])
    return sorted(found)


def proc_status(pid: int) -> dict[str, str]:
    """``/proc/PID/status`` as a dict of stripped values."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = " ".join(value.split())
    return out


def confinement(pid: int) -> dict[str, str]:
    """The security-relevant state of a host process, read from the host side."""
    status = proc_status(pid)
    out = {key: status.get(key, "<missing>") for key in STATUS_FIELDS}
    for ns in NAMESPACES:
        out[f"ns/{ns}"] = os.readlink(f"/proc/{pid}/ns/{ns}")
    st = os.stat(f"/proc/{pid}/root")
    out["root"] = f"{st.st_dev}:{st.st_ino}"
    return out


def proc_cgroups(pid: int) -> dict[str, str]:
    """Controller (or "unified") -> cgroup path, from ``/proc/PID/cgroup``."""
    out: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0":
            out["unified"] = path
        for ctrl in controllers.split(","):
            if ctrl:
                out[ctrl] = path
    return out


def cmdline(pid: int | str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def runsc_execs(sandbox_id: str, leaf: str = "") -> set[int]:
    """Host processes that are a ``runsc exec`` into a gvisor sandbox (its process file,
    named on the command line, is in the sandbox's exec directory), of ``leaf`` if given."""
    return {
        int(pid)
        for pid in os.listdir("/proc")
        if pid.isdigit() and f"/{sandbox_id}/exec/{leaf}" in cmdline(pid)
    }


def proc_uid(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def host_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def pids_with_cmdline(cmd: str, uid: int | None = None) -> list[int]:
    """Host pids whose full command line is exactly ``cmd`` (and, if given, owned by uid)."""
    return [p for p in host_pids() if cmdline(p) == cmd and (uid is None or proc_uid(p) == uid)]


def wait_for(probe: Callable[[], T | None], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll ``probe`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_PTRACE_SECCOMP_GET_FILTER = 0x420C
_WALL = 0x40000000


def seccomp_filters(pid: int) -> list[bytes]:
    """The classic-BPF programs of every seccomp filter of ``pid``, newest first.

    Read with ``PTRACE_SECCOMP_GET_FILTER`` (needs root and CONFIG_CHECKPOINT_RESTORE): the
    process is seized, stopped, read and released. Call from one thread only (ptrace
    relationships belong to the thread that attached).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    ptrace = libc.ptrace
    ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    ptrace.restype = ctypes.c_long

    def check(result: int, what: str) -> int:
        if result < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} of pid {pid}: {os.strerror(err)}")
        return result

    check(ptrace(_PTRACE_SEIZE, pid, None, None), "PTRACE_SEIZE")
    try:
        check(ptrace(_PTRACE_INTERRUPT, pid, None, None), "PTRACE_INTERRUPT")
        os.waitpid(pid, _WALL)
        filters: list[bytes] = []
        for index in range(64):
            count = ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, index, None)
            if count < 0:
                if ctypes.get_errno() == errno.ENOENT:
                    break
                check(count, "PTRACE_SECCOMP_GET_FILTER")
            buf = ctypes.create_string_buffer(count * 8)
            check(ptrace(_PTRACE_SECCOMP_GET_FILTER, pid, index, buf), "read filter")
            filters.append(buf.raw)
        return filters
    finally:
        ptrace(_PTRACE_DETACH, pid, None, None)


def _kv(path: Path) -> dict[str, str]:
    """A flat-keyed cgroup file ("key value" per line)."""
    return dict(line.split(None, 1) for line in path.read_text().splitlines() if " " in line)


class SandboxCgroups:
    """A sandbox's cgroup limits and counters as the host sees them, on a hybrid host
    (v1 memory/pids/cpu hierarchies) or a unified cgroup v2 host alike."""

    def __init__(self, sandbox_id: str) -> None:
        self.id = sandbox_id
        self.v1 = (CGROUP_ROOT / "pids" / "agentbox").is_dir()
        v2_root = CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified").is_dir() else CGROUP_ROOT
        self.unified = v2_root / "agentbox" / sandbox_id

    def _v1(self, controller: str) -> Path:
        return CGROUP_ROOT / controller / "agentbox" / self.id

    def _read(self, v1: tuple[str, str], v2: str) -> str:
        path = self._v1(v1[0]) / v1[1] if self.v1 else self.unified / v2
        return path.read_text().strip()

    def pids_current(self) -> int:
        return int(self._read(("pids", "pids.current"), "pids.current"))

    def pids_max(self) -> int:
        return int(self._read(("pids", "pids.max"), "pids.max"))

    def pids_limit_hits(self) -> int:
        base = self._v1("pids") if self.v1 else self.unified
        return int(_kv(base / "pids.events").get("max", "0"))

    def memory_limit(self) -> int:
        return int(self._read(("memory", "memory.limit_in_bytes"), "memory.max"))

    def memory_peak(self) -> int:
        return int(self._read(("memory", "memory.max_usage_in_bytes"), "memory.peak"))

    def oom_kills(self) -> int:
        if self.v1:
            return int(_kv(self._v1("memory") / "memory.oom_control").get("oom_kill", "0"))
        return int(_kv(self.unified / "memory.events").get("oom_kill", "0"))

    def cpu_quota(self) -> float:
        """The CPU limit in cores."""
        if self.v1:
            quota = int((self._v1("cpu") / "cpu.cfs_quota_us").read_text())
            period = int((self._v1("cpu") / "cpu.cfs_period_us").read_text())
        else:
            quota_text, period_text = (self.unified / "cpu.max").read_text().split()
            quota, period = int(quota_text), int(period_text)
        return quota / period

    def throttled_periods(self) -> int:
        base = self._v1("cpu") if self.v1 else self.unified
        return int(_kv(base / "cpu.stat").get("nr_throttled", "0"))

    def procs(self) -> list[int]:
        """Every process of the sandbox (launchers included: they join its cgroups)."""
        walked = [Path(d) for d, _, _ in os.walk(self.unified)]
        roots = [self._v1("pids")] if self.v1 else walked
        out: list[int] = []
        for root in roots:
            with contextlib.suppress(FileNotFoundError):
                out += [int(p) for p in (root / "cgroup.procs").read_text().split()]
        return out
