"""Each template name's default isolation tier: ``isolation: gvisor`` on a template makes
every sandbox created from it without an ``isolation`` of its own run on gVisor.

A property of the *name*, not of the content-addressed tree (two names may share one
tree and differ in tier), kept in ``$AGENTBOX_HOME/templates/isolation.json``
(``{"name": "gvisor"}``); a name without an entry uses the default tier, namespaces.
Set with ``agentbox template set NAME --isolation gvisor`` (or ``--isolation`` on
``template build`` / ``template import``).
"""

from __future__ import annotations

import json
from pathlib import Path

from agentbox.errors import InvalidConfig, InvalidRequest
from agentbox.fsutil import atomic_file, locked

TIERS = ("namespaces", "gvisor")


def _file(home: Path) -> Path:
    return Path(home) / "templates" / "isolation.json"


def _read(home: Path) -> dict[str, str]:
    try:
        data = json.loads(_file(home).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise InvalidConfig(
            f"{_file(home)} is not valid JSON ({e}); fix or remove it (template tiers)"
        ) from e
    if not isinstance(data, dict) or any(v not in TIERS for v in data.values()):
        raise InvalidConfig(f"{_file(home)} must map template names to one of {TIERS}")
    return {str(k): str(v) for k, v in data.items()}


def default_tier(home: Path, template: str) -> str | None:
    """The tier ``template`` asks for, or None (the default tier)."""
    return _read(home).get(template)


def set_default_tier(home: Path, template: str, tier: str | None) -> None:
    """Make ``tier`` the default of ``template`` (None: back to the default tier)."""
    if tier is not None and tier not in TIERS:
        raise InvalidRequest(f"isolation must be one of {', '.join(TIERS)}", field="isolation")
    target = _file(home)
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / ".isolation.lock"):
        tiers = _read(home)
        if tier is None:
            tiers.pop(template, None)
        else:
            tiers[template] = tier
        with atomic_file(target, 0o644) as out:
            out.write(json.dumps(tiers, indent=2, sort_keys=True).encode())
