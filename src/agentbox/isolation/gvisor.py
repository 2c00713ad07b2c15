"""The gVisor tier's building blocks: find ``runsc``, probe what it can run here, write
the OCI ``config.json`` a sandbox runs from, and spell ``runsc`` command lines.

gVisor (``runsc``) puts a user-space kernel (the Sentry) between the agent's processes
and the host kernel; files reach it through a second process (the Gofer). Both run as
root on the host, in the sandbox's cgroups; the agent's processes exist only inside the
Sentry. Nothing here starts a sandbox: ``runtime.gvisor_host`` does, with these parts.

Facts about the runsc Debian 12 ships (release 2022-12-19) on these kernels, which the
choices below follow (docs/design.md, "Isolation tiers"):

* platforms ``ptrace`` (works) and ``kvm`` (hangs on a software KVM: never probed
  here, as a hung probe would hang ``doctor``); ``systrap`` arrived in 2023 and is
  preferred when ``runsc help platforms`` lists it;
* ``--network=sandbox`` (gVisor's own network stack) refuses every namespace on kernels
  that have ``/proc/sys/net/core/rmem_default`` in each netns (its root-netns test), so a
  networked sandbox runs ``--network=host`` *inside its own netns*: the Sentry's sockets
  are host sockets in that namespace, behind the same veth, nftables and egress proxy as
  the default tier. ``--network=none`` (gVisor's loopback only) serves network ``none``;
* ``statx`` with ``AT_NO_AUTOMOUNT`` fails with EINVAL, so coreutils 9's ``ls -l`` and
  ``stat`` fail inside (fixed in later runsc releases).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentbox.errors import HostUnsupported

TIER = "gvisor"
AGENT_PATH = "/.agentbox/agent"  # the first process: init and exec agent in one
# What the agent (and its wrapper of runsc exec commands) holds: the commands it runs
# have none of them, in no set.
AGENT_CAPABILITIES = ("CAP_SYS_ADMIN", "CAP_SETPCAP")
CAPABILITY_SETS = ("bounding", "effective", "permitted")
# Where runsc may be: a newer release installed by hand beside Debian's package.
CANDIDATES = ("/usr/local/bin/runsc", "/usr/bin/runsc", "/usr/sbin/runsc")
INSTALL_FIX = "apt-get install -y runsc (scripts/install.sh installs it)"
PROBE_TIMEOUT_S = 20.0
# Host-side runsc options common to every call on one sandbox (its --root differs).
# file-access=shared: the files API writes the sandbox's tree from the host, and the
# Sentry must see those writes (its default, exclusive, caches and would not).
# overlay2=none: writes land in the sandbox's own disk (its quota), not Sentry memory.
COMMON_FLAGS = ("--file-access=shared", "--overlay2=none", "--host-uds=create")
_VERSION_RE = re.compile(r"(\d{8})")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Runsc:
    """One runsc binary and the platform it runs on here."""

    path: str
    version: str  # e.g. "0.0~20221219.0" or "release-20240807.0"
    platform: str

    @property
    def release(self) -> str:
        """The release date (YYYYMMDD) in the version string, for picking the newest."""
        found = _VERSION_RE.search(self.version)
        return found.group(1) if found else "0"

    def argv(self, state_root: Path, network: str, *more: str) -> list[str]:
        """``runsc`` with the global flags for a sandbox whose state is in ``state_root``."""
        return [
            self.path,
            f"--root={state_root}",
            f"--platform={self.platform}",
            f"--network={network}",
            *COMMON_FLAGS,
            *more,
        ]


def _version(path: str) -> str | None:
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = done.stdout.strip().splitlines()[:1]
    if done.returncode != 0 or not first:
        return None
    return first[0].removeprefix("runsc version ").strip()


def _platform(path: str) -> str:
    """systrap where this runsc has it (faster, no ptrace of every syscall), else ptrace."""
    try:
        done = subprocess.run([path, "help", "platforms"], capture_output=True, text=True,
                              timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "ptrace"
    return "systrap" if "systrap" in done.stdout else "ptrace"


_found: Runsc | None = None


def find_runsc() -> Runsc:
    """The newest runsc on this host (by release date), Debian's package as the floor.
    Raises HostUnsupported when there is none."""
    global _found
    if _found is not None and Path(_found.path).exists():
        return _found
    seen: dict[str, Runsc] = {}
    on_path = shutil.which("runsc")
    for candidate in (*CANDIDATES, *([on_path] if on_path else [])):
        real = str(Path(candidate).resolve())
        if real in seen or not Path(real).is_file():
            continue
        version = _version(real)
        if version is not None:
            seen[real] = Runsc(real, version, "ptrace")
    if not seen:
        raise HostUnsupported(
            f"the gvisor isolation tier needs runsc, which is not installed: {INSTALL_FIX}; "
            "or create the sandbox with isolation namespaces"
        )
    newest = max(seen.values(), key=lambda r: r.release)
    _found = Runsc(newest.path, newest.version, _platform(newest.path))
    return _found


@dataclass(frozen=True)
class Probe:
    runsc: Runsc | None
    ok: bool
    detail: str


def probe() -> Probe:
    """Run ``runsc do true`` on the host's root (read-only, no network) and time it: what
    ``doctor`` reports and what the tests demand."""
    try:
        runsc = find_runsc()
    except HostUnsupported as e:
        return Probe(None, False, e.message)
    with tempfile.TemporaryDirectory(prefix="agentbox-runsc-probe-") as state:
        argv = [runsc.path, f"--root={state}", f"--platform={runsc.platform}",
                "--network=none", "do", "--root=/", "/bin/true"]  # fmt: skip
        started = time.monotonic()
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Probe(runsc, False, f"`runsc do true` hung for {PROBE_TIMEOUT_S:.0f} s "
                         f"on platform {runsc.platform}")  # fmt: skip
        elapsed_ms = (time.monotonic() - started) * 1000
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-300:]
        return Probe(runsc, False, f"`runsc do true` failed on platform {runsc.platform}: {tail}")
    return Probe(
        runsc,
        True,
        f"{runsc.path} {runsc.version}, platform {runsc.platform} "
        f"(`runsc do true`: {elapsed_ms:.0f} ms)",
    )


# The OCI runtime spec: https://github.com/opencontainers/runtime-spec/blob/main/config.md
def bundle_config(
    *,
    root: Path,
    args: Sequence[str],
    env: Mapping[str, str],
    uid: int,
    gid: int,
    hostname: str,
    netns: Path | None,
    tmp: Path,
    cgroups_path: str,
    memory_bytes: int,
    pids: int,
    cpus: float,
    nofile: int = 1024 * 1024,
    capabilities: Sequence[str] = (),
) -> dict[str, Any]:
    """The ``config.json`` of a sandbox: its root (the host-side tree, submounts
    included), the first process (as ``uid``:``gid``, with ``capabilities`` only,
    no_new_privs) and
    the namespaces; ``netns``: the network namespace the network plane made (None: a new,
    empty one); ``tmp``: the sandbox's /tmp on its disk, named in the spec because runsc
    otherwise mounts a tmpfs of its own there (the files API would not see it, and it
    would count against memory, not disk). ``cgroups_path``: the sandbox's cgroups, the
    default tier's layout (``isolation.cgroups``, limits already set there); runsc joins
    them with the Sentry and Gofer (without a path it would make ``/<container id>`` of
    its own, unlimited) and sizes the Sentry's memory to the limit."""
    namespaces: list[dict[str, str]] = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    namespaces.append({"type": "network", **({"path": str(netns)} if netns else {})})
    sysfs = ["nosuid", "noexec", "nodev", "ro"]
    tmp_opts = ["rbind", "rw", "nosuid", "nodev"]
    return {
        "ociVersion": "1.0.0",
        "process": {
            "user": {"uid": uid, "gid": gid},
            "args": list(args),
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": "/",
            "capabilities": {k: list(capabilities) for k in CAPABILITY_SETS},
            "noNewPrivileges": True,
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile}],
        },
        "root": {"path": str(root), "readonly": False},
        "hostname": hostname,
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": sysfs},
            {"destination": "/tmp", "type": "bind", "source": str(tmp), "options": tmp_opts},
        ],
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroups_path,
            "resources": {
                "memory": {"limit": memory_bytes, "swap": memory_bytes},
                "pids": {"limit": pids},
                "cpu": {"quota": max(1000, int(cpus * CPU_PERIOD_US)), "period": CPU_PERIOD_US},
            },
        },
    }


def exec_process(
    *,
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    uid: int,
    gid: int,
    terminal: bool = False,
) -> dict[str, Any]:
    """The ``--process`` file of one ``runsc exec``: the command under the exec agent's
    wrapper (``AGENT_PATH exec``, see ``gvisor_agent.c``), which makes it the init of a
    PID namespace of its own, so that killing the wrapper (``runsc kill --pid``) ends the
    command's whole tree, ``setsid`` daemons included; other signals sent to the wrapper
    reach the command. The wrapper holds CAP_SYS_ADMIN (the namespace) and CAP_SETPCAP (to
    empty the command's bounding set); the command runs with no capability at all.
    ``terminal``: runsc's own stdio is a pty (the caller's), which the Sentry makes the
    command's tty."""
    return {
        "user": {"uid": uid, "gid": gid},
        "args": [AGENT_PATH, "exec", *args],
        "env": [f"{k}={v}" for k, v in env.items()],
        "cwd": cwd,
        "capabilities": {k: list(AGENT_CAPABILITIES) for k in CAPABILITY_SETS},
        "noNewPrivileges": True,
        "terminal": terminal,
    }
