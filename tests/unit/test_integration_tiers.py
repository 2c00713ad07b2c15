"""Every integration and security file runs on both isolation tiers, or says why it does
not (``tests/tierkit.py``): a new file cannot silently cover one tier only."""

from __future__ import annotations

import re
from pathlib import Path

from tierkit import NOT_YET_ON_GVISOR, SECURITY_ONE_TIER, TIER_INDEPENDENT

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
SECURITY = Path(__file__).resolve().parents[1] / "security"
# How a file runs on both tiers (tests/conftest.py's fixtures, a parametrised tier, an
# explicit isolation), or is gVisor's own.
TIERED = re.compile(r"default_tier|tiered_sandbox|BOTH_TIERS|\bTIERS\b|isolation=|gvisor")


def test_each_integration_file_runs_on_both_tiers_or_says_why() -> None:
    files = {p.name: p.read_text() for p in INTEGRATION.glob("test_*.py")}
    listed = {**TIER_INDEPENDENT, **NOT_YET_ON_GVISOR}
    assert set(listed) <= set(files), set(listed) - set(files)
    assert not set(TIER_INDEPENDENT) & set(NOT_YET_ON_GVISOR)
    silent = sorted(n for n, text in files.items() if n not in listed and not TIERED.search(text))
    assert silent == [], f"run these on both tiers or list them in tests/tierkit.py: {silent}"
    stale = sorted(n for n in TIER_INDEPENDENT if "default_tier" in files[n])
    assert stale == [], f"listed as one tier but run on both: {stale}"


def test_each_security_file_attacks_both_tiers_or_says_why() -> None:
    files = {p.name: p.read_text() for p in SECURITY.glob("test_*.py")}
    assert set(SECURITY_ONE_TIER) <= set(files), set(SECURITY_ONE_TIER) - set(files)
    silent = sorted(
        n for n, t in files.items() if n not in SECURITY_ONE_TIER and not TIERED.search(t)
    )
    assert silent == [], f"attack both tiers or list them in tests/tierkit.py: {silent}"
