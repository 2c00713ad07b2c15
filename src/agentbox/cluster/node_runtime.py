"""A node's runtime: the single-host :class:`Runtime`, plus its sandboxes' rows in the
cluster registry, so that gateways route to them the moment a create answers."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentbox.cluster.registry import Registry
from agentbox.errors import AgentboxError, StateUnavailable
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.store import SandboxRecord

if TYPE_CHECKING:
    from agentbox.config.specs import SandboxSpec
    from agentbox.runtime.host import SandboxHost
    from agentbox.runtime.templates import Template

log = logging.getLogger(__name__)


class NodeRuntime(Runtime):
    def __init__(self, home: Path | None, registry: Registry, node_id: str) -> None:
        super().__init__(home)
        self.registry = registry
        self.node_id = node_id

    def _register(self, record: SandboxRecord) -> SandboxRecord:
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

    def create(
        self, spec: Mapping[str, object] | SandboxSpec | None = None, *, actor: str = "local"
    ) -> SandboxRecord:
        return self._register(super().create(spec, actor=actor))

    def fork(self, source_id: str, *, actor: str = "local") -> SandboxRecord:
        return self._register(super().fork(source_id, actor=actor))

    def create_filled(
        self,
        spec: SandboxSpec,
        template: Template,
        populate: Callable[[SandboxHost, Path], None],
        *,
        actor: str = "local",
        **details: Any,
    ) -> SandboxRecord:
        record = super().create_filled(spec, template, populate, actor=actor, **details)
        return self._register(record)

    def destroy(self, sandbox_id: str, *, reason: str = "operator", actor: str = "local") -> None:
        super().destroy(sandbox_id, reason=reason, actor=actor)
        try:
            self.registry.drop(sandbox_id, self.node_id)
        except StateUnavailable:  # the heartbeat's reconcile drops it later
            log.warning("registry unreachable; %s's row goes at the next heartbeat", sandbox_id)
