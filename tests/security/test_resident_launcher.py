"""Attack 1c — the sandbox's resident launcher (``agentbox-nsexec resident``,
runtime/resident.py): a root process on the host that starts each command of its sandbox.

It must start commands exactly as confined as ``agentbox-nsexec enter`` does; nothing in
the sandbox may see it, reach its socket, signal it, or pass for it; the host side may talk
to it only as host root; a timeout still kills a command's whole tree; and when it is gone,
commands take the old path. Covers: /proc/PID/status (ids, groups, all capability sets,
NoNewPrivs, seccomp mode, signal masks, umask), the filter programs, the seven
namespaces, root, every cgroup, limits, oom_score_adj, environment, cwd and open fds of a
command started each way, with pipes and with a pty; the socket's path, /proc/net/unix
and /proc from inside; ``kill -9 -1`` from inside; a connection from the sandbox's host
uid; a ``setsid`` daemon at a timeout; a launcher killed between commands.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from secprobe import host_uid

from agentbox import Sandbox
from agentbox.errors import InvalidRequest
from agentbox.runtime import quick_exec, resident
from agentbox.runtime.commands import CommandRunner
from agentbox.runtime.output import CommandResult
from agentbox.runtime.runtime import Runtime
from hostres import (
    confinement,
    pids_with_cmdline,
    proc_cgroups,
    proc_status,
    seccomp_filters,
    wait_for,
)

STATUS_EXTRA = ("SigBlk", "SigIgn", "SigCgt", "Umask")


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield executor


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each command went through the resident launcher (a spy on the real call)."""
    seen: list[bool] = []
    real = resident.launch

    def spy(*args: object, **kwargs: object) -> resident.Started | None:
        started = real(*args, **kwargs)  # type: ignore[arg-type]
        seen.append(started is not None)
        return started

    monkeypatch.setattr(resident, "launch", spy)
    return seen


def _runner(runtime: Runtime, sb: Sandbox, use_resident: bool) -> CommandRunner:
    runner = runtime.commands(sb.id)
    runner.uses_resident = use_resident  # type: ignore[misc]
    if use_resident:
        runner.start_resident()
    return runner


def _launcher_pids(runtime: Runtime, sb: Sandbox) -> list[int]:
    procs = runtime.layout.sandbox(sb.id).unified / resident.LEAF / "cgroup.procs"
    try:
        return [int(p) for p in procs.read_text().split()]
    except FileNotFoundError:
        return []


