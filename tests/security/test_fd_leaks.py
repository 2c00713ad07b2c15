"""Attack 4 — leaked file descriptors and magic-link working directories (CVE-2024-21626).

Covers: a command (pipes, pty, background, on a terminal or with a closable stdin, shell
session, the CLI's plain exec) holds only fds 0-2; the init
holds none (checked inside and from the host); no process of the sandbox holds a
directory fd on a host path; ``cwd=/proc/self/fd/N`` for N = 3..15 either fails cleanly
or (if it existed) stays inside; ``cwd=/proc/1/cwd`` and ``cwd=/proc/1/root`` stay inside
the sandbox; a background command cannot climb from its output fd to the host directory
that holds it.
"""

from __future__ import annotations

import os
import stat

import pytest
from secprobe import host_uid, not_on

from agentbox import Sandbox
from agentbox.errors import AgentboxError
from hostres import SandboxCgroups, proc_uid

# The shell's glob holds fd 3 (the directory it lists) like ls would; not ls itself:
# coreutils 9's statx flags fail on the gvisor tier's runsc (docs/design.md).
FD_PROBE = 'for f in /proc/self/fd/*; do echo "${f##*/}"; done'


def _fds(listing: str) -> set[str]:
    return set(listing.split())


def test_command_holds_only_stdio(tier_sandbox: Sandbox) -> None:
    assert _fds(tier_sandbox.commands.run(FD_PROBE).stdout) == {"0", "1", "2", "3"}


def test_cli_plain_exec_command_holds_only_stdio(shared_sandbox: Sandbox) -> None:
    """The CLI's light path (``runtime.quick_exec``: its own spawn, SQLite open before)."""
    import subprocess
    import sys

    agentbox = os.path.join(os.path.dirname(sys.executable), "agentbox")
    done = subprocess.run([agentbox, "sandbox", "exec", shared_sandbox.id, "--", "sh", "-c",
                           FD_PROBE], capture_output=True, timeout=60, check=True)  # fmt: skip
    assert _fds(done.stdout.decode()) == {"0", "1", "2", "3"}


def test_pty_command_holds_only_stdio(tier_sandbox: Sandbox) -> None:
    r = tier_sandbox.commands.run(FD_PROBE, pty=True)
    assert _fds(r.stdout) == {"0", "1", "2", "3"}


def test_session_command_holds_only_stdio(tier_sandbox: Sandbox) -> None:
    shell = tier_sandbox.shell()
    try:
        assert _fds(shell.run(FD_PROBE).stdout) == {"0", "1", "2", "3"}
    finally:
        shell.close()


def test_background_command_holds_only_stdio(tier_sandbox: Sandbox) -> None:
    handle = tier_sandbox.commands.start(
        f"{FD_PROBE}; echo; echo /proc/self/fd/1/../*; cd /proc/self/fd/1/.. 2>&1; true"
    )
    info = handle.wait(timeout=30)
    assert not info.running
    out = handle.read().text
    fds, _, climb = out.partition("\n\n")
    assert _fds(fds) == {"0", "1", "2", "3"}
    # fd 1 is the host-side output file: a file, never a way into its directory.
    assert "stdout" not in climb and "exit" not in climb and "meta.json" not in climb, climb


def test_terminal_and_stdin_processes_hold_only_stdio(tier_sandbox: Sandbox, tier: str) -> None:
    """A process on a terminal gets the slave end only (the daemon keeps the master), a
    process with a closable stdin the FIFO's read end only (the launcher keeps the write
    end); a command started while both live inherits neither."""
    not_on(tier, "gvisor", "background processes on a terminal and closing a process's "
           "stdin are tier_unsupported there (docs/design.md, the feature table)")  # fmt: skip
    terminal = tier_sandbox.commands.start(
        "ls -1 /proc/self/fd; readlink /proc/self/fd/0; read x", pty=(80, 24)
    )
    held = tier_sandbox.commands.start(
        "ls /proc/self/fd; stat -L -c %F /proc/self/fd/0; cat", stdin=True
    )
    assert _fds(tier_sandbox.commands.run(FD_PROBE).stdout) == {"0", "1", "2", "3"}
    terminal.send_stdin("\n")
    held.close_stdin()
    assert terminal.wait(timeout=30).exit_code == 0 and held.wait(timeout=30).exit_code == 0
    *fds, tty = terminal.read().text.split()
    assert set(fds) == {"0", "1", "2", "3"} and tty.startswith("/dev/pts/"), fds
    assert held.read().text.split() == ["0", "1", "2", "3", "fifo"]


