"""Host network numbering: homes, links, addresses, the nft ruleset (checked, not loaded)."""

from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import subprocess
from collections.abc import Iterator
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


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A registry of its own, and a directory standing for the host's network devices."""
    monkeypatch.setattr(plane, "REGISTRY", tmp_path / "run" / "net-homes.json")
    monkeypatch.setattr(plane, "NET_DEVICES", tmp_path / "devices")
    (tmp_path / "devices").mkdir()
    monkeypatch.setattr(plane, "_homes", {})
    monkeypatch.setattr(plane, "_held", {})
    yield tmp_path
    _end_process()


def _end_process() -> None:
    """What this process's exit does: its use locks go, and its cached numbers."""
    for fd in plane._held.values():
        os.close(fd)
    plane._held.clear()
    plane._homes.clear()


def test_home_numbers_are_allocated_reused_and_bounded(registry: Path) -> None:
    homes = [registry / f"home{i}" for i in range(plane.MAX_HOMES + 1)]
    for home in homes:
        home.mkdir()
    numbers = [plane.home_net(h).index for h in homes[:-1]]
    assert sorted(numbers) == list(range(plane.MAX_HOMES))
    plane._homes.clear()  # the same process, its cache gone: reads the registry
    assert plane.home_net(homes[3]).index == numbers[3]
    with pytest.raises(HostUnsupported, match="already have networking"):
        plane.home_net(homes[-1])  # this process uses every number
    homes[5].rmdir()  # a home that is gone gives its number back, once unused
    with pytest.raises(HostUnsupported, match="already have networking"):
        plane.home_net(homes[-1])
    _end_process()
    assert plane.home_net(homes[-1]).index == numbers[5]


def test_numbers_of_unused_homes_are_reclaimed_when_they_run_out(registry: Path) -> None:
    homes = [registry / f"home{i}" for i in range(plane.MAX_HOMES + 3)]
    for home in homes:
        home.mkdir()
    numbers = {h: plane.home_net(h).index for h in homes[: plane.MAX_HOMES]}
    _end_process()  # every home is left over: no process, daemon or sandbox uses it
    # ... except these: a process that is creating a sandbox in home0 right now, home1's
    # egress daemon, home2's live sandbox (its host link)
    plane.home_net(homes[0])
    daemon = os.open(plane.number_lock(numbers[homes[1]]), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(daemon, fcntl.LOCK_EX)
    (registry / "devices" / f"{plane.HomeNet(numbers[homes[2]]).ifname_prefix}7").touch()
    try:
        new = [plane.home_net(h).index for h in homes[plane.MAX_HOMES :]]
    finally:
        os.close(daemon)
    in_use = {numbers[h] for h in homes[:3]}
    assert len(set(new)) == 3 and not set(new) & in_use, (new, in_use)
    registered = json.loads(plane.REGISTRY.read_text())
    assert all(registered[str(h)] == numbers[h] for h in homes[:3])
    assert len(registered) == plane.MAX_HOMES and sorted(registered.values()) == list(
        range(plane.MAX_HOMES)
    )
    reclaimed = [h for h in homes[: plane.MAX_HOMES] if str(h) not in registered]
    assert len(reclaimed) == 3
    _end_process()  # a reclaimed home comes back with another unused number
    assert plane.home_net(reclaimed[0]).index != numbers[homes[2]]  # its link is still up


def test_homes_of_older_agentboxes_are_reclaimed_last(registry: Path) -> None:
    homes = [registry / f"home{i}" for i in range(plane.MAX_HOMES + 1)]
    for home in homes:
        home.mkdir()
    numbers = {h: plane.home_net(h).index for h in homes[: plane.MAX_HOMES]}
    _end_process()
    older = [h for h in homes[: plane.MAX_HOMES] if numbers[h] != 9]
    # registered by a version without use locks: unknown whether in use. Its number's
    # lock file is missing, or names the home that had the number before.
    for h in older[::2]:
        plane.use_lock(numbers[h]).unlink()
    for h in older[1::2]:
        plane.use_lock(numbers[h]).write_text(str(registry / "an-earlier-home"))
    os.utime(plane.use_lock(9), (0, 0))  # the others' lock files look used more recently
    assert plane.home_net(homes[-1]).index == 9


def test_the_home_used_longest_ago_is_reclaimed_first(registry: Path) -> None:
    homes = [registry / f"home{i}" for i in range(plane.MAX_HOMES + 1)]
    for home in homes:
        home.mkdir()
    numbers = [plane.home_net(h).index for h in homes[: plane.MAX_HOMES]]
    _end_process()
    for age, number in enumerate(numbers):
        os.utime(plane.use_lock(number), (1000 + age, 1000 + age))
    os.utime(plane.use_lock(numbers[17]), (10, 10))
    assert plane.home_net(homes[-1]).index == numbers[17]


def test_the_ruleset_is_valid_nft_with_every_homes_rules() -> None:
    rules = plane.ruleset()
    for k in range(plane.MAX_HOMES):
        net = plane.HomeNet(k)
        assert f'iifname "{net.ifname_prefix}*" ip daddr {net.proxy_address} tcp dport' in rules
        assert f"dnat ip to {net.proxy_address}:{plane.TRANSPARENT_PORT}" in rules
    # -c: parse and check against the kernel without changing anything
    checked = subprocess.run(["nft", "-c", "-f", "-"], input=rules, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_a_gone_homes_number_waits_for_its_daemon_to_let_go(registry: Path) -> None:
    gone, new, later = registry / "gone", registry / "new", registry / "later"
    for home in (gone, new, later):
        home.mkdir()
    number = plane.home_net(gone).index
    _end_process()
    gone.rmdir()
    lock = plane.number_lock(number)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # its egress daemon still serves that address
        assert plane.home_net(new).index != number
    finally:
        os.close(fd)
    assert plane.home_net(later).index == number  # released: reusable


def test_teardown_lookup_never_allocates(registry: Path) -> None:
    home = registry / "home"
    home.mkdir()
    assert plane.registered_home_net(home) is None
    assert not plane.REGISTRY.exists() or str(home) not in plane.REGISTRY.read_text()
    number = plane.home_net(home)
    plane._homes.clear()
    assert plane.registered_home_net(home) == number
