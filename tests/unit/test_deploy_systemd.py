"""The systemd units in deploy/systemd/ are ones systemd accepts: ``systemd-analyze verify``
on each, where any complaint counts (systemd only warns, exit 0, about an unknown key or a
bad value and then ignores the line, so a misspelt hardening option would silently go)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
INSTALLED = "/usr/local/bin/agentbox"  # where the units expect it (scripts/install.sh links it)


def verify(unit_text: str, name: str, tmp_path: Path) -> str:
    """systemd-analyze's complaints about a unit (empty: accepted). The agentbox path is
    pointed at this checkout's script: verify checks that ExecStart's binary exists."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze not found: apt-get install -y systemd"
    script = Path(sys.executable).parent / "agentbox"
    assert script.exists(), f"{script} missing: scripts/install.sh --dev"
    unit = tmp_path / name
    unit.write_text(unit_text.replace(INSTALLED, str(script)))
    done = subprocess.run(
        [analyze, "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return (done.stdout + done.stderr).strip() if done.returncode or done.stderr else ""


def test_the_units_are_there() -> None:
    assert [u.name for u in UNITS] == [
        "agentbox-audit-prune.service",
        "agentbox-db-migrate.service",
        "agentbox-gateway.service",
        "agentbox-node.service",
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_systemd_accepts_the_unit(unit: Path, tmp_path: Path) -> None:
    text = unit.read_text()
    assert INSTALLED in text
    assert verify(text, unit.name, tmp_path) == ""


def test_the_daily_prune_timer_starts_its_service(tmp_path: Path) -> None:
    timer = ROOT / "deploy" / "systemd" / "agentbox-audit-prune.timer"
    service = timer.with_suffix(".service")
    # verify checks the unit a timer starts: it must be beside it, as once installed
    (tmp_path / service.name).write_text(service.read_text().replace(INSTALLED, "/bin/true"))
    assert verify(timer.read_text(), timer.name, tmp_path) == ""
    lines = timer.read_text().splitlines()
    assert "OnCalendar=daily" in lines and "WantedBy=timers.target" in lines
    exec_start = [
        line for line in service.read_text().splitlines() if line.startswith("ExecStart=")
    ]
    assert exec_start == [f"ExecStart={INSTALLED} audit prune --cluster --config "
                          "/etc/agentbox/gateway.yaml"]  # fmt: skip


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (("NoNewPrivileges=yes", "NoNewPrivilege=yes"), "Unknown key"),  # a misspelt key
        (("KillMode=mixed", "KillMode=gently"), "kill mode"),  # a bad value
        (("[Service]", "[Servce]"), "Unknown section"),
    ],
)
def test_the_check_fails_on_a_broken_unit(
    change: tuple[str, str], complaint: str, tmp_path: Path
) -> None:
    # The node unit, broken in one place: the check above must be able to fail.
    text = (ROOT / "deploy" / "systemd" / "agentbox-node.service").read_text()
    assert change[0] in text
    assert complaint in verify(text.replace(change[0], change[1], 1), "broken.service", tmp_path)


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_the_gateway_side_runs_unprivileged_and_the_node_as_root(unit: Path) -> None:
    # The gateway and the migration hold no sandbox: a user of their own, no capabilities.
    # The node creates namespaces, mounts and nftables rules (why: the unit's header).
    lines = unit.read_text().splitlines()
    if unit.name == "agentbox-node.service":
        assert not any(line.startswith(("User=", "RestrictNamespaces=")) for line in lines)
    else:
        assert "User=agentbox" in lines
        assert "CapabilityBoundingSet=" in lines
        assert "RestrictNamespaces=yes" in lines
