"""The rtnetlink requests that give a sandbox its veth, checked against what iproute2
reads back, in a network namespace made here (no packet is sent)."""

from __future__ import annotations

import errno
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from agentbox.network import ports
from agentbox.network.rtnetlink import Route


@pytest.fixture
def netns_pid() -> Iterator[int]:
    proc = subprocess.Popen(["unshare", "--net", "sleep", "300"])
    try:
        # polled, bounded: unshare(1) has made the namespace once its link differs ours
        own = os.readlink("/proc/self/ns/net")
        for _ in range(1000):
            if os.readlink(f"/proc/{proc.pid}/ns/net") != own:
                break
            time.sleep(0.005)
        else:
            pytest.fail("unshare --net made no namespace within 5 s")
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def inside(pid: int, *argv: str) -> str:
    return subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", *argv], capture_output=True, text=True,
        check=True,
    ).stdout  # fmt: skip


def test_veth_addresses_and_route_as_iproute2_reads_them(netns_pid: int) -> None:
    name = "abtest" + secrets.token_hex(3)
    try:
        with Route.here() as host:
            host.add_veth(name, "eth0", netns_pid)
            index = host.index(name)
            host.add_address(index, "10.250.0.0", 31)
            host.set_up(index)
            with pytest.raises(OSError) as again:
                host.add_veth(name, "eth0", netns_pid)
            assert again.value.errno == errno.EEXIST
        shown = subprocess.run(["ip", "-o", "addr", "show", "dev", name], capture_output=True,
                               text=True, check=True).stdout  # fmt: skip
        assert "inet 10.250.0.0/31" in shown
        sock = ports.socket_in_netns(
            netns_pid, socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE
        )
        with Route(sock) as sandbox:
            eth0 = sandbox.index("eth0")
            sandbox.add_address(eth0, "10.250.0.1", 31)
            sandbox.set_up(eth0)
            sandbox.add_default_route("10.250.0.0", eth0)
            with pytest.raises(OSError) as missing:
                sandbox.index(name)  # the host end is not in the sandbox's namespace
            assert missing.value.errno == errno.ENODEV
        assert "inet 10.250.0.1/31" in inside(netns_pid, "ip", "-o", "addr", "show", "dev", "eth0")
        assert inside(netns_pid, "ip", "route").startswith("default via 10.250.0.0 dev eth0")
        assert "state UP" in inside(netns_pid, "ip", "-o", "link", "show", "eth0")
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
