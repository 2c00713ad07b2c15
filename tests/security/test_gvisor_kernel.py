"""Attacks only the gvisor tier answers differently: the guest kernel is gVisor's.

Covers: kernel-bug-class syscalls (io_uring, userfaultfd, bpf, perf_event_open, keyctl)
are answered by the Sentry, never by the host kernel (on the namespaces tier our seccomp
profile refuses them with EPERM: tests/security/test_syscall_denials.py); the guest's
kernel identity, dmesg and /proc are gVisor's, not the host's; the host processes that
serve a sandbox (Sentry, Gofer) run under runsc's own seccomp filters with no_new_privs
(the host syscall surface docs/design.md measures); no agent process is a host process;
a fork bomb inside is contained while the host keeps spawning processes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import AgentboxError, SandboxError
from agentbox.runtime.gvisor_host import GvisorHost
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.tiers import GVISOR_PIDS_HEADROOM
from hostres import SandboxCgroups

# x86_64 numbers; each one a kernel-bug class with a CVE history on the host kernel.
KERNEL_BUG_CLASSES = {
    "io_uring_setup": 425,
    "userfaultfd": 323,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
}
PROBE = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
for name, nr in {calls}.items():
    rc = libc.syscall(nr, 8, buf, 0, 0, 0) if name != "userfaultfd" else libc.syscall(nr, 0)
    print(name, rc, ctypes.get_errno())
"""


@pytest.fixture(scope="module")
def box(agentbox_home: Path, runtime: Runtime) -> Iterator[Sandbox]:
    sb = Sandbox.create(memory="256MiB", disk="64MiB", isolation="gvisor",
                        network="none", home=agentbox_home)  # fmt: skip
    try:
        yield sb
    finally:
        sb.kill()


def test_kernel_bug_class_syscalls_are_answered_by_gvisor(agentbox_home: Path) -> None:
    """In a sandbox of its own: after a process used io_uring, this runsc's Sentry may
    exit a few commands later (the sandbox ends; the host is untouched; docs/design.md)."""
    sb = Sandbox.create(memory="256MiB", disk="64MiB", isolation="gvisor", network="none",
                        home=agentbox_home)  # fmt: skip
    try:
        r = sb.commands.run(["python3", "-c", PROBE.format(calls=KERNEL_BUG_CLASSES)])
    finally:
        sb.kill()
    answers = {line.split()[0]: (int(line.split()[1]), int(line.split()[2]))
               for line in r.stdout.splitlines()}  # fmt: skip
    assert set(answers) == set(KERNEL_BUG_CLASSES), r.stdout + r.stderr
    # The Sentry's own answers (runsc 2022-12-19), each unlike our host profile's EPERM
    # but bpf's (gVisor refuses it to a process without CAP_SYS_ADMIN, as Linux does):
    # io_uring is gVisor's implementation, the others are not implemented there.
    assert answers["userfaultfd"] == (-1, errno.ENOSYS), answers
    assert answers["perf_event_open"] == (-1, errno.ENODEV), answers
    assert answers["keyctl"] == (-1, errno.EACCES), answers
    assert answers["bpf"] == (-1, errno.EPERM), answers
    ring, ring_errno = answers["io_uring_setup"]
    assert ring >= 0 or ring_errno == errno.ENOSYS, answers


def test_the_guest_kernel_and_proc_are_gvisors(box: Sandbox) -> None:
    r = box.commands.run("uname -r; dmesg | head -3; cat /proc/sys/kernel/random/boot_id")
    release, *rest = r.stdout.splitlines()
    assert release == "4.4.0" and release != platform.release()
    assert any("gVisor" in line for line in rest), r.stdout
    host_boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert host_boot_id not in r.stdout


