"""What the host offers: each capability agentbox needs, checked for real, with the fix.

``agentbox doctor`` prints these; tests use them to fail with a clear message when the
machine lacks something instead of skipping.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agentbox.errors import AgentboxError
from agentbox.isolation.cgroups import CgroupLayout


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str
    required: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "ok": self.ok,
            "detail": self.detail,
            "fix": "" if self.ok else self.fix,
            "required": self.required,
        }


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check(
        "root",
        ok,
        f"euid {os.geteuid()}",
        "run agentbox as root (it sets up mounts, "
        "cgroups and loop devices, then drops every sandbox to its own uid)",
    )


def check_bubblewrap() -> Check:
    path = shutil.which("bwrap")
    if not path:
        return Check("bubblewrap", False, "bwrap not found", "apt-get install -y bubblewrap")
    version = _run([path, "--version"]).stdout.strip()
    return Check("bubblewrap", True, f"{path} ({version})", "")


def check_user_namespaces() -> Check:
    limit = Path("/proc/sys/user/max_user_namespaces")
    value = int(limit.read_text()) if limit.exists() else 0
    if value == 0:
        return Check(
            "user namespaces",
            False,
            "user.max_user_namespaces = 0",
            "sysctl -w user.max_user_namespaces=100000",
        )
    bwrap = shutil.which("bwrap")
    if bwrap:
        probe = _run(
            [
                "setpriv",
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                bwrap,
                "--unshare-user",
                "--unshare-pid",
                "--ro-bind",
                "/",
                "/",
                "true",
            ]
        )
        if probe.returncode != 0:
            return Check(
                "user namespaces",
                False,
                probe.stderr.strip(),
                "allow unprivileged user namespaces "
                "(kernel.unprivileged_userns_clone=1, AppArmor userns restrictions off)",
            )
    return Check("user namespaces", True, f"max_user_namespaces = {value}", "")


def check_cgroups() -> Check:
    try:
        layout = CgroupLayout.detect()
    except AgentboxError as e:
        return Check("cgroups", False, e.message, "boot with cgroup v2 (unified) enabled")
    detail = f"{layout.mode} (v2 at {layout.unified}"
    detail += f", v1: {', '.join(sorted(layout.v1))})" if layout.v1 else ")"
    try:
        kill = cgroup_kill_supported(layout.unified)
    except OSError as e:
        return Check(
            "cgroups", False, f"{detail}; cannot create a cgroup: {e}", "run agentbox as root"
        )
    if not kill:
        return Check(
            "cgroups",
            False,
            detail + "; cgroup.kill missing",
            "a kernel >= 5.14 is needed for cgroup.kill",
        )
    return Check("cgroups", True, detail, "")


def cgroup_kill_supported(parent: Path) -> bool:
    """Whether a child of ``parent`` gets ``cgroup.kill``, asked of one made for the
    purpose (and removed): the root cgroup never has the file, and a fresh host may
    have no child cgroup to look at yet."""
    probe = parent / f"agentbox-probe-{os.getpid()}-{secrets.token_hex(4)}"
    probe.mkdir()
    try:
        return (probe / "cgroup.kill").exists()
    finally:
        probe.rmdir()


def check_seccomp() -> Check:
    try:
        from agentbox.isolation import seccomp

        size = len(seccomp.compile_profile(seccomp.load_profile()))
    except Exception as e:  # libseccomp missing shows up as an OSError from ctypes
        return Check("seccomp", False, str(e), "apt-get install -y libseccomp2")
    return Check("seccomp", True, f"profile compiles to {size // 8} BPF instructions", "")


def _filesystem(name: str) -> bool:
    return any(
        line.split()[-1] == name for line in Path("/proc/filesystems").read_text().splitlines()
    )


def check_overlayfs() -> Check:
    ok = _filesystem("overlay")
    return Check(
        "overlayfs", ok, "in /proc/filesystems" if ok else "not available", "modprobe overlay"
    )


def check_disk() -> Check:
    missing = [t for t in ("mkfs.ext4", "mkfs.xfs") if not shutil.which(t)]
    if missing:
        return Check(
            "sandbox disks",
            False,
            f"{', '.join(missing)} not found",
            "apt-get install -y e2fsprogs xfsprogs",
        )
    if not Path("/dev/loop-control").exists():
        return Check("sandbox disks", False, "/dev/loop-control missing", "modprobe loop")
    for fs in ("ext4", "xfs"):
        if not _filesystem(fs):
            return Check("sandbox disks", False, f"{fs} not supported by the kernel",
                         f"modprobe {fs}")  # fmt: skip
    return Check(
        "sandbox disks",
        True,
        "loop devices + ext4 (one sparse image per sandbox, in an XFS pool that clones)",
        "",
    )


def _binary(name: str, binaries: tuple[str, ...], fix: str, required: bool = True) -> Check:
    """A check that passes when one of ``binaries`` is on PATH."""
    path = next((p for p in map(shutil.which, binaries) if p), None)
    return Check(name, path is not None, path or "not found", fix, required=required)


def check_compiler() -> Check:
    return _binary("C compiler", ("cc", "gcc"),
                   "apt-get install -y gcc libc6-dev (builds the 4 KB launcher once)")  # fmt: skip


def check_mmdebstrap() -> Check:
    return _binary("mmdebstrap", ("mmdebstrap",),
                   "apt-get install -y mmdebstrap (only for `agentbox template build`)",
                   required=False)  # fmt: skip


def check_network() -> Check:
    """What networked sandboxes (the default mode, allowlist) need: nft, ip, nsenter and
    veth links. Creates and deletes one veth pair to be sure the kernel has the driver."""
    fix = "apt-get install -y nftables iproute2 util-linux (or create sandboxes with network none)"
    missing = [b for b in ("nft", "ip", "nsenter") if shutil.which(b) is None]
    if missing:
        return Check("sandbox network", False, f"{', '.join(missing)} not found", fix)
    probe = f"abdoc{os.getpid() % 100000}"
    made = subprocess.run(
        ["ip", "link", "add", probe, "type", "veth", "peer", "name", probe + "p"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        return Check("sandbox network", False, f"cannot create a veth: {made.stderr.strip()}",
                     "load the veth module (modprobe veth)")  # fmt: skip
    subprocess.run(["ip", "link", "del", probe], capture_output=True, check=False)
    return Check("sandbox network", True, "nft, ip, nsenter, veth links", "")


def tier_namespaces(checks: list[Check]) -> Check:
    """The default tier runs where bubblewrap, user namespaces, cgroups and seccomp do
    (``checks``: the results above, which say why not)."""
    needed = ("bubblewrap", "user namespaces", "cgroups", "seccomp")
    failing = [c for c in checks if c.name in needed and not c.ok]
    if failing:
        return Check("isolation tier namespaces", False,
                     "; ".join(f"{c.name}: {c.detail}" for c in failing),
                     " / ".join(c.fix for c in failing), required=False)  # fmt: skip
    return Check("isolation tier namespaces", True, "bubblewrap + cgroups + seccomp", "",
                 required=False)  # fmt: skip


def check_tier_gvisor() -> Check:
    """The gvisor tier needs runsc and a platform it runs on here (probed by running
    ``runsc do true``): optional, sandboxes ask for it with isolation gvisor."""
    from agentbox.isolation import gvisor

    probe = gvisor.probe()
    fix = gvisor.INSTALL_FIX if probe.runsc is None else (
        "see docs/design.md (Isolation tiers) for the platforms runsc supports; "
        "use isolation namespaces meanwhile"
    )  # fmt: skip
    return Check("isolation tier gvisor", probe.ok, probe.detail, fix, required=False)


def check_chromium() -> Check:
    return _binary("chromium", ("chromium",), "apt-get install -y chromium (browser tool)",
                   required=False)  # fmt: skip


ALL_CHECKS: list[Callable[[], Check]] = [
    check_root,
    check_bubblewrap,
    check_user_namespaces,
    check_cgroups,
    check_seccomp,
    check_overlayfs,
    check_disk,
    check_compiler,
    check_mmdebstrap,
    check_network,
    check_chromium,
]


def run_checks(tiers: bool = False) -> list[Check]:
    """Every check; with ``tiers`` (doctor) also which isolation tiers this host can
    run, and why not (the gVisor probe starts runsc: kept out of readiness checks)."""
    results = []
    for check in ALL_CHECKS:
        try:
            results.append(check())
        except Exception as e:  # a probe that crashes is itself a finding
            results.append(
                Check(check.__name__.removeprefix("check_"), False, repr(e), "see detail")
            )
    if tiers:
        results.append(tier_namespaces(results))
        try:
            results.append(check_tier_gvisor())
        except Exception as e:  # as above
            results.append(Check("isolation tier gvisor", False, repr(e), "see detail",
                                 required=False))  # fmt: skip
    return results
