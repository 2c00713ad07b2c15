"""Host network numbering: homes, links, addresses, the nft ruleset (checked, not loaded)."""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

import pytest

from agentbox.errors import HostUnsupported
from agentbox.network import plane
from agentbox.network.addresses import denied_reason


def test_links_of_different_homes_never_share_names_or_addresses() -> None:
    seen_names, seen_addresses = set(), set()
    for k in (0, 1, 7, plane.MAX_HOMES - 1):
        net = plane.HomeNet(k)
        for slot in (0, 1, 1234, plane.MAX_SLOTS - 1):
            link = net.link(slot)
            assert len(link.host_ifname) <= 15  # IFNAMSIZ - 1
            assert link.host_ifname not in seen_names
            seen_names.add(link.host_ifname)
            for address in (link.host_address, link.sandbox_address):
                assert ipaddress.IPv4Address(address) in net.subnet
                assert address not in seen_addresses
                seen_addresses.add(address)
            assert plane.link_for_address(link.sandbox_address) == link
            assert plane.link_for_address(link.host_address) is None  # the host end
        # a home's proxy is in the denied ranges: only the nft rule for its own sandboxes
        # lets them reach it
        assert denied_reason(net.proxy_address) is not None
    assert plane.link_for_address("203.0.113.10") is None


def test_home_numbers_are_allocated_reused_and_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(plane, "REGISTRY", tmp_path / "run" / "net-homes.json")
    monkeypatch.setattr(plane, "_homes", {})
    homes = [tmp_path / f"home{i}" for i in range(plane.MAX_HOMES + 1)]
    for home in homes:
        home.mkdir()
    numbers = [plane.home_net(h).index for h in homes[:-1]]
    assert sorted(numbers) == list(range(plane.MAX_HOMES))
    monkeypatch.setattr(plane, "_homes", {})  # another process: reads the registry
    assert plane.home_net(homes[3]).index == numbers[3]
    with pytest.raises(HostUnsupported, match="already have networking"):
        plane.home_net(homes[-1])
    homes[5].rmdir()  # a home that is gone gives its number back
    assert plane.home_net(homes[-1]).index == numbers[5]


def test_the_ruleset_is_valid_nft_with_every_homes_rules() -> None:
    rules = plane.ruleset()
    for k in range(plane.MAX_HOMES):
        net = plane.HomeNet(k)
        assert f'iifname "{net.ifname_prefix}*" ip daddr {net.proxy_address} tcp dport' in rules
        assert f"dnat ip to {net.proxy_address}:{plane.TRANSPARENT_PORT}" in rules
    # -c: parse and check against the kernel without changing anything
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=rules, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_a_gone_homes_number_waits_for_its_daemon_to_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import os

    monkeypatch.setattr(plane, "REGISTRY", tmp_path / "run" / "net-homes.json")
    monkeypatch.setattr(plane, "_homes", {})
    gone, new, later = tmp_path / "gone", tmp_path / "new", tmp_path / "later"
    for home in (gone, new, later):
        home.mkdir()
    number = plane.home_net(gone).index
    gone.rmdir()
    lock = plane.number_lock(number)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # its egress daemon still serves that address
        assert plane.home_net(new).index != number
    finally:
        os.close(fd)
    assert plane.home_net(later).index == number  # released: reusable


def test_teardown_lookup_never_allocates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plane, "REGISTRY", tmp_path / "run" / "net-homes.json")
    monkeypatch.setattr(plane, "_homes", {})
    home = tmp_path / "home"
    home.mkdir()
    assert plane.registered_home_net(home) is None
    assert not plane.REGISTRY.exists() or str(home) not in plane.REGISTRY.read_text()
    number = plane.home_net(home)
    monkeypatch.setattr(plane, "_homes", {})
    assert plane.registered_home_net(home) == number
