"""The doctor's checks against this host's kernel, and what they leave behind."""

from __future__ import annotations

import secrets
from pathlib import Path

from agentbox.isolation.cgroups import CgroupLayout
from agentbox.isolation.hostcheck import cgroup_kill_supported, check_cgroups


def _probes(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if p.name.startswith("agentbox-probe-")]


def test_cgroup_kill_is_asked_of_a_cgroup_made_for_it(host_ready: None) -> None:
    """A fresh host may have no child cgroup at all (and the root never has cgroup.kill):
    the check makes one to look at, here under a cgroup that has no children either."""
    unified = CgroupLayout.detect().unified
    empty = unified / f"agentbox-test-{secrets.token_hex(4)}"
    empty.mkdir()
    try:
        assert not [p for p in empty.iterdir() if p.is_dir()]
        assert cgroup_kill_supported(empty)
        assert not [p for p in empty.iterdir() if p.is_dir()], "the probe cgroup was left"
    finally:
        empty.rmdir()


def test_cgroups_check_passes_and_leaves_nothing(host_ready: None) -> None:
    check = check_cgroups()
    assert check.ok, check
    assert not _probes(CgroupLayout.detect().unified)
