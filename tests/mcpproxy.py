"""A header-adding reverse proxy in front of a gateway, for MCP tools that cannot send a
bearer token (the conformance suite, the Inspector CLI in some modes).

It adds ``Authorization: Bearer <token>`` and rewrites a Host or Origin naming the proxy
itself to the gateway's own address, so the gateway sees what a client talking to it
directly would send; any other Host or Origin (``evil.example.com``) passes unchanged, so
the gateway's DNS-rebinding checks still judge it. Responses (SSE included) are streamed.
Header values are forwarded without their surrounding whitespace, as RFC 9110 lets a
recipient read them (the HTTP client refuses to send trailing OWS); the gateway's own
handling of it is tested directly: test_gateway_mcp.py,
test_header_values_are_read_without_surrounding_whitespace.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx2
import uvicorn
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway_harness import free_port

_HOP = {b"host", b"origin", b"authorization", b"content-length", b"connection",
        b"transfer-encoding", b"keep-alive"}  # fmt: skip
_HOP_OUT = {"content-length", "transfer-encoding", "connection", "keep-alive"}


class _Proxy:
    def __init__(self, own: str, upstream: str, token: str) -> None:
        self.own = own  # host:port the proxy listens on
        self.upstream = upstream  # host:port of the gateway
        self.token = token

    def _rewrite(self, value: str) -> str:
        for scheme in ("http://", ""):
            if value == scheme + self.own:
                return scheme + self.upstream
        return value

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        headers = [(k, v.strip(b" \t")) for k, v in scope["headers"] if k.lower() not in _HOP]
        for key in (b"host", b"origin"):
            for k, v in scope["headers"]:
                if k.lower() == key:
                    headers.append((key, self._rewrite(v.decode("latin-1")).encode("latin-1")))
        headers.append((b"authorization", f"Bearer {self.token}".encode()))
        url = f"http://{self.upstream}{scope['path']}"
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        # A client per request, closed with its response: nothing outlives the server.
        client = httpx2.AsyncClient(timeout=httpx2.Timeout(600, connect=10))
        upstream = client.build_request(
            scope["method"], url, headers=headers, content=await request.body()
        )
        response = await client.send(upstream, stream=True)

        async def close() -> None:
            await response.aclose()
            await client.aclose()

        async def body() -> AsyncIterator[bytes]:
            async for chunk in response.aiter_raw():
                yield chunk

        out = {k: v for k, v in response.headers.items() if k.lower() not in _HOP_OUT}
        await StreamingResponse(
            body(), response.status_code, out, background=BackgroundTask(close)
        )(scope, receive, send)


@contextlib.contextmanager
def auth_proxy(gateway_port: int, token: str) -> Iterator[str]:
    """The proxy on a free loopback port; yields its MCP URL."""
    port = free_port()
    app = _Proxy(f"127.0.0.1:{port}", f"127.0.0.1:{gateway_port}", token)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the proxy thread died at start"
        assert time.monotonic() < deadline, "the proxy did not start within 30 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.should_exit = True
        thread.join(30)
