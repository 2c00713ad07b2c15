"""Attack 2 — privileges and kernel attack surface inside a sandbox.

Covers: every capability set is zero, NoNewPrivs 1, Seccomp 2 (as the sandbox sees itself);
nested user namespaces refused (``unshare -U``, ``unshare -r``, libc ``unshare`` and raw
``clone`` with CLONE_NEWUSER, ``clone3``); mounting (``mount -t tmpfs``, new mount API);
``ptrace`` of another sandbox process; TIOCSTI/TIOCLINUX injection on the sandbox's own
controlling pty, including the 64-bit request ``0x100005412`` that the kernel truncates to
TIOCSTI; and every syscall of the profile's deny list (io_uring, bpf, keyctl,
perf_event_open, userfaultfd, process_vm_readv/writev, setns, open_by_handle_at, ...);
socket()/socketpair() address families outside the allowlist (AF_VSOCK reaches the host
even with network none) and netlink protocols other than NETLINK_ROUTE.

Wherever possible a probe is chosen so that it would *succeed* without the seccomp filter
(``name_to_handle_at`` on a file, ``process_vm_readv`` of itself, ``keyctl`` on its own
keyring, ``syslog`` size query, ``personality`` query, an ioctl on /dev/null that would
otherwise say ENOTTY), so an EPERM is the filter's doing and not a side effect.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pyseccomp
import pytest
from secprobe import not_on, run_python

from agentbox import Sandbox
from agentbox.runtime.host import LaunchPaths, SandboxHost
from agentbox.runtime.runtime import Runtime

# Every test here runs on both isolation tiers (the ``tier`` fixture, tests/security/
# conftest.py). On gvisor the agent's system calls go to gVisor's kernel (the Sentry),
# never to the host's: the point there is that a call still fails, or is served inside
# that kernel; the host processes serving it are runsc's, under its own host filter
# (tests/security/test_gvisor_kernel.py). Our seccomp profile is the namespaces tier's.
NO_PROFILE_INSIDE = "our seccomp profile and bubblewrap's userns limit are the namespaces tier's"


@pytest.fixture(scope="module")
def shared_sandbox(tier_sandbox: Sandbox) -> Sandbox:
    return tier_sandbox


# Runs inside the sandbox. Every probe is harmless should it succeed (invalid magic
# numbers, no-op queries, own process only) and reports "ok" or the errno name.
SYSCALL_PROBE = r"""
import ctypes, errno, json, os, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return a

def sc(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[arg(a) for a in args])
    if r == 0 and nr == 56:  # a raw clone that worked: this is the child
        os._exit(0)
    return "ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?")

def in_child(nr, *args):
    # A call that changes the caller when it works (gVisor serves some of them itself:
    # PTRACE_TRACEME, unshare, chroot): made in a child, its answer sent back.
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, sc(nr, *args).encode())
        os._exit(0)
    os.close(w)
    answer = os.read(r, 64).decode()
    os.waitpid(pid, 0)
    os.close(r)
    return answer

AT_FDCWD = -100
buf = ctypes.create_string_buffer(4096)
buf2 = ctypes.create_string_buffer(4096)
res = {}

# A sibling process to aim at: same uid, same sandbox.
child = subprocess.Popen(["sleep", "60"])
try:
    pidfd = os.pidfd_open(child.pid)
except OSError:  # gVisor 2022-12 has no pidfd_open: pidfd_getfd then gets -1
    pidfd = -1

