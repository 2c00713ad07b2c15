"""Attack 1 — confinement equality: a command entering a live sandbox later must be exactly
as confined as the sandbox's first process.

Joining namespaces with ``setns`` inherits none of the seccomp filter, no_new_privs,
dropped capabilities or cgroups: each must be re-applied. For the init and for commands
started by ``commands.run`` (pipes and pty) and ``commands.start`` (background) we read,
from the host side, uid/gid/groups, all five capability sets, NoNewPrivs, the seccomp mode
and the filter programs themselves (PTRACE_SECCOMP_GET_FILTER), the seven namespaces, the
root directory and the v1 memory/pids/cpu/freezer cgroups, and require them to be equal.

On the gvisor tier (the ``tier`` fixture: every test runs on both) a command is no host
process at all, which is checked from the host; its confinement is read in gVisor's
kernel instead, from its root PID namespace (``runsc exec`` as root, found by its command
line): the sandbox's uid, no group, no capability in any set (the agent's CAP_SYS_ADMIN,
for each command's PID namespace, not even in the bounding set).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
from secprobe import host_uid

from agentbox import Sandbox
from agentbox.runtime.gvisor_host import GvisorHost
from agentbox.runtime.output import CommandResult
from agentbox.runtime.runtime import Runtime
from hostres import (
    confinement,
    pids_with_cmdline,
    proc_cgroups,
    seccomp_filters,
    wait_for,
)

V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
_LIST = (
    'for p in /proc/[0-9]*; do printf "%s %s\\n" "${p#/proc/}" "$(tr "\\0" " " < $p/cmdline)"; done'
)


@pytest.fixture(scope="module")
def shared_sandbox(tier_sandbox: Sandbox) -> Sandbox:
    return tier_sandbox


def _sentry(runtime: Runtime, sb: Sandbox, *argv: str) -> str:
    """``runsc`` with the sandbox's flags; for exec: as root in its root PID namespace."""
    host = GvisorHost(runtime.home, sb.id, sb.info().slot)
    done = subprocess.run(host.runsc_argv(*argv), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _sentry_pids(runtime: Runtime, sb: Sandbox, argv: list[str]) -> list[int]:
    listing = _sentry(runtime, sb, "exec", "--user", "0:0", sb.id, "/bin/sh", "-c", _LIST)
    wanted = " ".join(argv) + " "
    return [int(pid) for pid, _, cmd in (line.partition(" ") for line in listing.splitlines())
            if cmd == wanted]  # fmt: skip


def _pid_of(runtime: Runtime, sb: Sandbox, argv: list[str]) -> int:
    if sb.info().isolation != "gvisor":
        return _host_pid_of(sb, argv)
    pids = wait_for(lambda: _sentry_pids(runtime, sb, argv), 15, f"{argv} to run")
    assert len(pids) == 1, f"expected one {argv} process, found {pids}"
    # The agent's code never runs as a host process on this tier.
    assert not pids_with_cmdline(" ".join(argv)), "a gvisor-tier command is a host process"
    return pids[0]


def _kill(runtime: Runtime, sb: Sandbox, pid: int) -> None:
    if sb.info().isolation != "gvisor":
        os.kill(pid, signal.SIGKILL)
    else:
        _sentry(runtime, sb, "kill", f"--pid={pid}", sb.id, "KILL")


def _assert_confined_in_gvisor(runtime: Runtime, sb: Sandbox, pid: int, how: str) -> None:
    status = _sentry(runtime, sb, "exec", "--user", "0:0", sb.id, "/bin/cat", f"/proc/{pid}/status")
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    uid = str(host_uid(sb))
    assert fields["Uid"].split() == [uid] * 4, f"the {how} command runs as {fields['Uid']}"
    assert fields["Gid"].split() == [uid] * 4
    assert fields["Groups"].strip() == ""
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd"):  # this runsc lists no CapAmb
        assert int(fields[cap], 16) == 0, f"{cap} of the {how} command is {fields[cap]}"


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


def _unique_sleep() -> list[str]:
    # A duration nobody else uses identifies the process among all of the host's.
    return ["sleep", f"{900 + secrets.randbelow(10_000)}.{secrets.randbelow(1000):03d}"]


def _host_pid_of(sb: Sandbox, argv: list[str]) -> int:
    uid = host_uid(sb)
    pids = wait_for(lambda: pids_with_cmdline(" ".join(argv), uid), 15, f"{argv} to run")
    assert len(pids) == 1, f"expected one {argv} process, found {pids}"
    return pids[0]


def _assert_same_confinement(runtime: Runtime, sb: Sandbox, pid: int, how: str) -> None:
    if sb.info().isolation == "gvisor":
        _assert_confined_in_gvisor(runtime, sb, pid, how)
        return
    init_pid = sb.info().init_pid
    assert init_pid is not None
    init, cmd = confinement(init_pid), confinement(pid)
    assert cmd == init, f"a command started by {how} is confined differently from the init"
    # Not merely equal: actually confined.
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(cmd[cap], 16) == 0, f"{cap} of the {how} command is {cmd[cap]}"
    assert cmd["NoNewPrivs"] == "1"
    assert cmd["Seccomp"] == "2"
    assert cmd["Uid"].split() == [str(host_uid(sb))] * 4
    assert cmd["Gid"].split() == [str(host_uid(sb))] * 4
    assert cmd["Groups"] == ""

    # The filter programs themselves, not just their count, are the compiled profile.
    profile = runtime.paths.seccomp.read_bytes()
    assert seccomp_filters(init_pid) == [profile]
    assert seccomp_filters(pid) == [profile], f"the {how} command runs another seccomp filter"

    init_cg, cmd_cg = proc_cgroups(init_pid), proc_cgroups(pid)
    if runtime.layout.mode == "hybrid":  # the limits live in v1 hierarchies
        for ctrl in V1_CONTROLLERS:
            assert init_cg[ctrl] == f"/agentbox/{sb.id}", f"init is outside its {ctrl} cgroup"
            assert cmd_cg[ctrl] == init_cg[ctrl], f"the {how} command escaped the {ctrl} cgroup"
    # v2: the limits sit on /agentbox/ID; the init and each command have a leaf below it.
    assert init_cg["unified"] == f"/agentbox/{sb.id}/init"
    leaf = cmd_cg["unified"].removeprefix(f"/agentbox/{sb.id}/")
    assert "/" not in leaf and leaf[0] in "cp" and leaf != cmd_cg["unified"], cmd_cg["unified"]


def _run_and_compare(
    runtime: Runtime, sb: Sandbox, pool: ThreadPoolExecutor, how: str,
    run: Callable[[list[str]], CommandResult],
) -> None:  # fmt: skip
    argv = _unique_sleep()
    future: Future[CommandResult] = pool.submit(run, argv)
    pid = _pid_of(runtime, sb, argv)
    try:
        _assert_same_confinement(runtime, sb, pid, how)
    finally:
        _kill(runtime, sb, pid)
        result = future.result(timeout=30)
    assert not result.timed_out  # it ended because we killed the very process we checked


def test_command_run_is_confined_like_init(
    runtime: Runtime, shared_sandbox: Sandbox, pool: ThreadPoolExecutor
) -> None:
    sb = shared_sandbox
    _run_and_compare(runtime, sb, pool, "commands.run", lambda a: sb.commands.run(a, timeout=60))


def test_pty_command_is_confined_like_init(
    runtime: Runtime, shared_sandbox: Sandbox, pool: ThreadPoolExecutor
) -> None:
    sb = shared_sandbox
    _run_and_compare(
        runtime, sb, pool, "commands.run(pty=True)",
        lambda a: sb.commands.run(a, timeout=60, pty=True),
    )  # fmt: skip


def test_shell_command_child_is_confined_like_init(
    runtime: Runtime, shared_sandbox: Sandbox, pool: ThreadPoolExecutor
) -> None:
    """A grandchild forked by the shell (not exec'd by the launcher) inherits it all."""
    sb = shared_sandbox
    _run_and_compare(
        runtime, sb, pool, "a shell's child",
        lambda a: sb.commands.run(f"{' '.join(a)}; true", timeout=60),
    )  # fmt: skip


def test_background_command_is_confined_like_init(
    runtime: Runtime, shared_sandbox: Sandbox
) -> None:
    sb = shared_sandbox
    argv = _unique_sleep()
    handle = sb.commands.start(argv)
    try:
        pid = _pid_of(runtime, sb, argv)
        _assert_same_confinement(runtime, sb, pid, "commands.start")
    finally:
        handle.kill()
    if sb.info().isolation == "gvisor":
        wait_for(lambda: not _sentry_pids(runtime, sb, argv), 10, "the background sleep to die")
    else:
        wait_for(lambda: not pids_with_cmdline(" ".join(argv)), 10, "the background sleep to die")
