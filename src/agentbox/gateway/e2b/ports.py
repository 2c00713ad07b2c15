"""``sandbox.get_host(port)`` is ``PORT-ID.DOMAIN``: requests with that Host reach the port.

An ASGI layer in front of the gateway's own guard: a Host under ``e2b.domain`` naming a
port and a sandbox goes to the gateway's port forward (``gateway/port_forward.py``), as
the key that made the sandbox, audited as ``ports``; anything else goes on unchanged.
The request must carry the sandbox's token (``e2b-traffic-access-token``, the
``trafficAccessToken`` of the create answer, or ``X-Access-Token``): unlike E2B's
default, ports are never public. The body is capped like every gateway request.

The same layer serves the SDKs' signed ``download_url``/``upload_url``: the SDKs join
``/files`` to the gateway's root (dropping ``/e2b``), and such a URL has no sandbox
header; the signature names the sandbox (``envd.Envd._signed``).
"""

from __future__ import annotations

import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from agentbox.errors import AgentboxError, LimitExceeded
from agentbox.gateway import port_forward
from agentbox.gateway.e2b.access import E2BAccess
from agentbox.gateway.e2b.models import e2b_error, e2b_error_response
from agentbox.gateway.service import Gateway


class PortHosts:
    def __init__(
        self, app: ASGIApp, e2b: ASGIApp, gateway: Gateway, access: E2BAccess, domain: str,
        max_body: int,
    ) -> None:  # fmt: skip
        self.app, self.e2b, self.gateway, self.access = app, e2b, gateway, access
        self.max_body = max_body
        self.pattern = host_pattern(domain)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = port_host(scope, self.pattern)
        if match is None and signed_files(scope):
            length = dict(scope["headers"]).get(b"content-length", b"0")
            if not length.isdigit() or int(length) > self.max_body:
                too_big = e2b_error(413, f"the body must have a length under {self.max_body}")
                await JSONResponse(too_big, 413)(scope, receive, send)
                return
            await self.e2b(scope, receive, send)
            return
        if match is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await self._forward(request, int(match[1]), match[2])
        except AgentboxError as e:
            response = e2b_error_response(e)
        await response(scope, receive, send)

    async def _forward(self, request: Request, port: int, sandbox_id: str) -> Response:
        token = request.headers.get("e2b-traffic-access-token") or request.headers.get(
            "x-access-token"
        )
        caller = self.access.envd_caller(sandbox_id, token)
        if not 0 < port < 65536:
            return JSONResponse(e2b_error(400, f"port {port} is out of range"), 400)
        principal = caller.principal(sandbox_id)
        self.gateway.rate.check(principal.actor)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body:
                raise LimitExceeded(f"request body over {self.max_body} bytes")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [
            (k, v)
            for k, v in request.headers.items()
            if k not in ("e2b-traffic-access-token", "x-access-token")
        ]
        return await port_forward.forward(
            self.gateway, principal, sandbox_id, port, request.method, target, headers, bytes(body)
        )


def host_pattern(domain: str) -> re.Pattern[str]:
    """``PORT-ID.DOMAIN`` (any port after it): groups port and sandbox id."""
    return re.compile(rf"^([0-9]{{1,5}})-(sb-[0-9a-f]+)\.{re.escape(domain.lower())}(?::[0-9]+)?$")


def port_host(scope: Scope, pattern: re.Pattern[str]) -> re.Match[str] | None:
    """The match of an HTTP request's Host against ``pattern`` (None: not a port host)."""
    if scope["type"] != "http":
        return None
    for key, value in scope["headers"]:
        if key == b"host":
            return pattern.match(value.decode("latin-1").lower())
    return None


def signed_files(scope: Scope) -> bool:
    return bool(
        scope["type"] == "http"
        and scope["path"] == "/files"
        and b"signature=" in scope.get("query_string", b"")
    )
