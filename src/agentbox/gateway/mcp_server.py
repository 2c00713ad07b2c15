"""MCP over the official SDK's low-level ``Server``: the gateway's tools for AI clients.

One server definition serves Streamable HTTP at ``/mcp`` (the 2026-07-28 revision,
stateless with ``server/discover``, and handshake-era clients) and stdio (``agentbox
mcp``). Over HTTP each request is authenticated from its own ``Authorization`` header
(:mod:`agentbox.gateway.mcp_http`), so a session token sees and can call only its
sandbox's permitted tools.

A tool's failure comes back as an ``isError`` result whose text says what to do next (the
model reads it). Protocol and authorization failures (an unknown tool, a token without
the tool's scope) are JSON-RPC errors, with codes from :data:`JSONRPC_CODES`. A command that
needs a person's approval returns MCP's input-required result to 2026-07-28 clients (the
client asks its user to check again and retries); handshake-era clients, which cannot
receive that result, wait up to ``approval_timeout`` like plain HTTP callers.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agentbox import __version__, hints
from agentbox.errors import (
    AgentboxError,
    ApprovalPending,
    CommandTimeout,
    Conflict,
    HostUnsupported,
    InsufficientScope,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    ProviderError,
    SandboxError,
    ToolNotFound,
    Unauthenticated,
)
from agentbox.gateway import jsonbody, sealed
from agentbox.gateway.auth import Principal
from agentbox.gateway.service import Gateway
from agentbox.gateway.tools import ToolSpec

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
log = logging.getLogger(__name__)

# The JSON-RPC code of each agentbox error: the first class up the error's MRO that is
# listed wins; ``data`` is ``{"code": <agentbox code>, "details": {...}}``. -32000 and
# -32001 are left to the SDKs (connection closed, request timeout), -32020..-32042 to MCP.
JSONRPC_CODES: dict[type[AgentboxError], int] = {
    ToolNotFound: types.INVALID_PARAMS,  # MCP: an unknown tool is invalid params
    InvalidRequest: types.INVALID_PARAMS,
    NotFound: -32002,  # MCP's "resource not found"
    Unauthenticated: -32050,
    PermissionDenied: -32051,  # insufficient_scope, policy_denied, path_escape, ...
    Conflict: -32052,
    ApprovalPending: -32053,
    LimitExceeded: -32054,  # rate_limited, quota_exceeded, ...
    CommandTimeout: -32055,
    HostUnsupported: -32056,
    ProviderError: -32057,
    SandboxError: -32058,
    AgentboxError: -32059,
}
_R = TypeVar("_R")
_P = TypeVar("_P")


def jsonrpc_error(e: AgentboxError) -> dict[str, Any]:
    """``e`` as a JSON-RPC error object (``code``, ``message``, ``data``)."""
    code = next(JSONRPC_CODES[c] for c in type(e).__mro__ if c in JSONRPC_CODES)
    message = hints.render(e, "mcp")
    return {"code": code, "message": message, "data": {"code": e.code, "details": e.details}}


def _protocol_errors(
    handler: Callable[[ServerRequestContext[Any, Any], _P], Awaitable[_R]],
) -> Callable[[ServerRequestContext[Any, Any], _P], Awaitable[_R]]:
    """A handler whose failures reach the wire with a code from JSONRPC_CODES (the SDK
    would send an unexpected exception as code 0, and its text)."""

    @functools.wraps(handler)
    async def wrapped(ctx: ServerRequestContext[Any, Any], params: _P) -> _R:
        try:
            return await handler(ctx, params)
        except (MCPError, ValidationError):
            raise
        except AgentboxError as e:
            raise MCPError(**jsonrpc_error(e)) from e
        except Exception as e:
            log.exception("MCP handler failed")
            raise MCPError(types.INTERNAL_ERROR, "internal error; see the gateway log") from e

    return wrapped


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
    @_protocol_errors
    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        principal = resolve(ctx)
        return types.ListToolsResult(tools=[_tool(t) for t in gateway.visible_tools(principal)])

    @_protocol_errors
    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        principal = resolve(ctx)
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
                            message=hints.render(e, "mcp"), requested_schema=_RECHECK_SCHEMA
                        )
                    )
                },
                request_state=sealed.seal(
                    gateway.state_key, {"approval_id": e.details["approval_id"]}
                ),
            )
        except (ToolNotFound, InsufficientScope):
            raise  # protocol and authorization errors (the HTTP layer answers 403 to the latter)
        except AgentboxError as e:
            return _error(f"{e.code}: {hints.render(e, 'mcp')}")
        return types.CallToolResult(
            content=result_content(outcome.result), structured_content=outcome.result
        )

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = gateway.tools_by_name.get(name)
        return spec.input_schema if spec else None

    return Server(
        "agentbox",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        get_tool_input_schema=input_schema,
    )