def test_the_host_processes_serving_it_are_filtered(box: Sandbox, runtime: Runtime) -> None:
    """Every host process in the sandbox's cgroup is runsc's (Sentry, Gofer, ptrace
    stubs), each under a seccomp filter with no_new_privs: the agent's processes exist
    only inside the Sentry, and what reaches the host kernel is runsc's allow list."""
    box.commands.run("true")
    pids = SandboxCgroups(box.id).procs()
    assert pids
    for pid in pids:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            exe = Path(f"/proc/{pid}/exe").resolve().name
        except (FileNotFoundError, ProcessLookupError):
            continue  # a stub that ended meanwhile
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        assert exe == "runsc", (pid, exe)  # the Sentry, the Gofer and their stubs
        assert fields["Seccomp"].strip() == "2", (pid, exe, fields["Seccomp"])
        assert fields["NoNewPrivs"].strip() == "1", (pid, exe)


def test_a_fork_bomb_is_contained(agentbox_home: Path, runtime: Runtime) -> None:
    """The host keeps spawning processes and the sandbox's cgroup stays under its pids
    limit (plus runsc's headroom). On this tier the limit counts the Sentry's own host
    threads too: a bomb that reaches it can end the whole sandbox (the Sentry cannot make
    a thread), never more (docs/design.md, the gVisor findings)."""

    def host_spawn_seconds() -> float:
        started = time.monotonic()
        subprocess.run(["true"], check=True, timeout=30)
        return time.monotonic() - started

    sb = Sandbox.create(memory="256MiB", disk="64MiB", pids=256, isolation="gvisor",
                        network="none", home=agentbox_home)  # fmt: skip
    try:
        cg = SandboxCgroups(sb.id)
        peak, hits, spawn_times = 0, 0, []
        with ThreadPoolExecutor(max_workers=1) as pool:
            bomb = pool.submit(sb.commands.run, ":(){ :|:& };:; sleep 60", timeout=4)
            while not bomb.done():
                peak = max(peak, cg.pids_current())
                with contextlib.suppress(OSError):  # gone with the sandbox
                    hits = max(hits, cg.pids_limit_hits())
                spawn_times.append(host_spawn_seconds())
                time.sleep(0.02)  # sampling period, not a wait for a condition
            ended = False
            try:
                assert bomb.result().timed_out
            except AgentboxError:  # the sandbox ended with it (above)
                ended = True
        assert peak <= cg.pids_max() == 256 + GVISOR_PIDS_HEADROOM, peak
        # The bomb reached the limit (or ended the sandbox there): else it proved nothing.
        assert hits > 0 or ended, f"the bomb never reached the pids limit (peak {peak})"
        # Sampled for as long as the bomb ran (less when it ended the sandbox at once).
        assert spawn_times and max(spawn_times) < 2.0, spawn_times
        assert host_spawn_seconds() < 2.0
    finally:
        sb.kill()
    assert runtime.store.get(sb.id) is None


def test_a_swapped_agent_socket_is_removed_not_followed(
    box: Sandbox, runtime: Runtime, tmp_path: Path
) -> None:
    """While a restore's agent makes its socket again, its directory is the sandbox
    user's, and a process the restore brought back could swap the socket for a link to
    a host socket (the host's connect follows links). Closing the directory checks: the
    link is removed and the restore refused, never connected to."""
    host = GvisorHost(runtime.home, box.id, runtime.get(box.id).slot)
    bait = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bait.bind(str(tmp_path / "host.sock"))
    bait.listen(1)
    aside = host.agent_socket.with_name("aside.sock")
    os.rename(host.agent_socket, aside)
    try:
        os.symlink(tmp_path / "host.sock", host.agent_socket)
        with pytest.raises(SandboxError, match="replaced its exec agent's socket"):
            host._close_agent_dir()
        assert not host.agent_socket.is_symlink() and not host.agent_socket.exists()
        bait.setblocking(False)
        with pytest.raises(BlockingIOError):
            bait.accept()  # nothing reached the host socket
    finally:
        with contextlib.suppress(FileNotFoundError):
            host.agent_socket.unlink()
        os.rename(aside, host.agent_socket)
        bait.close()
    assert box.commands.run("echo fine").stdout == "fine\n"
