"""Sandbox networking end to end: a real veth, real nftables rules, the egress daemon, and
upstream servers in a namespace this test creates (nettopo). No packet leaves the host:
every name resolves through the sandbox's static host map, and the always-denied ranges
are proven with nftables counters and by the proxy refusing before it connects."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.audit.log import read_records, verify
from agentbox.egressd import daemon as egressd
from agentbox.network import plane
from agentbox.runtime.runtime import Runtime
from nettopo import UPSTREAM_A, UPSTREAM_B, Internet, internet

HOSTS = {
    "allowed.test": UPSTREAM_A,
    "other.test": UPSTREAM_B,
    "api.wild.test": UPSTREAM_A,
    "rebind.test": "127.0.0.1",
    "private.test": "10.1.2.3",
    "meta.test": "169.254.169.254",
}
ALLOW = ["allowed.test", "*.wild.test", "rebind.test", "private.test", "meta.test"]


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Internet]:
    with internet(tmp_path_factory.mktemp("net")) as world:
        yield world


def _create(
    home: Path, mode: str = "allowlist", isolation: str = "namespaces", **extra: Any
) -> Sandbox:
    network = {"mode": mode, "allow": ALLOW, "hosts": HOSTS, **extra}
    return Sandbox.create(memory="256MiB", disk="64MiB", network=network, home=home,
                          isolation=isolation)  # fmt: skip


@pytest.fixture(scope="module")
def box(net: Internet, agentbox_home: Path, runtime: Runtime, tier: str) -> Iterator[Sandbox]:
    """On each isolation tier: the gvisor one runs in the same netns, veth and rules."""
    sb = _create(agentbox_home, isolation=tier)
    try:
        yield sb
    finally:
        sb.kill()


def _rules_loaded() -> None:
    """Every packet test first proves the drop rules are in place (else a packet to a
    denied range could be routed off the host)."""
    for chain in ("from_sandbox", "forward_guard", "intercept"):
        listed = subprocess.run(
            ["nft", "list", "chain", "inet", plane.TABLE, chain], capture_output=True
        )
        assert listed.returncode == 0, f"nft chain {chain} is missing: {listed.stderr!r}"


def _counter(name: str) -> int:
    out = subprocess.run(
        ["nft", "-j", "list", "counter", "inet", plane.TABLE, name],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    for item in json.loads(out)["nftables"]:
        if "counter" in item:
            return int(item["counter"]["packets"])
    raise AssertionError(f"no counter {name} in {out}")


def _egress(home: Path, sandbox: str) -> list[dict[str, Any]]:
    return [
        r for r in read_records(egressd.audit_path(home), limit=None) if r["sandbox"] == sandbox
    ]


def _curl(sb: Sandbox, *args: str) -> tuple[int, str]:
    r = sb.commands.run(["curl", "-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}",
                         *args])  # fmt: skip
    lines = r.stdout.rsplit("\n", 1)
    return int(lines[-1] or 0), lines[0]


def test_an_allowed_name_is_reachable_through_the_proxy(box: Sandbox, net: Internet) -> None:
    code, body = _curl(box, "http://allowed.test/")
    assert code == 200 and body.startswith("hello from allowed.test"), body
    code, body = _curl(box, "http://api.wild.test/")
    assert code == 200 and "api.wild.test" in body


def test_a_program_ignoring_the_proxy_variables_is_filtered_by_name(
    box: Sandbox, net: Internet
) -> None:
    _rules_loaded()
    code, body = _curl(box, "--noproxy", "*", "--resolve", f"allowed.test:80:{UPSTREAM_A}",
                       "http://allowed.test/")  # fmt: skip
    assert code == 200 and body.startswith("hello from allowed.test"), body
    before = net.seen()
    code, body = _curl(box, "--noproxy", "*", "--resolve", f"other.test:80:{UPSTREAM_B}",
                       "http://other.test/")  # fmt: skip
    assert code == 403 and "other.test" in body, body
    assert net.seen() == before, "the denied request reached the upstream"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://other.test/", "allowlist"),
        (f"http://{UPSTREAM_A}/", "IP literal"),
        ("http://allowed.test:8080/", "port"),
        ("http://rebind.test/", "127.0.0.0/8"),
        ("http://private.test/", "10.0.0.0/8"),
        ("http://meta.test/", "169.254"),
    ],
)
def test_denied_requests_fail_and_are_audited(
    box: Sandbox, net: Internet, agentbox_home: Path, url: str, why: str
) -> None:
    before = net.seen()
    code, body = _curl(box, url)
    assert code == 403, (code, body)
    assert net.seen() == before, "a denied request reached the upstream"
    denied = [r for r in _egress(agentbox_home, box.id) if r["decision"] == "egress_denied"]
    assert any(why.lower() in r["reason"].lower() for r in denied), denied[-3:]


def test_allowed_traffic_is_audited_with_bytes(box: Sandbox, agentbox_home: Path) -> None:
    code, _ = _curl(box, "http://allowed.test/bytes/4096")
    assert code == 200
    # The proxy records an allowed connection when it ends, which may be just after curl
    # has its answer: wait (bounded) for the record.
    deadline = time.monotonic() + 10
    while True:
        allowed = [r for r in _egress(agentbox_home, box.id) if r["decision"] == "egress_allowed"]
        if any(r["host"] == "allowed.test" and r["bytes_out"] >= 4096 for r in allowed):
            break
        assert time.monotonic() < deadline, allowed[-3:]
        time.sleep(0.05)
    assert verify(egressd.audit_path(agentbox_home)).ok


def test_udp_dns_and_icmp_never_leave_the_sandbox_interface(box: Sandbox, net: Internet) -> None:
    _rules_loaded()
    before = _counter("not_tcp")
    r = box.commands.run(
        f"echo query > /dev/udp/{UPSTREAM_A}/53; getent hosts allowed.test; "
        f'python3 -c \'import socket; s=socket.socket(2, 2); s.sendto(b"q", ("{UPSTREAM_B}", 53))\'; '
        f"ping -c 1 -W 1 {UPSTREAM_A}; true"
    )
    assert _counter("not_tcp") >= before + 2, r.stdout + r.stderr
    assert "udp" not in net.seen(), "a UDP packet reached the upstream namespace"


def test_internal_ranges_are_dropped_at_the_sandbox_interface(box: Sandbox) -> None:
    """Metadata, RFC 1918, link-local: counted by nftables as they enter from the sandbox."""
    _rules_loaded()
    before = _counter("denied_range")
    for address in ("169.254.169.254", "10.0.0.1", "192.168.1.1", "172.16.0.1", "100.64.0.1"):
        r = box.commands.run(f"timeout 1 bash -c 'echo > /dev/tcp/{address}/80' 2>&1; true")
        assert "Connection refused" not in r.stdout
    assert _counter("denied_range") >= before + 5


def test_the_host_the_gateway_and_other_sandboxes_are_unreachable(
    box: Sandbox, agentbox_home: Path
) -> None:
    _rules_loaded()
    other = _create(agentbox_home)
    try:
        net = plane.home_net(agentbox_home)
        me, them = net.link(box.info().slot), net.link(other.info().slot)
        targets = [
            f"{me.host_address}/8848",  # the host end of its own link
            f"{them.sandbox_address}/80",  # another sandbox
            f"{them.host_address}/22",
            f"{net.proxy_address}/8848",  # the proxy's address, another port
            f"{plane.HomeNet((net.index + 1) % plane.MAX_HOMES).proxy_address}/3128",  # another home's proxy
        ]
        # The control: the same probe reaches the sandbox's own proxy (its one way out).
        r = box.commands.run(f"timeout 10 bash -c 'echo > /dev/tcp/{net.proxy_address}/3128'"
                             " && echo OPEN")  # fmt: skip
        assert "OPEN" in r.stdout, r.stdout + r.stderr
        before = _counter("denied_range") + _counter("host_address")
        for target in targets:
            r = box.commands.run(f"timeout 2 bash -c 'echo > /dev/tcp/{target}' 2>&1 && echo OPEN")
            assert "OPEN" not in r.stdout, f"{target} is reachable from the sandbox"
            # Dropped, not answered: a refusal would mean the packet reached a host.
            assert "Connection refused" not in r.stdout, f"{target} answered: {r.stdout}"
        # Each was dropped by the sandbox interface's rules (not lost for another reason).
        assert _counter("denied_range") + _counter("host_address") >= before + len(targets)
    finally:
        other.kill()


def test_mode_none_has_only_loopback(agentbox_home: Path, net: Internet, tier: str) -> None:
    sb = Sandbox.create(memory="128MiB", disk="32MiB", network="none", home=agentbox_home,
                        isolation=tier)  # fmt: skip
    try:
        r = sb.commands.run("cat /proc/net/dev; env")
        assert "lo:" in r.stdout, r.stdout  # the control: the interfaces were listed
        assert "eth0" not in r.stdout and "HTTP_PROXY" not in r.stdout
        # curl's 7: it could not connect (no route), not a missing binary or a timeout.
        r = sb.commands.run(["curl", "-sS", "--max-time", "10", f"http://{UPSTREAM_A}/"])
        assert r.exit_code == 7 and not r.timed_out, (r.exit_code, r.stderr)
    finally:
        sb.kill()


def test_open_mode_reaches_any_public_name_but_never_internal_ones(
    agentbox_home: Path, net: Internet, tier: str
) -> None:
    sb = _create(agentbox_home, mode="open", allow=[], isolation=tier)
    try:
        code, body = _curl(sb, "http://other.test/")
        assert code == 200 and body.startswith("hello from other.test")
        code, _ = _curl(sb, "http://meta.test/")
        assert code == 403
    finally:
        sb.kill()


def test_teardown_removes_the_link(agentbox_home: Path, net: Internet) -> None:
    sb = _create(agentbox_home)
    link = plane.home_net(agentbox_home).link(sb.info().slot)
    assert Path(f"/sys/class/net/{link.host_ifname}").exists()
    # nothing arriving from the sandbox is ever routed, whatever the host's ip_forward
    assert Path(f"/proc/sys/net/ipv4/conf/{link.host_ifname}/forwarding").read_text() == "0\n"
    sb.kill()
    assert not Path(f"/sys/class/net/{link.host_ifname}").exists()


def test_a_spoofed_source_address_is_dropped(box: Sandbox, agentbox_home: Path) -> None:
    """The sandbox user cannot change its address (no CAP_NET_ADMIN); prove the
    reverse-path rule by sending, from the sandbox's netns as host root, a packet whose
    source is another sandbox's address."""
    _rules_loaded()
    other = _create(agentbox_home)
    try:
        record = box.info()
        assert record.init_pid is not None
        net = plane.home_net(agentbox_home)
        spoofed = net.link(other.info().slot).sandbox_address
        before = _counter("spoofed")
        subprocess.run(
            ["nsenter", f"--net=/proc/{record.init_pid}/ns/net", "ip", "addr", "add",
             f"{spoofed}/32", "dev", "eth0"], check=True,
        )  # fmt: skip
        subprocess.run(
            ["nsenter", f"--net=/proc/{record.init_pid}/ns/net", "curl", "-s", "-m", "1",
             "--interface", spoofed, f"http://{net.proxy_address}:{plane.EXPLICIT_PORT}/"],
            check=False,
        )  # fmt: skip
        assert _counter("spoofed") > before
    finally:
        other.kill()
