"""Who is calling: the operator, or a session token scoped to one sandbox and a tool set.

Apart from the token store (``gateway/auth.py``) so that what acts on a caller's behalf
below the gateway (the task agent, the worker) needs no front end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agentbox.errors import InsufficientScope

OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    kind: Literal["operator", "session"]
    token_id: str | None = None
    sandbox_id: str | None = None
    tools: frozenset[str] | None = None  # None: every tool

    @property
    def actor(self) -> str:
        return OPERATOR if self.kind == "operator" else f"token:{self.token_id}"

    @property
    def is_operator(self) -> bool:
        return self.kind == "operator"

    def may_use(self, tool: str) -> bool:
        return self.tools is None or tool in self.tools

    def require_operator(self, what: str) -> None:
        if not self.is_operator:
            raise InsufficientScope(
                f"{what} needs the operator token; a session token cannot", scope=OPERATOR
            )

    def require_sandbox(self, sandbox_id: str) -> None:
        """A session token reaches only its own sandbox."""
        if not self.is_operator and sandbox_id != self.sandbox_id:
            raise InsufficientScope(
                f"this token is bound to sandbox {self.sandbox_id}, not {sandbox_id}",
                scope=f"sandbox:{sandbox_id}",
            )