class Iov(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local = Iov(ctypes.addressof(buf2), 16)
remote = Iov(ctypes.addressof(buf), 16)

# struct file_handle { u32 handle_bytes; int handle_type; u8 f_handle[]; }
handle = ctypes.create_string_buffer(128)
ctypes.memmove(handle, (120).to_bytes(4, "little"), 4)
mount_id = ctypes.c_int(0)

perf_attr = ctypes.create_string_buffer(128)
ctypes.memmove(perf_attr, (1).to_bytes(4, "little") + (0).to_bytes(4, "little")
               + (128).to_bytes(4, "little"), 12)  # PERF_TYPE_SOFTWARE, cpu-clock, size

ns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
null_fd = os.open("/dev/null", os.O_RDWR)

# Before the probes: one that works (on gVisor: unshare, chroot) changes this process.
res["control_clone_plain"] = "ok" if subprocess.run(["true"]).returncode == 0 else "fail"
res["io_uring_setup"] = sc(425, 1, buf)
res["io_uring_enter"] = sc(426, -1, 0, 0, 0, 0, 0)
res["io_uring_register"] = sc(427, -1, 0, 0, 0)
res["bpf"] = sc(321, 0, buf, 72)
res["keyctl"] = sc(250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
res["add_key"] = sc(248, b"user", b"agentbox", b"x", 1, -2)
res["request_key"] = sc(249, b"user", b"agentbox", 0, 0)
res["perf_event_open"] = sc(298, perf_attr, 0, -1, -1, 0)
res["userfaultfd"] = sc(323, os.O_CLOEXEC | 1)  # UFFD_USER_MODE_ONLY
res["process_vm_readv"] = sc(310, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
res["process_vm_writev"] = sc(311, os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
res["ptrace_attach"] = sc(101, 16, child.pid, 0, 0)
res["ptrace_attach_init"] = sc(101, 16, 1, 0, 0)
res["ptrace_traceme"] = in_child(101, 0, 0, 0, 0)
res["kcmp"] = sc(312, os.getpid(), child.pid, 0, 0, 0)
res["pidfd_getfd"] = sc(438, pidfd, 0, 0)
res["setns"] = sc(308, ns_fd, 0)
res["unshare_user"] = in_child(272, 0x10000000)
res["unshare_mount"] = in_child(272, 0x00020000)
res["unshare_net"] = in_child(272, 0x40000000)
res["clone_newuser"] = sc(56, 0x10000000 | 17, 0, 0, 0, 0)
res["clone3"] = sc(435, buf, 88)
res["name_to_handle_at"] = sc(303, AT_FDCWD, b"/workspace", handle, ctypes.byref(mount_id), 0)
res["open_by_handle_at"] = sc(304, AT_FDCWD, handle, 0)
res["mount"] = sc(165, b"x", b"/tmp", b"tmpfs", 0, 0)
res["umount2"] = sc(166, b"/tmp", 2)
res["pivot_root"] = sc(155, b"/tmp", b"/tmp")
res["chroot"] = in_child(161, b"/tmp")
res["fsopen"] = sc(430, b"tmpfs", 0)
res["fsconfig"] = sc(431, -1, 0, 0, 0, 0)
res["fsmount"] = sc(432, -1, 0, 0)
res["fspick"] = sc(433, AT_FDCWD, b"/tmp", 0)
res["open_tree"] = sc(428, AT_FDCWD, b"/tmp", 1)
res["move_mount"] = sc(429, -1, b"", AT_FDCWD, b"/tmp", 0)
res["mount_setattr"] = sc(442, AT_FDCWD, b"/tmp", 0, 0, 0)
res["kexec_load"] = sc(246, 0, 0, 0, 0)
res["kexec_file_load"] = sc(320, -1, -1, 0, 0, 0)
res["init_module"] = sc(175, 0, 0, b"")
res["finit_module"] = sc(313, -1, b"", 0)
res["delete_module"] = sc(176, b"agentbox-none", 0)
res["reboot"] = sc(169, 0, 0, 0, 0)  # wrong magic numbers: EINVAL if it got through
res["swapon"] = sc(167, b"/nonexistent", 0)
res["swapoff"] = sc(168, b"/nonexistent")
res["acct"] = sc(163, 0)
res["quotactl"] = sc(179, 0, 0, 0, 0)
res["lookup_dcookie"] = sc(212, 0, 0, 0)
res["iopl"] = sc(172, 0)
res["ioperm"] = sc(173, 0, 0, 0)
res["syslog"] = sc(103, 10, 0, 0)  # SYSLOG_ACTION_SIZE_BUFFER
res["settimeofday"] = sc(164, 0, 0)
res["clock_settime"] = sc(227, 0, 0)
res["clock_adjtime"] = sc(305, 0, 0)
res["adjtimex"] = sc(159, buf)  # modes 0: a read-only query
res["vhangup"] = sc(153)
res["personality"] = sc(135, 0xFFFFFFFF)  # query only
res["uselib"] = sc(134, b"/nonexistent")
res["fanotify_init"] = sc(300, 0, 0)
res["quotactl_fd"] = sc(443, -1, 0, 0, 0)
res["nfsservctl"] = sc(180, 0, 0, 0)
res["ioctl_TIOCSTI"] = sc(16, null_fd, 0x5412, buf)
res["ioctl_TIOCSTI_upper_bits"] = sc(16, null_fd, 0x100005412, buf)
res["ioctl_TIOCSTI_all_upper_bits"] = sc(16, null_fd, -0xFFFFFFFF + 0x5412 - 1, buf)
res["ioctl_TIOCLINUX"] = sc(16, null_fd, 0x541C, buf)
res["ioctl_TIOCLINUX_upper_bits"] = sc(16, null_fd, 0xDEAD0000541C, buf)
# Controls: allowed syscalls still reach the kernel (so the probe itself works).
res["control_ioctl_TCGETS"] = sc(16, null_fd, 0x5401, buf)
res["control_getpid"] = sc(39)
child.kill()
print(json.dumps(res))
"""

DENIED_EPERM = [
    "io_uring_setup", "io_uring_enter", "io_uring_register", "bpf", "keyctl", "add_key",
    "request_key", "perf_event_open", "userfaultfd", "process_vm_readv", "process_vm_writev",
    "ptrace_attach", "ptrace_attach_init", "ptrace_traceme", "kcmp", "pidfd_getfd", "setns",
    "unshare_user", "unshare_mount", "unshare_net", "clone_newuser", "name_to_handle_at",
    "open_by_handle_at", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig",
    "fsmount", "fspick", "open_tree", "move_mount", "mount_setattr", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "lookup_dcookie", "iopl", "ioperm", "syslog",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "vhangup", "personality",
    "uselib", "fanotify_init", "quotactl_fd", "nfsservctl", "ioctl_TIOCSTI",
    "ioctl_TIOCSTI_upper_bits", "ioctl_TIOCSTI_all_upper_bits", "ioctl_TIOCLINUX",
    "ioctl_TIOCLINUX_upper_bits",
]  # fmt: skip


# What gVisor's kernel serves itself to a process with no capabilities (runsc 2022-12-19):
# its own io_uring, ptrace, user and mount namespaces and a fake kernel log, each a data
# structure of the Sentry, not a host kernel call. A newer runsc that refuses one: drop it.
SERVED_BY_GVISOR = {
    "io_uring_setup", "ptrace_attach", "ptrace_traceme", "unshare_user", "unshare_mount",
    "clone_newuser", "syslog",
}  # fmt: skip


@pytest.fixture(scope="module")
def syscall_results(tier: str, shared_sandbox: Sandbox, agentbox_home: Path) -> dict[str, str]:
    if tier == "gvisor":
        # A sandbox of its own: after a process used io_uring, this runsc's Sentry may
        # exit a few commands later (test_gvisor_kernel).
        with Sandbox.create(memory="256MiB", disk="128MiB", isolation="gvisor",
                            network="none", home=agentbox_home) as sb:  # fmt: skip
            results: dict[str, str] = run_python(sb, SYSCALL_PROBE)
    else:
        results = run_python(shared_sandbox, SYSCALL_PROBE)
    # The probe is only meaningful if ordinary syscalls work.
    assert results["control_ioctl_TCGETS"] == "ENOTTY", results
    assert results["control_getpid"] == "ok", results
    assert results["control_clone_plain"] == "ok", results
    return results


@pytest.mark.parametrize("probe", DENIED_EPERM)
def test_syscall_is_denied(tier: str, syscall_results: dict[str, str], probe: str) -> None:
    answer = syscall_results[probe]
    if tier == "namespaces":
        assert answer == "EPERM", f"{probe} was not refused: {answer}"
    elif probe in SERVED_BY_GVISOR:
        assert answer == "ok", f"{probe}: gVisor no longer serves it ({answer})"
    else:
        assert answer != "ok", f"{probe} was not refused by gVisor's kernel"


def test_clone3_is_enosys_so_libc_falls_back_to_filtered_clone(
    syscall_results: dict[str, str],
) -> None:
    assert syscall_results["clone3"] == "ENOSYS"


CAPABILITY_SETS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def _capabilities(status: str) -> dict[str, int]:
    """Each set's mask; gVisor's /proc (this runsc) lists no CapAmb: read as empty."""
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    return {name: int(fields.get(name, "0" if name == "CapAmb" else "?"), 16)
            for name in CAPABILITY_SETS}  # fmt: skip


def test_no_capabilities_no_new_privs_seccomp_inside(
    tier: str, shared_sandbox: Sandbox, runtime: Runtime
) -> None:
    status = shared_sandbox.commands.run("cat /proc/self/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert _capabilities(status) == dict.fromkeys(CAPABILITY_SETS, 0)
    if tier == "gvisor":
        # This runsc's /proc lists neither NoNewPrivs nor Seccomp (both set: the spec's
        # noNewPrivileges; gVisor's kernel answers every call, no filter of ours inside).
        slot = runtime.get(shared_sandbox.id).slot
        uid = str(SandboxHost(runtime.home, shared_sandbox.id, slot).host_uid)
        assert fields["Uid"].split() == [uid] * 4 and uid != "0"
        return
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"
    assert fields["Uid"].split() == ["1000"] * 4
    assert fields["Gid"].split() == ["1000"] * 4


def test_no_command_path_keeps_a_capability_in_any_set(shared_sandbox: Sandbox) -> None:
    """On gVisor the agent holds CAP_SYS_ADMIN (each command's PID namespace): none of it,
    not even in the bounding set a file capability could draw from, reaches a command,
    whichever way it starts (one-shot, background, on a terminal, in a shell session)."""
    read = "cat /proc/self/status"
    seen = {
        "one-shot": shared_sandbox.commands.run(read).stdout,
        "pty": shared_sandbox.commands.run(read, pty=True).stdout.replace("\r\n", "\n"),
        "shell": shared_sandbox.shell().run(read).stdout,
    }
    handle = shared_sandbox.commands.start(read)
    assert handle.wait(timeout=60).exit_code == 0
    seen["background"] = handle.read().text
    for path, status in seen.items():
        assert _capabilities(status) == dict.fromkeys(CAPABILITY_SETS, 0), (path, status)


@pytest.mark.parametrize(
    "command",
    [
        "unshare -U true",
        "unshare -r true",
        "unshare -Ur true",
        "unshare -m true",
        "unshare -n true",
        "unshare -p -f true",
    ],
)
def test_unshare_tool_fails(tier: str, shared_sandbox: Sandbox, command: str) -> None:
    if "-U" in command or "-r" in command:
        not_on(tier, "gvisor", "gVisor implements user namespaces in its own kernel: "
               "`unshare -U` works there and no call reaches the host's")  # fmt: skip
    r = shared_sandbox.commands.run(command)
    assert r.exit_code != 0, f"{command!r} worked inside the sandbox: {r.stdout}{r.stderr}"


def test_libc_unshare_newuser_fails(tier: str, shared_sandbox: Sandbox) -> None:
    not_on(tier, "gvisor", "gVisor implements user namespaces in its own kernel")
    result = run_python(
        shared_sandbox,
        "import ctypes, json; libc = ctypes.CDLL(None, use_errno=True);"
        "r = libc.unshare(0x10000000); print(json.dumps([r, ctypes.get_errno()]))",
    )
    assert result == [-1, 1], f"unshare(CLONE_NEWUSER) returned {result}"


def run_without_seccomp(
    runtime: Runtime, sb: Sandbox, tmp_path: Path, *argv: str
) -> subprocess.CompletedProcess[str]:
    """Enter ``sb`` exactly as a command does, but with an allow-everything filter."""
    allow_all = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    filter_file = tmp_path / "allow-all.bpf"
    with filter_file.open("wb") as f:
        allow_all.export_bpf(f)
    runner = runtime.commands(sb.id)
    runner.paths = LaunchPaths(runner.paths.nsexec, filter_file)
    launcher = runner.launcher_argv(list(argv), runner.new_leaf(), None)
    return subprocess.run(
        launcher, env=runner.environment(None), capture_output=True, text=True, timeout=30
    )


def test_nested_user_namespaces_refused_even_without_seccomp(
    tier: str, runtime: Runtime, shared_sandbox: Sandbox, tmp_path: Path
) -> None:
    """Second layer behind the seccomp rule: bubblewrap --disable-userns.

    We enter the sandbox exactly as a command does, but with an allow-everything filter,
    and try to create a user namespace: the sandbox's user namespace limit must refuse it.
    """
    not_on(tier, "gvisor", NO_PROFILE_INSIDE)
    control = run_without_seccomp(
        runtime, shared_sandbox, tmp_path, "python3", "-c", UNSHARE_USERNS
    )
    assert control.returncode == 0, control.stderr
    result = json.loads(control.stdout)
    assert result["seccomp_filters"] == "1", "the launcher should still load our (empty) filter"
    assert result["unshare"] in ("ENOSPC", "EPERM", "EUSERS"), (
        f"a user namespace could be created once seccomp is out of the way: {result}"
    )


UNSHARE_USERNS = r"""
import ctypes, errno, json
libc = ctypes.CDLL(None, use_errno=True)
r = libc.unshare(0x10000000)
lines = open("/proc/self/status").read().splitlines()
filters = [l.split()[1] for l in lines if l.startswith("Seccomp_filters:")][0]
print(json.dumps({"unshare": "ok" if r == 0 else errno.errorcode[ctypes.get_errno()],
                  "seccomp_filters": filters}))
"""


_MOUNT_TMPFS = """
import ctypes, errno, json, os
os.makedirs("/tmp/x", exist_ok=True)
libc = ctypes.CDLL(None, use_errno=True)
r = libc.mount(b"x", b"/tmp/x", b"tmpfs", 0, None)
print(json.dumps("ok" if r == 0 else errno.errorcode[ctypes.get_errno()]))
"""


def test_mount_tmpfs_fails(shared_sandbox: Sandbox) -> None:
    # mount(2) itself: util-linux's mount(8) refuses a non-root user before calling it,
    # so its failure would prove nothing about the sandbox.
    assert run_python(shared_sandbox, _MOUNT_TMPFS) == "EPERM"
    mounts = shared_sandbox.commands.run("cat /proc/self/mountinfo").stdout
    assert " / " in mounts and " /tmp/x " not in mounts


def test_ptrace_attach_to_sibling_fails(tier: str, shared_sandbox: Sandbox) -> None:
    not_on(tier, "gvisor", "gVisor's ptrace is its own, between processes inside its "
           "kernel (SERVED_BY_GVISOR); there is no host process to reach")  # fmt: skip
    script = (
        "import ctypes, json, subprocess, sys;"
        "libc = ctypes.CDLL(None, use_errno=True);"
        "p = subprocess.Popen(['sleep', '60']);"
        "r = libc.ptrace(16, p.pid, 0, 0); e = ctypes.get_errno(); p.kill();"
        "print(json.dumps([r, e]))"
    )
    assert run_python(shared_sandbox, script) == [-1, 1]


TIOCSTI_PROBE = r"""
import ctypes, errno, fcntl, json, os, select, termios
out = {"isatty": os.isatty(0)}
# It must be our controlling terminal, where the kernel itself would allow TIOCSTI.
try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    out["ctty"] = True
except OSError as e:
    out["ctty"] = errno.errorcode[e.errno]
attrs = termios.tcgetattr(0)
attrs[3] &= ~(termios.ICANON | termios.ECHO)
termios.tcsetattr(0, termios.TCSANOW, attrs)
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"X")
    out["tiocsti"] = "ok"
except OSError as e:
    out["tiocsti"] = errno.errorcode[e.errno]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
c = ctypes.create_string_buffer(b"Y")
r = libc.syscall(ctypes.c_long(16), ctypes.c_long(0), ctypes.c_long(0x100005412), c)
out["tiocsti_upper_bits"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
# Whatever was pushed would be waiting in our own input queue now.
ready, _, _ = select.select([0], [], [], 0.2)
out["injected"] = os.read(0, 64).decode() if ready else ""
print(json.dumps(out))
"""


def test_tiocsti_on_controlling_pty_is_denied(tier: str, shared_sandbox: Sandbox) -> None:
    r = shared_sandbox.commands.run(["python3", "-c", TIOCSTI_PROBE], pty=True, timeout=30)
    assert r.exit_code == 0, r.stdout
    out: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    if tier == "gvisor":  # the Sentry's own pty, with no /dev/tty name inside; refused
        assert out["isatty"] is True, out
        assert out["tiocsti"] != "ok" and out["tiocsti_upper_bits"] != "ok", out
        assert out["injected"] == "", f"characters were injected into the terminal: {out}"
        return
    assert out["isatty"] is True and out["ctty"] is True, out
    assert out["tiocsti"] == "EPERM", out
    assert out["tiocsti_upper_bits"] == "EPERM", out
    assert out["injected"] == "", f"characters were injected into the terminal: {out}"


# Foreign-ABI entry points into the same kernel functions: 32-bit ``int 0x80`` (this kernel
# has IA32 emulation) and x32 numbers (bit 30). A filter written for x86_64 numbers only
# must not let them through. Each call runs in a child, since the filter may kill it.
COMPAT_CALL = r"""
import ctypes, errno, mmap, sys
abi, nr, a, b, c = sys.argv[1], *(int(x, 0) for x in sys.argv[2:6])
if abi == "i386":
    le = lambda v: (v & 0xFFFFFFFF).to_bytes(4, "little")
    # push rbx; mov eax/ebx/ecx/edx; int 0x80; movsxd rax, eax; pop rbx; ret
    code = (b"\x53\xb8" + le(nr) + b"\xbb" + le(a) + b"\xb9" + le(b) + b"\xba" + le(c)
            + b"\xcd\x80\x48\x63\xc0\x5b\xc3")
    buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    buf.write(code)
    r = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))()
    print("ok" if r >= 0 else errno.errorcode.get(-r, str(r)))
else:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    r = libc.syscall(ctypes.c_long(0x40000000 | nr), ctypes.c_long(a), ctypes.c_long(b),
                     ctypes.c_long(c))
    print("ok" if r >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
"""

COMPAT_CALLS = {
    # name: (abi, number, args): each would succeed for an unconfined process
    "i386-keyctl": ("i386", 288, (0, -3, 0)),
    "i386-unshare-newuser": ("i386", 310, (0x10000000, 0, 0)),
    "i386-ptrace-traceme": ("i386", 26, (0, 0, 0)),
    "i386-userfaultfd": ("i386", 374, (1, 0, 0)),
    "i386-personality": ("i386", 136, (0xFFFFFFFF, 0, 0)),
    "x32-keyctl": ("x32", 250, (0, -3, 0)),
    "x32-unshare-newuser": ("x32", 272, (0x10000000, 0, 0)),
    "i386-socket-vsock": ("i386", 359, (40, 1, 0)),  # AF_VSOCK, SOCK_STREAM
    "x32-socket-vsock": ("x32", 41, (40, 1, 0)),
}


@pytest.mark.parametrize("call", sorted(COMPAT_CALLS))
def test_foreign_abi_syscalls_are_blocked(tier: str, shared_sandbox: Sandbox, call: str) -> None:
    abi, number, args = COMPAT_CALLS[call]
    shared_sandbox.files.write("/tmp/compat_call.py", COMPAT_CALL.encode())
    r = shared_sandbox.commands.run(
        ["python3", "/tmp/compat_call.py", abi, str(number), *(str(a) for a in args)]
    )
    outcome = r.stdout.strip() or f"signal {r.signal}"
    assert outcome != "ok", f"{call} got past the seccomp filter"
    if tier == "gvisor":  # the Sentry decodes the call itself: whatever it says, not ok
        return
    assert r.signal == 31 or outcome in ("EPERM", "ENOSYS"), f"{call}: {outcome} {r.stderr}"


# Every address family the kernel knows (and beyond), each with every common socket type,
# plus netlink protocols and 64-bit spellings the kernel would truncate to an int.
SOCKET_PROBE = r"""
import ctypes, errno, json, socket
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def sc(nr, family, kind, proto):
    ctypes.set_errno(0)
    fds = (ctypes.c_int * 2)()
    r = libc.syscall(ctypes.c_long(nr), ctypes.c_long(family), ctypes.c_long(kind),
                     ctypes.c_long(proto), fds)
    if r < 0:
        return errno.errorcode.get(ctypes.get_errno(), "?")
    libc.close(r if nr == 41 else fds[0])
    return "ok"

def first_ok(nr, family, proto=0):
    # "ok" if any type works, else the errno of the last one
    out = "?"
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET, socket.SOCK_RAW):
        out = sc(nr, family, kind, proto)
        if out == "ok":
            break
    return out

res = {"socket": {}, "socketpair": {}, "netlink": {}, "wide": {}}
for family in range(64):
    res["socket"][family] = first_ok(41, family)
    res["socketpair"][family] = first_ok(53, family)
for proto in range(32):
    res["netlink"][proto] = sc(41, 16, socket.SOCK_RAW, proto)
res["wide"]["vsock"] = first_ok(41, (1 << 32) | 40)
res["wide"]["unix"] = first_ok(41, (1 << 32) | 1)
res["wide"]["netlink_uevent"] = sc(41, 16, socket.SOCK_RAW, (1 << 32) | 15)
res["wide"]["netlink_route_upper"] = sc(41, 16 | (1 << 63), socket.SOCK_RAW, 0)
res["ifaddrs"] = len(socket.if_nameindex())
print(json.dumps(res))
"""

ALLOWED_FAMILIES = {1, 2, 10, 16}  # AF_UNIX, AF_INET, AF_INET6, AF_NETLINK
AF_VSOCK, NETLINK_KOBJECT_UEVENT = 40, 15


@pytest.fixture(scope="module")
def socket_results(shared_sandbox: Sandbox) -> dict[str, Any]:
    results: dict[str, Any] = run_python(shared_sandbox, SOCKET_PROBE)
    return results


def test_socket_families_outside_the_allowlist_are_refused(
    tier: str,
    socket_results: dict[str, Any],
) -> None:
    for call in ("socket", "socketpair"):
        refused = {
            int(f): e for f, e in socket_results[call].items() if int(f) not in ALLOWED_FAMILIES
        }
        # gVisor's kernel answers in its own words (ESOCKTNOSUPPORT for AF_PACKET pairs).
        wrong = {f: e for f, e in refused.items()
                 if e == "ok" or (tier == "namespaces" and e != "EAFNOSUPPORT")}  # fmt: skip
        assert not wrong, f"{call}() of these families got past the filter: {wrong}"


def test_allowed_socket_families_still_work(socket_results: dict[str, Any]) -> None:
    for family in ALLOWED_FAMILIES:
        assert socket_results["socket"][str(family)] == "ok", (family, socket_results)
    assert socket_results["socketpair"]["1"] == "ok"  # AF_UNIX, what programs use it for
    assert socket_results["netlink"]["0"] == "ok"  # NETLINK_ROUTE
    assert socket_results["ifaddrs"] >= 1  # if_nameindex() talks NETLINK_ROUTE


def test_netlink_protocols_other_than_route_are_refused(
    tier: str, socket_results: dict[str, Any]
) -> None:
    # gVisor's kernel has its own NETLINK_KOBJECT_UEVENT socket (it never says a thing).
    served = {"0", str(NETLINK_KOBJECT_UEVENT)} if tier == "gvisor" else {"0"}
    wrong = {
        p: e
        for p, e in socket_results["netlink"].items()
        if p not in served and e != "EPROTONOSUPPORT"
    }
    assert not wrong, f"netlink protocols got past the filter: {wrong}"


def test_64_bit_spellings_of_families_and_protocols_are_refused(
    tier: str,
    socket_results: dict[str, Any],
) -> None:
    wide = socket_results["wide"]
    if tier == "gvisor":
        # The Sentry truncates to an int as Linux does, and serves AF_UNIX and netlink
        # inside; AF_VSOCK, the family that would reach the host, stays refused.
        assert wide["vsock"] == "EAFNOSUPPORT", wide
        return
    assert wide == {
        "vsock": "EAFNOSUPPORT",
        "unix": "EAFNOSUPPORT",
        "netlink_uevent": "EPROTONOSUPPORT",
        "netlink_route_upper": "EAFNOSUPPORT",
    }, wide


def test_refused_families_are_the_filters_doing(
    tier: str, runtime: Runtime, shared_sandbox: Sandbox, tmp_path: Path
) -> None:
    """AF_VSOCK (not namespaced: the hypervisor and host listeners) and netlink uevents work
    in the same sandbox without the filter, so the refusals above are not this kernel's."""
    not_on(tier, "gvisor", NO_PROFILE_INSIDE)
    r = run_without_seccomp(runtime, shared_sandbox, tmp_path, "python3", "-c", SOCKET_PROBE)
    assert r.returncode == 0, r.stderr
    unfiltered = json.loads(r.stdout.strip().splitlines()[-1])
    assert unfiltered["socket"][str(AF_VSOCK)] == "ok", unfiltered["socket"]
    assert unfiltered["netlink"][str(NETLINK_KOBJECT_UEVENT)] == "ok", unfiltered["netlink"]
