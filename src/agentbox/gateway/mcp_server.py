"""MCP over the official SDK's low-level ``Server``: the gateway's tools for AI clients.

One server definition serves Streamable HTTP at ``/mcp`` (the 2026-07-28 revision,
stateless with ``server/discover``, and handshake-era clients) and stdio (``agentbox
mcp``). Over HTTP each request is authenticated from its own ``Authorization`` header
(:mod:`agentbox.gateway.mcp_http`), so a session token sees and can call only its
sandbox's permitted tools.

A tool's failure comes back as an ``isError`` result whose text says what to do next (the
model reads it). Protocol and authorization failures (an unknown tool, a token without
the tool's scope) are JSON-RPC errors, with codes from :data:`JSONRPC_CODES`. A command that
needs a person's approval returns MCP's input-required result to 2026-07-28 clients that
declare form elicitation (the client asks its user to check again and retries);
handshake-era clients, which cannot receive that result, and clients without the
capability wait up to ``approval_timeout`` like plain HTTP callers. A command held by an
egress question (network mode ``ask``) gets the same input-required result while it runs
on (:mod:`agentbox.gateway.egress_elicit`).

Files an agent should look at (a command's full output, saved when the result cuts it)
come back as ``resource_link`` blocks, ``sandbox://<sandbox id>/<absolute path>``, which
``resources/read`` reads through ``fs_read``'s one call path (its scope, the sandbox the
token is bound to, the read policy, redaction and the audit trail). A call that sends
``_meta.progressToken`` gets ``notifications/progress`` with the command's latest output
lines; ``notifications/cancelled`` kills the command (its cgroup). Log notifications
about tool calls come at the level a 2026-07-28 request's ``_meta`` asks for, or that a
handshake-era client set with ``logging/setLevel``, and up; none otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import mimetypes
import posixpath
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from agentbox import __version__, hints
from agentbox.errors import (
    AgentboxError,
    ApprovalPending,
    CommandTimeout,
    Conflict,
    FileNotFound,
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
from agentbox.gateway.egress_elicit import HeldCalls, Waiting
from agentbox.gateway.service import Gateway
from agentbox.gateway.tools import CommandOutput, ToolSpec
from agentbox.policy.principal import Principal
from agentbox.runtime.commands import Cancellation

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
    NotFound: -32002,  # MCP's "resource not found" until 2025-11-25 (_resource_not_found)
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


def _elicits_forms(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether this request's client declared form elicitation (an empty ``elicitation``
    capability means form mode, for backward compatibility)."""
    capabilities = ctx.session.client_capabilities
    elicitation = capabilities.elicitation if capabilities else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def _state_for(principal: Principal, params: types.CallToolRequestParams) -> dict[str, str]:
    """What a call's ``requestState`` is bound to: the token and the call itself."""
    call = json.dumps([params.name, params.arguments or {}], sort_keys=True)
    return {"actor": principal.actor, "call": hashlib.sha256(call.encode()).hexdigest()}


def _state_from(
    key: bytes, principal: Principal, params: types.CallToolRequestParams
) -> tuple[str | None, str | None]:
    """(the approval, the call held by an egress question) a returned ``requestState``
    names. State that fails verification (altered, forged, not made here) or that was
    given to another token or for another call is refused with a JSON-RPC error, as
    SEP-2322 requires, rather than read as no state: the client learns its state is bad
    instead of being asked again."""
    state = sealed.unseal(key, params.request_state) or {}
    approval_id, held_call = state.get("approval_id"), state.get("egress_call")
    approval_id = approval_id if isinstance(approval_id, str) else None
    held_call = held_call if isinstance(held_call, str) else None
    bound = _state_for(principal, params)
    if (approval_id is None and held_call is None) or any(
        state.get(k) != v for k, v in bound.items()
    ):
        raise InvalidRequest(
            "requestState failed verification (altered, or given to another token or for "
            "another call); call the tool again without requestState to ask anew"
        )
    return approval_id, held_call


def _tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=spec.output_schema,
        # The same hints REST lists, under MCP's wire names.
        annotations=types.ToolAnnotations.model_validate(
            {"title": spec.title, **spec.annotations()}
        ),
    )


def tool_error(e: AgentboxError) -> types.CallToolResult:
    """A tool's failure as MCP returns it (``jsonrpc_error`` is the protocol's): an
    ``isError`` result whose text, ``code: message``, the model reads and acts on."""
    text = jsonbody.encodable(f"{e.code}: {hints.render(e, 'mcp')}")  # it may name a file
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


