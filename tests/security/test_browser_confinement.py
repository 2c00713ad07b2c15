"""The browser runs inside the sandbox, exactly as confined as any command.

``agentbox-nsexec enter --keep-fds N`` is the one new way for a host fd to reach a
sandbox: fds 3..3+N-1, which Playwright's DevTools pipe occupies. A command started
that way holds only stdio and those fds, and only if each is a pipe or a connected unix
stream socket; everything else about its confinement (uid, capabilities, no_new_privs,
seccomp, namespaces, cgroups) is identical to the sandbox's init. Then the real thing:
Chromium launched by Playwright through the gateway's launcher runs as the sandbox's uid,
in its cgroup (a leaf of its own), its namespaces and seccomp filter, behind its proxy,
and dies with the sandbox.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import socket
import stat
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from secprobe import host_uid

from agentbox import Sandbox
from agentbox.browser.launch import DISABLED_FEATURES, REQUIRED_FLAGS
from agentbox.browser.manager import CHROMIUM, BrowserConfig, BrowserManager, NavigationFailed
from agentbox.network import plane
from agentbox.runtime.runtime import Runtime
from browserkit import chromium_pids, leaf_pids, require_browser
from hostres import confinement, pids_with_cmdline, proc_cgroups, seccomp_filters, wait_for
from nettopo import UPSTREAM_A, internet

PAGE = "data:text/html,<title>Inside</title><h1>confined</h1>"


def _enter(
    runtime: Runtime, sb: Sandbox, argv: list[str], fds: list[int], keep: int
) -> tuple[int, int, int]:
    """Start ``argv`` with ``nsexec enter --keep-fds keep`` and ``fds`` as fds 3, 4, ...;
    returns (pid, stdout read end, stderr read end)."""
    runner = runtime.commands(sb.id)
    full = runner.launcher_argv(argv, runner.new_leaf(), None)
    full = [full[0], "enter", "--keep-fds", str(keep), *full[2:]]
    # Sources first moved out of the way, so a dup2 to 3 or 4 cannot clobber another.
    high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 100) for fd in fds]
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, out_w, 1),
        (os.POSIX_SPAWN_DUP2, err_w, 2),
    ]
    actions += [(os.POSIX_SPAWN_DUP2, fd, 3 + i) for i, fd in enumerate(high)]
    try:
        pid = os.posix_spawn(full[0], full, runner.environment(None), file_actions=actions)
    finally:
        for fd in (out_w, err_w, *high):
            os.close(fd)
    return pid, out_r, err_r


def _finish(pid: int, out_r: int, err_r: int) -> tuple[int, str, str]:
    with os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
        stdout, stderr = out.read().decode(), err.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, stderr


def test_keep_fds_command_holds_only_stdio_and_the_kept_fds(
    runtime: Runtime, shared_sandbox: Sandbox
) -> None:
    mine, theirs = socket.socketpair()
    pipe_r, pipe_w = os.pipe()
    try:
        script = "ls -l /proc/self/fd; echo ping >&3; read line <&4; echo got=$line"
        pid, out_r, err_r = _enter(runtime, shared_sandbox, ["bash", "-c", script],
                                   [theirs.fileno(), pipe_r], 2)  # fmt: skip
        theirs.close()
        os.close(pipe_r)
        mine.settimeout(30)
        assert mine.recv(100) == b"ping\n"  # the sandbox writes to the host end: it works
        os.write(pipe_w, b"pong\n")
        code, stdout, stderr = _finish(pid, out_r, err_r)
    finally:
        mine.close()
        os.close(pipe_w)
    assert code == 0, stderr
    fds = {}
    for line in stdout.splitlines():
        if " -> " in line:
            left, target = line.split(" -> ", 1)
            fds[left.split()[-1]] = target
    own = {n for n, t in fds.items() if t.startswith("/proc/")}  # ls's own directory fd
    assert len(own) == 1, fds
    assert set(fds) - own == {"0", "1", "2", "3", "4"}, fds
    assert fds["3"].startswith("socket:") and fds["4"].startswith("pipe:"), fds
    assert "got=pong" in stdout


def test_keep_fds_command_is_confined_like_init(runtime: Runtime, shared_sandbox: Sandbox) -> None:
    sb = shared_sandbox
    argv = ["sleep", f"{900 + secrets.randbelow(10_000)}.{secrets.randbelow(1000):03d}"]
    a, b = socket.socketpair()
    c, d = socket.socketpair()
    pid, out_r, err_r = _enter(runtime, sb, argv, [a.fileno(), c.fileno()], 2)
    try:
        uid = host_uid(sb)
        target = wait_for(lambda: pids_with_cmdline(" ".join(argv), uid), 15, "the sleep")[0]
        init_pid = sb.info().init_pid
        assert init_pid is not None
        assert confinement(target) == confinement(init_pid)
        status = confinement(target)
        for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
            assert int(status[cap], 16) == 0, status
        assert status["NoNewPrivs"] == "1" and status["Seccomp"] == "2"
        assert status["Uid"].split() == [str(uid)] * 4
        profile = runtime.paths.seccomp.read_bytes()
        assert seccomp_filters(target) == [profile]
        assert proc_cgroups(target)["unified"].startswith(f"/agentbox/{sb.id}/c")
        assert sorted(os.listdir(f"/proc/{target}/fd")) == ["0", "1", "2", "3", "4"]
        os.kill(target, 9)
    finally:
        for s in (a, b, c, d):
            s.close()
        _finish(pid, out_r, err_r)


def _refused(runtime: Runtime, sb: Sandbox, fds: list[int], keep: int, why: str) -> None:
    pid, out_r, err_r = _enter(runtime, sb, ["echo", "RAN"], fds, keep)
    code, stdout, stderr = _finish(pid, out_r, err_r)
    assert code == 125 and "RAN" not in stdout, (code, stdout, stderr)
    assert why in stderr, stderr


@pytest.mark.parametrize("kind", ["directory", "file", "inet", "unconnected", "datagram"])
def test_keep_fds_refuses_anything_but_a_pipe_or_connected_unix_stream(
    runtime: Runtime, shared_sandbox: Sandbox, kind: str
) -> None:
    """A host directory or file fd would be a way out of the mount namespace; a socket
    that can still be (re)connected reaches the host's network or abstract sockets."""
    closers: list[object] = []
    if kind == "directory":
        fd = os.open("/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    elif kind == "file":
        fd = os.open("/etc/hostname", os.O_RDONLY | os.O_CLOEXEC)
    else:
        family, type_ = {
            "inet": (socket.AF_INET, socket.SOCK_STREAM),
            "unconnected": (socket.AF_UNIX, socket.SOCK_STREAM),
            "datagram": (socket.AF_UNIX, socket.SOCK_DGRAM),
        }[kind]
        if kind == "datagram":
            s, peer = socket.socketpair(family, type_)
            closers.append(peer)
        else:
            s = socket.socket(family, type_)
        closers.append(s)
        fd = s.fileno()
    ok_r, ok_w = os.pipe()
    try:
        _refused(runtime, shared_sandbox, [ok_r, fd], 2, "fd 4 is not a pipe or a connected")
    finally:
        for fdn in (ok_r, ok_w):
            os.close(fdn)
        if not closers:
            os.close(fd)
        for c in closers:
            c.close()  # type: ignore[attr-defined]


def test_keep_fds_refuses_a_missing_fd(runtime: Runtime, shared_sandbox: Sandbox) -> None:
    r, w = os.pipe()
    try:
        _refused(runtime, shared_sandbox, [r], 2, "fd 4 is not open")
    finally:
        os.close(r)
        os.close(w)


# Chromium, launched by Playwright through the launcher ----------------------------------
@pytest.fixture
def browser_box(runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    require_browser()
    network = {"mode": "allowlist", "allow": ["allowed.test"], "hosts": {}}
    sb = Sandbox.create(memory="1GiB", disk="512MiB", network=network, home=agentbox_home)
    try:
        yield sb
    finally:
        if runtime.store.get(sb.id) is not None:
            sb.kill()


def test_chromium_runs_inside_the_sandbox_and_dies_with_it(
    runtime: Runtime, browser_box: Sandbox
) -> None:
    sb = browser_box
    manager = BrowserManager(runtime, BrowserConfig())
    try:
        opened = manager.open(sb.id, PAGE, None, 60, 1000)
        assert opened["title"] == "Inside" and "confined" in opened["text"]
        leaf = manager.leaf(sb.id)
        assert leaf is not None
        pids = leaf_pids(sb.id, leaf)
        uid = host_uid(sb)
        chromium = chromium_pids(uid)
        assert chromium and set(chromium) <= set(pids), (chromium, pids)
        init_pid = sb.info().init_pid
        assert init_pid is not None
        init = confinement(init_pid)
        for pid in pids:  # every process of the browser: the sandbox's own confinement
            assert confinement(pid) == init, f"browser process {pid} is confined differently"
            cgroups = proc_cgroups(pid)
            assert cgroups["unified"] == f"/agentbox/{sb.id}/{leaf}", cgroups
            if runtime.layout.mode == "hybrid":
                for ctrl in ("memory", "pids", "cpu"):
                    assert cgroups[ctrl] == proc_cgroups(init_pid)[ctrl], (ctrl, cgroups)
        main = min(chromium)  # the browser process: the first one started
        profile = runtime.paths.seccomp.read_bytes()
        assert seccomp_filters(main) == [profile]
        args = Path(f"/proc/{main}/cmdline").read_bytes().split(b"\0")
        args_text = [a.decode() for a in args if a]
        assert args_text[0] == CHROMIUM
        for flag in REQUIRED_FLAGS:
            assert flag in args_text, (flag, args_text)
        features = [a for a in args_text if a.startswith("--disable-features=")]
        assert len(features) == 1, features  # one list: Chromium keeps only the last
        assert set(DISABLED_FEATURES) <= set(features[0].partition("=")[2].split(","))
        address = runtime.net.proxy_address
        proxy = f"--proxy-server=http://{address}:{plane.EXPLICIT_PORT}"
        assert proxy in args_text
        assert any(a.startswith("--user-data-dir=/tmp/.agentbox-browser-") for a in args_text)
        # Its DevTools pipe is the only thing it got from the host besides stdio.
        for fd in ("3", "4"):
            assert stat.S_ISSOCK(os.stat(f"/proc/{main}/fd/{fd}").st_mode)
    finally:
        sb.kill()  # the sandbox ends while the browser is open
    wait_for(lambda: not [p for p in pids if os.path.exists(f"/proc/{p}")], 15,
             "every browser process to die with the sandbox")  # fmt: skip
    # The gateway's side notices: the handle fails with a next step, nothing hangs.
    with pytest.raises(Exception) as failure:
        manager.snapshot(sb.id, opened["handle"], 10, 1000, False)
    assert "sandbox" in str(failure.value).lower()
    started = time.monotonic()
    manager.close_all()
    assert time.monotonic() - started < 30


def test_a_sandbox_without_network_gets_no_proxy_and_reaches_nothing(
    runtime: Runtime, agentbox_home: Path, tmp_path: Path
) -> None:
    require_browser()
    sb = Sandbox.create(memory="1GiB", disk="512MiB", network="none", home=agentbox_home)
    manager = BrowserManager(runtime, BrowserConfig())
    try:
        opened = manager.open(sb.id, PAGE, None, 60, 1000)
        leaf = manager.leaf(sb.id)
        assert leaf is not None
        main = min(chromium_pids(host_uid(sb)))
        assert b"--proxy-server" not in Path(f"/proc/{main}/cmdline").read_bytes()
        # An address the host reaches (a test namespace's web server), not a name: a
        # name no resolver knows fails whatever the network, and proves nothing.
        with internet(tmp_path) as world:
            with urllib.request.urlopen(f"http://{UPSTREAM_A}/", timeout=10) as answer:
                assert answer.status == 200  # the control: from the host it answers
            before = world.seen()
            with pytest.raises(NavigationFailed) as failed:
                manager.open(sb.id, f"http://{UPSTREAM_A}/", opened["handle"], 20, 1000)
            assert "NAME_NOT_RESOLVED" not in str(failed.value), failed.value
            assert world.seen() == before, "the sandbox's page reached the upstream"
    finally:
        manager.close_all()
        sb.kill()
