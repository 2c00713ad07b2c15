"""MCP over the official SDK's low-level ``Server``: the gateway's tools for AI clients.

One server definition serves Streamable HTTP at ``/mcp`` (the 2026-07-28 revision,
stateless with ``server/discover``, and handshake-era clients) and stdio (``agentbox
mcp``). Each request is authenticated from its own ``Authorization`` header, so a
session token sees and can call only its sandbox's permitted tools.

Errors come back as ``isError`` results whose text says what to do next. A command that
needs a person's approval returns MCP's input-required result to 2026-07-28 clients (the
client asks its user to check again and retries); handshake-era clients, which cannot
receive that result, wait up to ``approval_timeout`` like plain HTTP callers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from agentbox import __version__
from agentbox.errors import AgentboxError, ApprovalPending
from agentbox.gateway import jsonbody, sealed
from agentbox.gateway.auth import Principal
from agentbox.gateway.service import Gateway
from agentbox.gateway.tools import TOOLS_BY_NAME, ToolSpec

INSTRUCTIONS = (
    "agentbox runs your commands in a disposable Linux sandbox: terminal_run for commands, "
    "fs_* for files (paths are relative to /workspace), process_* for background processes, "
    "shell_* for a persistent shell and browser_* for web pages (open, snapshot, click, type). "
    "Errors say what to do next."
)
_RECHECK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"recheck": {"type": "boolean", "description": "Check the decision again"}},
}

PrincipalResolver = Callable[[ServerRequestContext[Any, Any]], Principal]


def _tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=spec.output_schema,
        annotations=types.ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=spec.destructive,
            idempotent_hint=spec.idempotent,
            open_world_hint=spec.open_world,
        ),
    )


def _error(message: str) -> types.CallToolResult:
    text = jsonbody.encodable(message)  # it may name a sandbox's file
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def result_content(result: dict[str, Any]) -> list[types.ContentBlock]:
    """A result as MCP content: its JSON, and a screenshot as an image block of its own
    (the text then leaves out the base64, which the structured content still carries)."""
    image = result.get("png_base64")
    if not isinstance(image, str):
        return [types.TextContent(type="text", text=json.dumps(result))]
    rest = {k: v for k, v in result.items() if k != "png_base64"}
    return [
        types.TextContent(type="text", text=json.dumps(rest)),
        types.ImageContent(type="image", data=image, mime_type="image/png"),
    ]


def build_mcp_server(gateway: Gateway, resolve: PrincipalResolver) -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = resolve(ctx)
        return types.ListToolsResult(tools=[_tool(t) for t in gateway.visible_tools(principal)])

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        try:
            principal = resolve(ctx)
        except AgentboxError as e:
            return _error(f"{e.code}: {e.message}")
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        approval_id = None
        if modern:
            # Forged or malformed state (the client is untrusted) counts as none.
            state = sealed.unseal(gateway.state_key, params.request_state) or {}
            found = state.get("approval_id")
            approval_id = found if isinstance(found, str) else None
        try:
            outcome = await gateway.call_tool(
                principal,
                params.name,
                params.arguments,
                approval_mode="handle" if modern else "wait",
                approval_id=approval_id,
            )
        except ApprovalPending as e:
            return types.InputRequiredResult(
                input_requests={
                    "approval": types.ElicitRequest(
                        params=types.ElicitRequestFormParams(
                            message=e.message, requested_schema=_RECHECK_SCHEMA
                        )
                    )
                },
                request_state=sealed.seal(
                    gateway.state_key, {"approval_id": e.details["approval_id"]}
                ),
            )
        except AgentboxError as e:
            return _error(f"{e.code}: {e.message}")
        return types.CallToolResult(
            content=result_content(outcome.result), structured_content=outcome.result
        )

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = TOOLS_BY_NAME.get(name)
        return spec.input_schema if spec else None

    return Server(
        "agentbox",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )
