"""bubblewrap starts in the launcher's own mount namespace (``nsexec spawn --view``): it sees
its own sandbox's mounts and the host's system directories, never another sandbox's disk
or root. That keeps its start independent of how many sandboxes are alive (it copies the
namespace it starts in and parses mountinfo once per bind); bench/bench_create_alive.py
measures the effect."""

from __future__ import annotations

from pathlib import Path

from agentbox import Sandbox
from agentbox.isolation import diskpool, initfs
from agentbox.runtime.runtime import Runtime


def _monitor_pid(init_pid: int) -> int:
    """bubblewrap's monitor: the sandbox init's parent, left in the launcher's namespace."""
    stat = Path(f"/proc/{init_pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _mount_points(pid: int | str) -> list[str]:
    lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    return [line.split()[4] for line in lines]


def test_bubblewrap_sees_no_other_sandbox(runtime: Runtime, agentbox_home: Path) -> None:
    first = Sandbox.create(memory="64MiB", disk="64MiB", network="none", home=agentbox_home)
    second = Sandbox.create(memory="64MiB", disk="64MiB", network="none", home=agentbox_home)
    try:
        home = Path(agentbox_home).absolute()
        own, other = (str(home / "sandboxes" / sb.id) for sb in (first, second))
        host = _mount_points("self")
        assert any(m.startswith(own + "/") for m in host)  # both are mounted on the host
        assert any(m.startswith(other + "/") for m in host)
        init_pid = runtime.get(first.id).init_pid
        assert init_pid is not None
        monitor = _monitor_pid(init_pid)
        assert Path(f"/proc/{monitor}/comm").read_text().strip() == "bwrap"
        seen = _mount_points(monitor)
        assert f"{own}/root" in seen and f"{own}/disk" in seen
        assert not [m for m in seen if m.startswith(other)], seen
        assert not [m for m in seen if m.startswith(str(home / "disks"))], seen  # the pool
        # The launcher's root is a tmpfs of its own, not the host's /.
        assert len(seen) < len(host) or len(host) < 20, (seen, host)
        # And the sandbox works as before: its files, its commands.
        first.files.write("/workspace/x", "ok")
        assert first.commands.run("cat /workspace/x").stdout == "ok"
    finally:
        first.kill()
        second.kill()


def test_a_home_under_tmp(tmp_path: Path, host_ready: None) -> None:
    """The launcher's root is a tmpfs it mounts on /tmp (covered only in its namespace), and
    bubblewrap stages on /tmp too: a home below /tmp still launches."""
    home = tmp_path / "home"
    home.mkdir(mode=0o711)
    for parent in (tmp_path, *tmp_path.parents):  # the sandbox uid traverses to its root
        if parent != Path("/"):
            parent.chmod(parent.stat().st_mode | 0o111)
    assert str(home).startswith("/tmp/")
    try:
        sb = Sandbox.create(memory="64MiB", disk="64MiB", network="none", home=home)
        try:
            assert sb.commands.run("echo ok").stdout == "ok\n"
        finally:
            sb.kill()
    finally:  # a throwaway home: its pool and init tmpfs go too (pytest removes the rest)
        diskpool.release(home)
        initfs.release(home)