RESOURCE_SCHEME = "sandbox://"
# The results' fields that name a sandbox file for the agent to look at.
_FILE_FIELDS = {
    "stdout_file": ("The full stdout of the command (the result keeps its head and tail)",
                    "text/plain"),
    "stderr_file": ("The full stderr of the command (the result keeps its head and tail)",
                    "text/plain"),
    "file": ("The screenshot, saved in the sandbox", "image/png"),
}  # fmt: skip
LOG_LEVELS: tuple[types.LoggingLevel, ...] = (
    "debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"
)  # fmt: skip
_PROGRESS_LINES = 5  # of the latest output, in a progress notification's message


def resource_uri(sandbox_id: str, path: str) -> str:
    """``sandbox://<sandbox id>/<absolute path>``, the path percent-encoded."""
    return RESOURCE_SCHEME + sandbox_id + quote(posixpath.join("/", path), safe="/")


def parse_resource_uri(uri: str) -> tuple[str, str]:
    """(sandbox id, absolute path) of a ``sandbox://`` URI."""
    sandbox, slash, path = uri.removeprefix(RESOURCE_SCHEME).partition("/")
    if not uri.startswith(RESOURCE_SCHEME) or not sandbox or not slash:
        raise FileNotFound(f"no resource {uri!r}: resources are sandbox://<sandbox id>/<path>")
    return sandbox, "/" + unquote(path)


def _resource_not_found(e: NotFound, uri: str, protocol_version: str) -> MCPError:
    """MCP's "resource not found", with the URI in ``data.uri``: -32602 from 2026-07-28
    (SEP-2164), -32002 for the handshake-era revisions that defined that code."""
    error = jsonrpc_error(e)
    error["data"]["uri"] = uri
    if protocol_version in MODERN_PROTOCOL_VERSIONS:
        error["code"] = types.INVALID_PARAMS
    return MCPError(**error)


def result_content(result: dict[str, Any], sandbox_id: str = "") -> list[types.ContentBlock]:
    """A result as MCP content: its JSON, a screenshot as an image block of its own (the
    text then leaves out the base64, which the structured content still carries), and a
    ``resource_link`` to each saved file the result names."""
    image = result.get("png_base64")
    rest = {k: v for k, v in result.items() if k != "png_base64"}
    content: list[types.ContentBlock] = [types.TextContent(type="text", text=json.dumps(rest))]
    if isinstance(image, str):
        content.append(types.ImageContent(type="image", data=image, mime_type="image/png"))
    for field, (what, mime) in _FILE_FIELDS.items():
        path = result.get(field)
        if isinstance(path, str) and sandbox_id:
            content.append(
                types.ResourceLink(
                    uri=resource_uri(sandbox_id, path),
                    name=posixpath.basename(path),
                    description=what,
                    mime_type=mime,
                )
            )
    return content


def _mime(path: str) -> str:
    return mimetypes.guess_type(path)[0] or "text/plain"  # .stdout/.stderr: text


class LogLevels:
    """Which log notifications a tool call gets. A 2026-07-28 request asks for them itself
    (``_meta`` ``io.modelcontextprotocol/logLevel``; absent: none, the server MUST NOT
    send any). A handshake-era client sets a level with ``logging/setLevel``, kept per
    token (over stateless HTTP a token, not a connection, is the session); it never
    applies to a 2026-07-28 request of the same token."""

    def __init__(self) -> None:
        self._levels: dict[str, int] = {}

    def set(self, principal: Principal, level: types.LoggingLevel) -> None:
        self._levels[principal.actor] = LOG_LEVELS.index(level)

    def wanted(self, principal: Principal, params: dict[str, Any]) -> bool:
        """Whether a tools/call with these (raw) params may get log notifications."""
        meta = params.get("_meta")
        meta = meta if isinstance(meta, dict) else {}
        if types.PROTOCOL_VERSION_META_KEY in meta:  # a 2026-07-28 request
            return meta.get(types.LOG_LEVEL_META_KEY) in LOG_LEVELS
        return principal.actor in self._levels

    def _floor(self, ctx: ServerRequestContext[Any, Any], principal: Principal) -> int | None:
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            requested = (ctx.meta or {}).get(types.LOG_LEVEL_META_KEY)
            return LOG_LEVELS.index(requested) if requested in LOG_LEVELS else None
        return self._levels.get(principal.actor)

    async def log(
        self,
        ctx: ServerRequestContext[Any, Any],
        principal: Principal,
        level: types.LoggingLevel,
        data: Any,
    ) -> None:
        floor = self._floor(ctx, principal)
        if floor is None or LOG_LEVELS.index(level) < floor:
            return
        notification = types.LoggingMessageNotification(
            params=types.LoggingMessageNotificationParams(level=level, logger="agentbox", data=data)
        )
        with contextlib.suppress(Exception):  # a client gone away misses its log line
            await ctx.session.send_notification(notification, related_request_id=ctx.request_id)