def _state(pid: int) -> dict[str, object]:
    """Everything a command inherits, read from the host; the cgroup leaf's name aside."""
    status = dict(
        line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    cgroups = proc_cgroups(pid)
    leaf = cgroups.pop("unified")
    cwd = os.stat(f"/proc/{pid}/cwd")
    return {
        **confinement(pid),
        **{key: status[key] for key in STATUS_EXTRA},
        "filters": seccomp_filters(pid),
        "cgroups": cgroups,
        "leaf": leaf.rsplit("/", 1)[0] + "/" + leaf.rsplit("/", 1)[1][:1],  # ".../c"
        "limits": Path(f"/proc/{pid}/limits").read_text(),
        "oom_score_adj": Path(f"/proc/{pid}/oom_score_adj").read_text(),
        "environ": sorted(Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")),
        "cwd": (cwd.st_dev, cwd.st_ino),
        "fds": sorted(os.listdir(f"/proc/{pid}/fd")),
    }


def _state_of_command(
    sb: Sandbox, pool: ThreadPoolExecutor, run: Callable[[list[str]], CommandResult]
) -> dict[str, object]:
    argv = ["sleep", f"{900 + secrets.randbelow(10_000)}.{secrets.randbelow(1000):03d}"]
    future: Future[CommandResult] = pool.submit(run, argv)
    pids = wait_for(lambda: pids_with_cmdline(" ".join(argv), host_uid(sb)), 15, "the command")
    assert len(pids) == 1, pids
    try:
        return _state(pids[0])
    finally:
        os.kill(pids[0], signal.SIGKILL)
        assert future.result(timeout=30).exit_code == 128 + signal.SIGKILL


@pytest.mark.parametrize("pty", [False, True], ids=["pipes", "pty"])
def test_a_command_by_the_launcher_is_confined_like_one_by_enter(
    runtime: Runtime,
    shared_sandbox: Sandbox,
    pool: ThreadPoolExecutor,
    launches: list[bool],
    pty: bool,
) -> None:
    sb = shared_sandbox
    by_enter = _runner(runtime, sb, use_resident=False)
    by_launcher = _runner(runtime, sb, use_resident=True)
    env = {"PROBE": "1"}
    old = _state_of_command(sb, pool, lambda a: by_enter.run(a, timeout=60, pty=pty, env=env))
    new = _state_of_command(sb, pool, lambda a: by_launcher.run(a, timeout=60, pty=pty, env=env))
    assert launches == [True], "the second command did not go through the launcher"
    assert new == old
    # Not merely equal: confined (test_confinement.py holds the old path to the init's).
    assert new["CapBnd"] == new["CapEff"] == "0000000000000000"
    assert (new["NoNewPrivs"], new["Seccomp"]) == ("1", "2")
    assert new["filters"] == [runtime.paths.seccomp.read_bytes()]
    assert new["leaf"] == f"/agentbox/{sb.id}/c"


def test_a_new_sandboxs_first_command_goes_through_its_launcher(
    runtime: Runtime, sandbox: Sandbox, launches: list[bool]
) -> None:
    """The create starts the launcher (right after the init joined the cgroups): the first
    command is one clone by it, not an ``enter`` whose cgroup moves wait for the kernel."""
    assert len(_launcher_pids(runtime, sandbox)) == 1, "no launcher before the first command"
    assert sandbox.commands.run("echo first").stdout == "first\n"
    assert launches == [True]


def test_the_sandbox_cannot_see_reach_or_signal_the_launcher(
    runtime: Runtime, shared_sandbox: Sandbox
) -> None:
    sb = shared_sandbox
    _runner(runtime, sb, use_resident=True)
    pids = _launcher_pids(runtime, sb)
    assert len(pids) == 1, pids
    runner = runtime.commands(sb.id)
    path = resident.socket_path(str(runner.host.dir), str(runner.paths.nsexec))
    probe = (
        f"test -e {path} && echo SEEN-PATH; "
        "find / -xdev -type s -name 'launcher*.sock' 2>/dev/null | sed s/^/SEEN-SOCKET:/; "
        "grep -h launcher /proc/net/unix | sed s/^/SEEN-UNIX:/; "
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -o 'nsexec[^ ]* resid[e]nt' "
        "| sed s/^/SEEN-PROC:/; "
        f"kill -0 {pids[0]} 2>/dev/null && echo SEEN-PID; "
        "echo PROBED; kill -9 -1; true"
    )
    result = sb.commands.run(probe, timeout=30)
    # The control: the probe ran to its end (not cut off before looking).
    assert "PROBED" in result.stdout and not result.timed_out, result
    assert "SEEN" not in result.stdout, result.stdout
    # kill -9 -1 took the probe's own shell, not the launcher.
    assert _launcher_pids(runtime, sb) == pids
    assert sb.commands.run("echo ok").stdout == "ok\n"


def test_the_launcher_serves_host_root_only(
    runtime: Runtime, shared_sandbox: Sandbox, tmp_path: Path
) -> None:
    """Even with the socket's mode opened up, the sandbox's own host uid is refused."""
    sb = shared_sandbox
    runner = _runner(runtime, sb, use_resident=True)
    path = resident.socket_path(str(runner.host.dir), str(runner.paths.nsexec))
    marker = f"/workspace/launched-{secrets.token_hex(4)}"
    leaf = runner.new_leaf()
    script = (
        "import os, sys\n"
        "from agentbox.runtime import resident\n"
        "r, w = os.pipe()\n"
        f"started = resident.launch({path!r}, ['touch', {marker!r}], {{}}, '/', False, "
        f"(r, w, w), {runner.cgroup.leaf_dir(leaf)!r})\n"
        "print('refused' if started is None else 'started')\n"
    )
    os.chmod(path, 0o666)
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], user=host_uid(sb), group=host_uid(sb),
            capture_output=True, text=True, timeout=30, env={**os.environ},
        )  # fmt: skip
    finally:
        os.chmod(path, 0o600)
        runner.finish_leaf(leaf)
    assert done.stdout.strip() == "refused", done.stderr
    assert sb.commands.run(["test", "-e", marker]).exit_code == 1


