"""Attack 5b — host-side code walking paths the agent controls (confused deputy).

Anything the host opens as root through ``/proc/<init>/root/...`` walks the sandbox's
tree, where the agent owns /workspace, /tmp, /home/user and even /dev (a tmpfs owned by the
sandbox user). An absolute symlink met on such a walk resolves against the *host's*
root. Covers: ``commands.run(pty=True)`` opening the sandbox's pty multiplexer must not
follow a ``/dev/ptmx`` the agent replaced with a symlink to a host file (watched with
inotify: the host file must not even be opened), nor hand the command a pty of the host's;
the file API, which runs as a host thread with only its *fs* uid switched, must not get
more from the sandbox's /proc than the sandbox user: sysctl permissions are checked
against the *effective* uid, so root-only sysctls (/proc/sys is host-global: core_pattern,
tcp_fastopen_key, ...) must stay unreadable and unwritable, directly or via a symlink.
Write probes write back the value already there, so even a successful attack changes
nothing on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import secrets
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox import Sandbox
from agentbox.errors import AgentboxError
from agentbox.runtime.runtime import Runtime

IN_OPEN = 0x20
IN_NONBLOCK = os.O_NONBLOCK


class OpenWatch:
    """Reports whether any process opened ``path`` (inotify IN_OPEN) since creation."""

    def __init__(self, path: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(IN_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0, os.strerror(ctypes.get_errno())
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), IN_OPEN)
        assert wd >= 0, os.strerror(ctypes.get_errno())

    def opened(self) -> bool:
        try:
            events = os.read(self.fd, 65536)
        except BlockingIOError:
            return False
        masks = [struct.unpack_from("iIII", events, i)[1] for i in range(0, len(events), 16)]
        return any(mask & IN_OPEN for mask in masks)

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def host_target() -> Iterator[Path]:
    path = Path("/var/tmp") / f"agentbox-ptmx-target-{secrets.token_hex(6)}"
    path.write_text("host-only\n")
    path.chmod(0o600)  # only host root could open it
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def sb(runtime: Runtime, agentbox_home: Path) -> Iterator[Sandbox]:
    box = Sandbox.create(memory="128MiB", disk="32MiB", home=agentbox_home)
    try:
        yield box
    finally:
        box.kill()


@pytest.mark.parametrize("kind", ["absolute", "relative"])
def test_pty_open_does_not_follow_a_planted_dev_ptmx(
    sb: Sandbox, host_target: Path, kind: str
) -> None:
    link = str(host_target) if kind == "absolute" else f"../../../../..{host_target}"
    r = sb.commands.run(f"rm -f /dev/ptmx && ln -s '{link}' /dev/ptmx && readlink /dev/ptmx")
    assert r.exit_code == 0 and r.stdout.strip() == link, "could not plant the symlink"
    watch = OpenWatch(host_target)
    try:
        with contextlib.suppress(AgentboxError, OSError):  # refusing is fine; following is not
            sb.commands.run("tty", pty=True)
        assert not watch.opened(), (
            f"the host opened {host_target} as root by following the sandbox's /dev/ptmx"
        )
    finally:
        watch.close()
    assert host_target.read_text() == "host-only\n"


def test_pty_is_never_a_host_pty(sb: Sandbox) -> None:
    """/dev/ptmx -> /dev/ptmx (absolute, so the host's own) must not give the command a pty
    of the host's devpts instance."""
    sb.commands.run("rm -f /dev/ptmx && ln -s /dev/pts/../ptmx /dev/ptmx")
    host_ptys_before = set(os.listdir("/dev/pts"))
    try:
        r = sb.commands.run("tty; ls /dev/pts", pty=True)
    except (AgentboxError, OSError):
        return  # refused
    tty = r.stdout.split()[0] if r.stdout.split() else ""
    assert tty.startswith("/dev/pts/"), f"the command has no sandbox pty: {r.stdout!r}"
    assert set(os.listdir("/dev/pts")) == host_ptys_before


@pytest.mark.parametrize(
    "path",
    [
        "/proc/sys/kernel/cad_pid",
        "/proc/sys/vm/mmap_rnd_bits",
        "/proc/sys/net/ipv4/tcp_fastopen_key",
        "/workspace/sysctl-link",
    ],
)
def test_file_api_cannot_read_root_only_sysctls(sb: Sandbox, path: str) -> None:
    sb.commands.run("ln -sfn /proc/sys/kernel/cad_pid /workspace/sysctl-link")
    inside = sb.commands.run(["cat", path])
    assert inside.exit_code != 0, f"{path} is readable by the sandbox user itself"
    with pytest.raises(AgentboxError):
        data = sb.files.read(path)
        pytest.fail(f"the file API read root-only {path} of the host: {data!r}")


@pytest.mark.parametrize(
    ("path", "host_path"),
    [
        ("/proc/sys/kernel/printk_ratelimit", "/proc/sys/kernel/printk_ratelimit"),
        ("/proc/sys/kernel/printk_ratelimit_burst", "/proc/sys/kernel/printk_ratelimit_burst"),
        ("/workspace/sysctl-link", "/proc/sys/kernel/printk_ratelimit"),
    ],
)
def test_file_api_cannot_write_host_sysctls(sb: Sandbox, path: str, host_path: str) -> None:
    """The same attack on /proc/sys/kernel/core_pattern ("|/path/to/agent/file") would run
    an agent's program as host root; we only write back the value already set."""
    sb.commands.run(f"ln -sfn {host_path} /workspace/sysctl-link")
    current = Path(host_path).read_bytes()
    try:
        sb.files.write(path, current)
    except AgentboxError:
        pass
    else:
        pytest.fail(f"the file API wrote the host-global sysctl {host_path} (value unchanged)")
    finally:
        assert Path(host_path).read_bytes() == current


def test_gateway_reads_on_its_event_loop_thread_stay_confined(
    sb: Sandbox, agentbox_home: Path, tmp_path: Path
) -> None:
    """Small fs_read calls run on the gateway's event loop thread, which switches to the
    sandbox user's ids for the read: the read is confined, and the thread is root with all
    its capabilities again afterwards (else every later request would run degraded)."""
    from agentbox.config.settings import GatewaySettings
    from agentbox.gateway.app import create_app
    from agentbox.isolation import syscalls

    settings = GatewaySettings.model_validate({"audit": {"path": str(tmp_path / "a.jsonl")}})
    operator = secrets.token_hex(24)
    app = create_app(settings, operator_token=operator, home=agentbox_home)
    gateway = app.state.parts.gateway
    principal = gateway.tokens.authenticate(operator)
    before = (os.geteuid(), os.getegid(), syscalls.thread_capabilities())
    sb.files.write("/workspace/ok.txt", "fine")

    async def read(path: str) -> dict[str, object]:
        outcome = await gateway.call_tool(principal, "fs_read", {"path": path, "sandbox_id": sb.id})
        return outcome.result

    try:
        assert asyncio.run(read("/workspace/ok.txt"))["content"] == "fine"
        with pytest.raises(AgentboxError):
            data = asyncio.run(read("/proc/sys/kernel/cad_pid"))
            pytest.fail(f"the gateway read a root-only sysctl: {data!r}")
        assert (os.geteuid(), os.getegid(), syscalls.thread_capabilities()) == before
    finally:
        app.state.parts.audit.close()
