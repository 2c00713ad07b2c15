"""A node's runtime: the single-host :class:`Runtime`, plus its sandboxes' rows in the
cluster registry, so that gateways route to them the moment a create answers."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from agentbox.cluster.registry import Registry
from agentbox.errors import AgentboxError, StateUnavailable
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.store import SandboxRecord

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)


class NodeRuntime(Runtime):
    def __init__(self, home: Path | None, registry: Registry, node_id: str) -> None:
        super().__init__(home)
        self.registry = registry
        self.node_id = node_id

    def _admitted(self, record: SandboxRecord) -> SandboxRecord:
        """Row first, answer second: a sandbox no gateway can route to is never
        acknowledged. Without the database the new sandbox goes again and the caller
        gets ``state_unavailable`` (retry)."""
        try:
            self.registry.claim(record.id, self.node_id)
        except StateUnavailable:
            with contextlib.suppress(AgentboxError):
                super().destroy(record.id, reason="unregistered", actor="agentbox")
            raise
        return record

    def destroy(self, sandbox_id: str, *, reason: str = "operator", actor: str = "local") -> None:
        super().destroy(sandbox_id, reason=reason, actor=actor)
        try:
            self.registry.drop(sandbox_id, self.node_id)
        except StateUnavailable:  # the heartbeat's reconcile drops it later
            log.warning("registry unreachable; %s's row goes at the next heartbeat", sandbox_id)