class InFlight:
    """Tool calls running, by (token, JSON-RPC id). A handshake-era client's
    ``notifications/cancelled`` comes as a POST of its own, which over stateless HTTP no
    transport relates to the call: :meth:`observe` (McpAuth shows it every POST) cancels
    the call it names, when the same token made it."""

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], Cancellation] = {}

    @contextlib.contextmanager
    def track(self, principal: Principal, request_id: Any) -> Iterator[Cancellation]:
        key = (principal.actor, json.dumps(request_id))
        self._calls[key] = cancel = Cancellation()
        try:
            yield cancel
        finally:
            if self._calls.get(key) is cancel:
                del self._calls[key]

    def observe(self, message: Any, principal: Principal) -> None:
        """``message``: the POST's body, decoded (McpAuth decodes it once for all)."""
        if not isinstance(message, dict) or message.get("method") != "notifications/cancelled":
            return
        try:
            key = (principal.actor, json.dumps(message["params"]["requestId"]))
        except (TypeError, KeyError):
            return
        cancel = self._calls.get(key)
        if cancel is not None:
            cancel.cancel()


def wants_stream(message: Any, principal: Principal, logs: LogLevels) -> bool:
    """Whether a POST to /mcp (``message``: its body, decoded) needs the SSE transport: a
    tools/call that asks for progress or may get logs (:meth:`LogLevels.wanted`; the JSON
    transport has no wire for them), and whose authorization cannot fail (an auth failure
    is an HTTP 401/403 with its challenge, which a stream already begun with 200 cannot
    carry)."""
    if not isinstance(message, dict) or message.get("method") != "tools/call":
        return False
    params = message.get("params")
    if not isinstance(params, dict):
        return False
    if progress_token_from_params(params) is None and not logs.wanted(principal, params):
        return False
    name, args = params.get("name"), params.get("arguments") or {}
    sandbox = args.get("sandbox_id") if isinstance(args, dict) else None
    return (
        isinstance(name, str)
        and principal.may_use(name)
        and (principal.is_operator or sandbox in (None, principal.sandbox_id))
    )


@contextlib.asynccontextmanager
async def _progress(ctx: ServerRequestContext[Any, Any], redact: Callable[[str], str]) -> Any:
    """An output listener that reports the latest output lines as MCP progress (None
    when the call sent no progress token). The command's thread calls it; notifications
    go out from the event loop, the newest output only when the client is slower."""
    if progress_token_from_params(ctx.params) is None:
        yield None
        return
    loop = asyncio.get_running_loop()
    tail = bytearray()
    total = 0
    changed = asyncio.Event()

    def listener(stream: str, chunk: bytes) -> None:
        def note() -> None:
            nonlocal total
            total += len(chunk)
            tail.extend(chunk)
            del tail[:-4096]
            changed.set()

        loop.call_soon_threadsafe(note)

    async def report() -> None:
        while True:
            await changed.wait()
            changed.clear()
            lines = tail.decode("utf-8", "replace").splitlines()[-_PROGRESS_LINES:]
            await ctx.session.report_progress(total, message=redact("\n".join(lines)))

    task = asyncio.create_task(report())
    try:
        yield listener
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


def _egress_question(
    gateway: Gateway, waiting: Waiting, principal: Principal, params: types.CallToolRequestParams
) -> types.InputRequiredResult:
    """The input-required result of a call held by an egress question (see egress_elicit)."""
    return types.InputRequiredResult(
        input_requests={
            "egress": types.ElicitRequest(
                params=types.ElicitRequestFormParams(
                    message=waiting.message(params.name), requested_schema=_RECHECK_SCHEMA
                )
            )
        },
        request_state=sealed.seal(
            gateway.state_key, {"egress_call": waiting.key, **_state_for(principal, params)}
        ),
    )


