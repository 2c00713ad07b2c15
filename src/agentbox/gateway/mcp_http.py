"""``/mcp`` over HTTP as MCP's authorization rules (2025-06-18 and later) want it.

* Every request needs a bearer token. Without a valid one the answer is HTTP 401 with
  ``WWW-Authenticate: Bearer resource_metadata="<base>/.well-known/oauth-protected-resource/mcp"``
  (plus ``error="invalid_token"`` when a token was sent), before the MCP server sees it,
  ``initialize`` included: clients tell "log in" from "broken" by that status.
* A call the token does not cover (a tool outside its list, another sandbox) is HTTP 403
  with ``error="insufficient_scope", scope="…"``. The gateway decides (and audits) that on
  its one call path; this layer only gives the resulting JSON-RPC error its HTTP status.
* RFC 9728 metadata at ``/.well-known/oauth-protected-resource`` (the gateway) and
  ``/.well-known/oauth-protected-resource/mcp`` (the MCP endpoint). agentbox runs no OAuth
  authorization server: tokens are issued by the operator (``agentbox token issue``), so
  ``authorization_servers`` is absent and the metadata says where tokens come from.
  Clients are configured with the header (see the README's connect snippets); an OAuth
  client that falls back to registering at ``/register`` is told so in an RFC 7591 error.
* Header values reach the SDK without surrounding whitespace (RFC 9110 section 5.5: a
  field value excludes its leading and trailing OWS). The HTTP parser drops the leading
  OWS but may keep the trailing, and the SDK compares ``Mcp-Name``/``Mcp-Method`` with
  the body byte for byte, so ``Mcp-Name: terminal_run `` was refused as a mismatch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp.server.context import ServerRequestContext
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentbox.errors import AgentboxError, Unauthenticated
from agentbox.gateway.auth import challenge
from agentbox.gateway.mcp_server import jsonrpc_error
from agentbox.gateway.rest import ROUTE_SCOPES
from agentbox.gateway.tools import TOOLS
from agentbox.policy.principal import OPERATOR, Principal

METADATA_PATH = "/.well-known/oauth-protected-resource"
MCP_PATH = "/mcp"
_PRINCIPAL = "agentbox.principal"  # the scope["state"] key the MCP handlers read
# The JSON-RPC errors (by data.code) that are HTTP auth failures.
_AUTH_CODES = {"unauthenticated", "insufficient_scope"}
# Where the gateway's front door leaves the body it decoded (``app._mcp``, with the
# bounded decoder), so that this layer and its hooks need not decode it again.
DECODED_BODY = "agentbox.mcp_body"
_UNDECODED = object()


def base_url(scope: Scope) -> str:
    """This gateway as the client reached it (the Host was checked by HostAndSizeGuard)."""
    for key, value in scope["headers"]:
        if key == b"host":
            return f"{scope['scheme']}://{value.decode('latin-1')}"
    server = scope.get("server") or ("127.0.0.1", 0)
    return f"{scope['scheme']}://{server[0]}:{server[1]}"


def resource_metadata(base: str, resource_path: str) -> dict[str, Any]:
    """RFC 9728 protected resource metadata; ``resource`` is the URL the client derived
    the well-known URL from (the gateway's origin, or its ``/mcp``)."""
    return {
        "resource": base + resource_path,
        "resource_name": "agentbox gateway",
        "bearer_methods_supported": ["header"],
        # A session token's scope is the list of tools (and routes) it was issued for.
        "scopes_supported": [OPERATOR, *(t.name for t in TOOLS), *ROUTE_SCOPES],
        "resource_documentation": base + "/docs",
        "agentbox_token_issuance": (
            "no OAuth authorization server: the operator issues bearer tokens "
            "(`agentbox token issue --sandbox ID`, POST /v1/tokens); send them as "
            "`Authorization: Bearer <token>`"
        ),
    }


# What an OAuth client that found no authorization server tries next (MCP 2025-03-26's
# fallback: the server's origin, dynamic client registration at /register) is told why.
REGISTER_PATH = "/register"
NO_AUTHORIZATION_SERVER = {
    "error": "invalid_client_metadata",
    "error_description": (
        "agentbox runs no OAuth authorization server: configure this client with the header "
        "`Authorization: Bearer <token>`, a token from the operator (`agentbox token issue`)"
    ),
}


def principal_from(ctx: ServerRequestContext[Any, Any]) -> Principal:
    """The principal McpAuth authenticated this request as."""
    principal = ctx.request.scope.get("state", {}).get(_PRINCIPAL) if ctx.request else None
    if not isinstance(principal, Principal):
        raise Unauthenticated("no authenticated HTTP request")
    return principal


class McpAuth:
    """ASGI around the MCP endpoint: authenticate first, answer auth failures with 401/403.

    ``app`` answers with JSON; a request for which ``streams(message, principal)`` holds
    (notifications to send while it runs: progress, logs) goes to ``streaming``, the
    same server over SSE. ``observe(message, principal)`` sees each authenticated POST
    first (a cancellation of a call in flight). ``message`` is the body decoded: the one
    the front door left in the scope (``DECODED_BODY``), else decoded here (None when it
    is not JSON)."""

    def __init__(
        self,
        app: ASGIApp,
        principal_of: Callable[[str | None], Principal],
        streaming: ASGIApp | None = None,
        streams: Callable[[Any, Principal], bool] | None = None,
        observe: Callable[[Any, Principal], None] | None = None,
    ) -> None:
        self.app = app
        self.principal_of = principal_of
        self.streaming = streaming
        self.streams = streams
        self.observe = observe

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope = {**scope, "headers": [(k, v.strip(b" \t")) for k, v in scope["headers"]]}
        authorization = None
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value.decode("latin-1")
        body = b""
        if scope["method"] == "POST":
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return
                body += message.get("body", b"")
                if not message.get("more_body", False):
                    break
        metadata = base_url(scope) + METADATA_PATH + MCP_PATH
        message = scope.pop(DECODED_BODY, _UNDECODED)
        if message is _UNDECODED:
            message = _decoded(body)
        try:
            principal = self.principal_of(authorization)
        except Unauthenticated as e:
            presented = bool(authorization and authorization.partition(" ")[2].strip())
            www = challenge(e, metadata, token_presented=presented)
            await _send_error(send, e, _request_id(message), www)
            return
        scope.setdefault("state", {})[_PRINCIPAL] = principal
        if self.observe is not None:
            self.observe(message, principal)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        if (
            self.streaming is not None
            and self.streams is not None
            and _accepts_sse(scope)
            and self.streams(message, principal)
        ):
            await self.streaming(scope, replay, send)
            return
        await self.app(scope, replay, _AuthStatus(send, metadata))


class _AuthStatus:
    """``send`` that holds a JSON response back and, when it is a JSON-RPC auth error
    (insufficient_scope, unauthenticated), sends it with its HTTP status and challenge."""

    def __init__(self, send: Send, metadata: str) -> None:
        self.send = send
        self.metadata = metadata
        self.start: Message | None = None
        self.chunks: list[bytes] = []

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if _content_type(message).startswith(b"application/json"):
                self.start = message
                return
        elif message["type"] == "http.response.body" and self.start is not None:
            self.chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(self.chunks)
            start, self.start = self.start, None
            await self.send(self._with_status(start, body))
            await self.send({"type": "http.response.body", "body": body})
            return
        await self.send(message)

    def _with_status(self, start: Message, body: bytes) -> Message:
        if not any(code.encode() in body for code in _AUTH_CODES):
            return start  # nearly every answer: no need to decode it
        try:
            error = json.loads(body).get("error")
            data = error.get("data") or {}
            code = data.get("code")
        except (ValueError, AttributeError):
            return start
        if code not in _AUTH_CODES:
            return start
        e = AgentboxError.from_dict({**data, "message": error.get("message", "")})
        www = challenge(e, self.metadata)
        headers = [*start.get("headers", []), (b"www-authenticate", str(www).encode())]
        return {**start, "status": e.http_status, "headers": headers}


def _accepts_sse(scope: Scope) -> bool:
    return any(k == b"accept" and b"text/event-stream" in v for k, v in scope["headers"])


def _content_type(message: Message) -> bytes:
    for key, value in message.get("headers", []):
        if key.lower() == b"content-type":
            return bytes(value).lower()
    return b""


def _decoded(body: bytes) -> Any:
    """A POST's body decoded, None when it is not JSON (or there is none)."""
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def _request_id(message: Any) -> Any:
    """The JSON-RPC id of a decoded request (null when it has none)."""
    return message.get("id") if isinstance(message, dict) else None


async def _send_error(send: Send, e: AgentboxError, request_id: Any, www: str | None) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": request_id, "error": jsonrpc_error(e)}).encode()
    headers = [(b"content-type", b"application/json")]
    if www is not None:
        headers.append((b"www-authenticate", www.encode()))
    await send({"type": "http.response.start", "status": e.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
