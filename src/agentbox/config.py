"""Host-level settings: where state lives and the admission limits. The sandbox
specifications (pydantic) are in ``agentbox.specs``; their names are also reachable here,
imported on first use so that importing this module stays cheap."""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentbox.specs import CredentialSpec as CredentialSpec
    from agentbox.specs import NetworkSpec as NetworkSpec
    from agentbox.specs import SandboxSpec as SandboxSpec

DEFAULT_HOME = "/var/lib/agentbox"


def agentbox_home() -> Path:
    """Where state lives: ``$AGENTBOX_HOME``, default ``/var/lib/agentbox``."""
    return Path(os.environ.get("AGENTBOX_HOME") or DEFAULT_HOME)


@dataclass(frozen=True)
class Admission:
    """Limits checked atomically with a create's slot reservation (``Store.reserve``).
    None: no limit (the 4096 slots still are one)."""

    max_sandboxes: int | None = None
    max_per_project: int | None = None
    max_memory: int | None = None  # bytes of memory limits committed by live sandboxes


_SPECS = {"CredentialSpec", "NetworkSpec", "SandboxSpec"}


def __getattr__(name: str) -> Any:
    if name not in _SPECS:
        raise AttributeError(f"module 'agentbox.config' has no attribute {name!r}")
    return getattr(importlib.import_module("agentbox.specs"), name)