def test_a_timeout_kills_the_whole_tree_of_a_launched_command(
    runtime: Runtime, shared_sandbox: Sandbox, launches: list[bool]
) -> None:
    sb = shared_sandbox
    runner = _runner(runtime, sb, use_resident=True)
    daemon = f"sleep {1000 + secrets.randbelow(10_000)}"
    result = runner.run(f"setsid {daemon} & exec sleep 1000", timeout=1)
    assert launches == [True]
    assert result.timed_out
    assert not pids_with_cmdline(daemon), "a setsid daemon outlived its command's timeout"
    assert runner.cgroup.populated_leaves("c") == []


def test_commands_fall_back_when_the_launcher_is_gone(
    runtime: Runtime, shared_sandbox: Sandbox, launches: list[bool]
) -> None:
    sb = shared_sandbox
    runner = _runner(runtime, sb, use_resident=True)
    (old,) = _launcher_pids(runtime, sb)
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: not _launcher_pids(runtime, sb), 10, "the launcher to end")
    first = runner.run("echo fell back; exit 7")
    second = runner.run("echo launched; exit 8")
    assert (first.stdout, first.exit_code) == ("fell back\n", 7)
    assert (second.stdout, second.exit_code) == ("launched\n", 8)
    # The first found no launcher and started one; the second went through it.
    assert launches == [False, True]
    (new,) = _launcher_pids(runtime, sb)
    assert new != old


def test_the_cli_exec_path_goes_through_the_launcher(
    runtime: Runtime, shared_sandbox: Sandbox, launches: list[bool]
) -> None:
    sb = shared_sandbox
    _runner(runtime, sb, use_resident=True)
    prepared = quick_exec.prepare(sb.id, ["sh", "-c", "echo out; echo err >&2; exit 3"], "cq1")
    assert prepared is not None
    chunks: list[tuple[int, bytes]] = []
    status, _ = quick_exec.run(prepared, None, lambda fd, data: chunks.append((fd, data)))
    assert launches == [True]
    assert status == 3
    assert b"".join(d for fd, d in chunks if fd == 1) == b"out\n"
    assert b"".join(d for fd, d in chunks if fd == 2) == b"err\n"


def test_an_oversized_argv_is_refused_as_enter_refused_it(
    runtime: Runtime, shared_sandbox: Sandbox
) -> None:
    """execve's E2BIG happened on the host (the launcher's exec); with the launcher it
    would happen in the sandbox: the host refuses it first, with the same error."""
    runner = _runner(runtime, shared_sandbox, use_resident=True)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(InvalidRequest, match="too large"):
        runner.run(["echo", "x" * (256 * 1024)])
    with pytest.raises(InvalidRequest, match="too large"):
        runner.run("true", env={"BIG": "x" * (256 * 1024)})
    assert len(os.listdir("/proc/self/fd")) == fds, "a refused command left fds open"


@pytest.mark.parametrize("use_resident", [False, True], ids=["enter", "launcher"])
def test_a_command_ignores_no_signal_its_host_side_starter_ignored(
    runtime: Runtime, shared_sandbox: Sandbox, launches: list[bool], use_resident: bool
) -> None:
    """A gateway started by ``nohup ... &`` ignores SIGHUP, SIGINT and SIGQUIT; the
    commands it starts (each way) must not: an agent's Ctrl-C or ``kill -INT`` of its own
    would do nothing. (Commands by enter inherited them.)"""
    sb = shared_sandbox
    inherited = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in inherited}
    try:
        if use_resident:  # one started now, by a process that ignores them
            for pid in _launcher_pids(runtime, sb):
                os.kill(pid, signal.SIGKILL)
            wait_for(lambda: not _launcher_pids(runtime, sb), 15, "the old launcher to end")
        runner = _runner(runtime, sb, use_resident)
        ignoring = int(proc_status(os.getpid())["SigIgn"], 16)
        assert ignoring & 0b111 == 0b111  # the control: this process ignores all three
        r = runner.run(["grep", "SigIgn", "/proc/self/status"], timeout=60)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert launches == ([True] if use_resident else [])
    assert r.stdout == "SigIgn:\t0000000000000000\n", r
