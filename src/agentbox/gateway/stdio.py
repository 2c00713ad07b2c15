"""``agentbox mcp``: the gateway's MCP tools over stdio, in-process, for one sandbox.

A client that spawns its servers (Claude Code, Codex, VS Code with a ``command``) runs
this; the process is as trusted as the user who started it, so it acts as a session
bound to one sandbox: the one given, or a fresh one destroyed when the client leaves.
Policy, approvals (which wait, like handshake-era clients) and audit apply as over HTTP.
"""

from __future__ import annotations

import contextlib
from typing import Any

import anyio

from agentbox.gateway.app import open_audit
from agentbox.gateway.approvals import ApprovalStore
from agentbox.gateway.auth import Principal, TokenStore
from agentbox.gateway.mcp_server import build_mcp_server
from agentbox.gateway.redaction import Redactor
from agentbox.gateway.service import Gateway
from agentbox.gateway.settings import GatewaySettings
from agentbox.runtime.runtime import Runtime


def serve_stdio(settings: GatewaySettings, sandbox_id: str | None, template: str) -> None:
    from mcp.server.stdio import stdio_server

    runtime = Runtime()
    created = sandbox_id is None
    if sandbox_id is None:
        # The config's network for a new sandbox, as the gateway's REST create applies it.
        network = settings.sandbox.network.model_dump()
        sandbox_id = runtime.create({"template": template, "network": network}).id
    else:
        runtime.get(sandbox_id)
    redactor = Redactor.from_env(
        settings.redaction.literals_from_env, detectors=settings.redaction.detectors != "none"
    )
    audit = open_audit(settings, runtime.home, redactor)
    # Tokens are not used over stdio, but the store keeps revocation consistent.
    tokens = TokenStore(runtime.home / "gateway.db", operator_token="stdio-" + "x" * 32,
                        default_ttl=settings.gateway.auth.ttl_seconds)  # fmt: skip
    gateway = Gateway(settings, runtime, tokens, ApprovalStore(runtime.home / "gateway.db"),
                      audit, redactor)  # fmt: skip
    principal = Principal("session", token_id="stdio", sandbox_id=sandbox_id)  # noqa: S106
    server = build_mcp_server(gateway, lambda ctx: principal)

    async def main() -> None:
        async with stdio_server() as (read, write):
            options: Any = server.create_initialization_options()
            await server.run(read, write, options)

    try:
        anyio.run(main)
    finally:
        with contextlib.suppress(Exception):
            gateway.browsers.close_all()
        audit.close()
        if created:
            with contextlib.suppress(Exception):
                runtime.destroy(sandbox_id)