def test_init_holds_no_fds(tier_sandbox: Sandbox, tier: str) -> None:
    if tier == "namespaces":  # on gvisor the recorded pid is the Sentry's, a host process
        init_pid = tier_sandbox.info().init_pid
        assert os.listdir(f"/proc/{init_pid}/fd") == [], "the init kept file descriptors open"
    # Inside, the init is not dumpable: its fd table cannot even be listed.
    r = tier_sandbox.commands.run("for f in /proc/1/fd/*; do test -e $f && echo $f; done")
    if tier == "namespaces":
        assert r.stdout.strip() == "", r.stdout
        return
    # gVisor lists it: the exec agent (PID 1) holds exactly its listening socket, and
    # nothing inside can open it to take the agent's connections.
    assert r.stdout.split() == ["/proc/1/fd/3"], r.stdout
    grab = "import os\ntry: os.open('/proc/1/fd/3', os.O_RDWR)\nexcept OSError as e: print(e.errno)"
    assert tier_sandbox.commands.run(["python3", "-c", grab]).stdout.strip() == "6"  # ENXIO


def test_no_sandbox_process_holds_a_host_directory(tier_sandbox: Sandbox, tier: str) -> None:
    """From the host: every fd of every sandbox process (launchers, which are host root and
    outside the sandbox's pid namespace, excepted) is a pipe, tty, socket, device or a
    regular file; a directory fd would be a way out of the mount namespace."""
    not_on(tier, "gvisor", "the sandbox's processes are not host processes (they live in "
           "the Sentry); the Gofer holds the tree's directories by design, and the cwd "
           "escapes below run on this tier")  # fmt: skip
    handle = tier_sandbox.commands.start("sleep 30")
    try:
        tier_sandbox.commands.run("true")
        uid = host_uid(tier_sandbox)
        procs = [p for p in SandboxCgroups(tier_sandbox.id).procs() if proc_uid(p) == uid]
        assert procs, "no sandbox processes found"
        for pid in procs:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode
                except FileNotFoundError:
                    continue
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                assert not stat.S_ISDIR(mode), f"pid {pid} holds directory fd {fd} -> {target}"
    finally:
        handle.kill()


@pytest.mark.parametrize("fd", range(3, 16))
def test_cwd_through_proc_self_fd_stays_inside(tier_sandbox: Sandbox, fd: int) -> None:
    try:
        r = tier_sandbox.commands.run("pwd -P; ls -A ..", cwd=f"/proc/self/fd/{fd}")
    except AgentboxError as e:
        assert "cwd" in e.message or "/proc/self/fd" in e.message
        return
    # It ran: it must be somewhere in the sandbox, never a host directory.
    assert "sandboxes" not in r.stdout and "disk.img" not in r.stdout, r.stdout
    assert "state.db" not in r.stdout and "templates" not in r.stdout, r.stdout


@pytest.mark.parametrize(
    "cwd", ["/proc/1/cwd", "/proc/1/root", "/proc/self/root", "/proc/1/cwd/.."]
)
def test_cwd_through_init_magic_links_stays_inside(tier_sandbox: Sandbox, cwd: str) -> None:
    try:
        r = tier_sandbox.commands.run("stat -c %d:%i . /workspace / ; ls -A / ..", cwd=cwd)
    except AgentboxError as e:  # refusing is fine too
        assert "cwd" in e.message
        return
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.split("\n")
    here, workspace, root = lines[0], lines[1], lines[2]
    assert here in (workspace, root), f"cwd {cwd} resolved outside: {r.stdout}"
    assert "sandboxes" not in r.stdout and "disk.img" not in r.stdout, r.stdout
