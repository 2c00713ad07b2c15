"""Host-level settings: where state lives and the admission limits. The sandbox
specifications (pydantic) are in ``agentbox.config.specs``, apart so that importing this module
stays cheap."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agentbox.endpoint import DEFAULT_HOME


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