def build_mcp_server(
    gateway: Gateway,
    resolve: PrincipalResolver,
    logs: LogLevels | None = None,
    in_flight: InFlight | None = None,
) -> Server[Any]:
    logs = logs or LogLevels()
    calls = in_flight or InFlight()
    held = HeldCalls(gateway.approvals, gateway.runtime)

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
        # The approval's recheck is a form elicitation: a client that did not declare it
        # is never sent one (SEP-2322); its call waits for the operator instead.
        asks = modern and _elicits_forms(ctx)
        approval_id = held_call = None
        if modern and params.request_state is not None:
            approval_id, held_call = _state_from(gateway.state_key, principal, params)
        sandbox = str((params.arguments or {}).get("sandbox_id") or principal.sandbox_id or "")
        try:
            with calls.track(principal, ctx.request_id) as cancel:
                async with _progress(ctx, gateway.redactor.redact) as listener:

                    def start() -> Any:
                        return gateway.call_tool(
                            principal,
                            params.name,
                            params.arguments,
                            approval_mode="handle" if asks else "wait",
                            approval_id=approval_id,
                            output_listener=listener,
                            cancel=cancel,
                        )

                    if asks and (held_call or held.applies(params.name, sandbox)):
                        owner = (principal.actor, params.name, sandbox)
                        outcome = await held.run(owner, held_call, start)
                    else:
                        outcome = await start()
                    if isinstance(outcome, Waiting):
                        return _egress_question(gateway, outcome, principal, params)
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
                    gateway.state_key,
                    {"approval_id": e.details["approval_id"], **_state_for(principal, params)},
                ),
            )
        except (ToolNotFound, InsufficientScope):
            raise  # protocol and authorization errors (the HTTP layer answers 403 to the latter)
        except AgentboxError as e:
            failed = {"tool": params.name, "error": e.code, "message": e.message}
            await logs.log(ctx, principal, "warning", failed)
            return tool_error(e)
        done = {"tool": params.name, "duration_ms": round(outcome.duration_ms)}
        await logs.log(ctx, principal, "info", done)
        return types.CallToolResult(
            content=result_content(outcome.result, sandbox), structured_content=outcome.result
        )

    @_protocol_errors
    async def set_level(
        ctx: ServerRequestContext[Any, Any], params: types.SetLevelRequestParams
    ) -> types.EmptyResult:
        logs.set(resolve(ctx), params.level)
        return types.EmptyResult()

    @_protocol_errors
    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        """The saved outputs in the token's own sandbox (when it may read files)."""
        principal = resolve(ctx)
        sandbox = principal.sandbox_id
        if not sandbox or not principal.may_use("fs_read"):
            return types.ListResourcesResult(resources=[])
        files = gateway.runtime.files(sandbox)
        try:
            entries = await asyncio.to_thread(files.list, CommandOutput.save_dir)
        except FileNotFound:
            entries = []
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=resource_uri(sandbox, e.path),
                    name=e.name,
                    mime_type=_mime(e.path),
                    size=e.size,
                )
                for e in sorted(entries, key=lambda e: e.mtime)
                if e.type == "file"
            ]
        )

    @_protocol_errors
    async def list_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        principal = resolve(ctx)
        templates = []
        if principal.may_use("fs_read"):
            templates.append(
                types.ResourceTemplate(
                    uri_template=RESOURCE_SCHEME + "{sandbox_id}/{+path}",
                    name="sandbox-file",
                    description="A file in a sandbox (read as fs_read reads it)",
                )
            )
        return types.ListResourceTemplatesResult(resource_templates=templates)

    @_protocol_errors
    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        """fs_read of the URI's file: the same scope, sandbox, policy, redaction, audit."""
        try:
            sandbox, path = parse_resource_uri(params.uri)
            outcome = await gateway.call_tool(
                resolve(ctx), "fs_read", {"path": path, "sandbox_id": sandbox}
            )
        except NotFound as e:
            raise _resource_not_found(e, params.uri, ctx.protocol_version) from e
        result = outcome.result
        mime = _mime(path)
        if result["encoding"] == "base64":
            blob = types.BlobResourceContents(
                uri=params.uri, mime_type=mime, blob=result["content"]
            )
            return types.ReadResourceResult(contents=[blob])
        text = types.TextResourceContents(uri=params.uri, mime_type=mime, text=result["content"])
        return types.ReadResourceResult(contents=[text])

    def input_schema(name: str) -> dict[str, Any] | None:
        spec = gateway.tools_by_name.get(name)
        return spec.input_schema if spec else None

    with warnings.catch_warnings():
        # logging/setLevel is gone in 2026-07-28; handshake-era clients still send it.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        return Server(
            "agentbox",
            version=__version__,
            instructions=INSTRUCTIONS,
            on_list_tools=list_tools,
            on_call_tool=call_tool,
            on_list_resources=list_resources,
            on_list_resource_templates=list_templates,
            on_read_resource=read_resource,
            on_set_logging_level=set_level,
            get_tool_input_schema=input_schema,
        )
