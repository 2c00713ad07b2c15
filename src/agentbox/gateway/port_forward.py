"""``/v1/sandboxes/{id}/ports/{port}/{path}``: HTTP to a service inside a sandbox.

The request is re-sent, as HTTP/1.1 with ``Connection: close``, over a socket created in
the sandbox's network namespace (``network/ports.py``) to 127.0.0.1:port there; the
response streams back. The caller's ``Authorization`` header (a gateway token) and
hop-by-hop headers are never forwarded; ``h11`` does the HTTP framing on the sandbox side
(a service in the sandbox is untrusted: its response is parsed strictly and bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import h11
from starlette.responses import StreamingResponse

from agentbox.errors import SandboxError
from agentbox.network import ports

if TYPE_CHECKING:
    from agentbox.gateway.service import Gateway
    from agentbox.policy.principal import Principal

HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "authorization", "content-length",
    }
)  # fmt: skip
_READ = 256 * 1024
MAX_HEAD = 64 * 1024


def request_head(
    method: str, target: str, port: int, headers: list[tuple[str, str]], body: bytes
) -> h11.Request:
    kept = [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]
    kept += [
        ("Host", f"127.0.0.1:{port}"),
        ("Connection", "close"),
        ("Content-Length", str(len(body))),
    ]
    return h11.Request(method=method, target=target or "/", headers=kept)


class Upstream:
    """One request/response exchange with the sandbox's service over ``sock``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD)
        self.bytes_down = 0

    async def send(self, request: h11.Request, body: bytes) -> None:
        self.writer.write(self.conn.send(request) or b"")
        if body:
            self.writer.write(self.conn.send(h11.Data(data=body)) or b"")
        self.writer.write(self.conn.send(h11.EndOfMessage()) or b"")
        await self.writer.drain()

    async def _event(self) -> h11.Event:
        while True:
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as e:
                raise SandboxError(f"the service in the sandbox sent invalid HTTP: {e}") from None
            if event is not h11.NEED_DATA:
                return event  # type: ignore[return-value]
            data = await self.reader.read(_READ)
            self.conn.receive_data(data)

    async def response(self) -> h11.Response:
        event = await self._event()
        while isinstance(event, h11.InformationalResponse):
            event = await self._event()
        if not isinstance(event, h11.Response):
            raise SandboxError("the service in the sandbox closed without answering")
        return event

    async def body(self) -> AsyncIterator[bytes]:
        try:
            while True:
                event = await self._event()
                if isinstance(event, h11.Data):
                    self.bytes_down += len(event.data)
                    yield bytes(event.data)
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return
        finally:
            self.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.writer.close()


def response_headers(response: h11.Response) -> dict[str, str]:
    return {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in response.headers
        if k.decode("latin-1").lower() not in HOP_BY_HOP
    }


async def forward(
    gateway: Gateway, principal: Principal, sandbox_id: str, port: int, method: str,
    target: str, headers: list[tuple[str, str]], body: bytes,
) -> StreamingResponse:  # fmt: skip
    """One request to ``port`` in the sandbox, audited as ``ports``; the response streams.
    The caller has checked that ``principal`` may reach the sandbox's ports."""
    record = gateway.runtime.running(sandbox_id)[0]
    assert record.init_pid is not None
    if record.isolation == "gvisor" and record.spec.network.mode == "none":
        # With a network, the Sentry's sockets are host sockets in the sandbox's netns
        # (runsc --network=host there), reached as on the default tier; with none, its
        # loopback is gVisor's own: a host socket finds no route (measured: ENETUNREACH).
        from agentbox.errors import TierUnsupported

        raise TierUnsupported(
            "port forwarding to a gvisor sandbox with network none: its loopback is "
            "gVisor's own, out of the host's reach; create the sandbox with network "
            "allowlist or open (or isolation namespaces)",
            tier="gvisor",
            feature="port forwarding",
        )
    head = request_head(method, target, port, headers, body)
    sock = await asyncio.to_thread(ports.connect_to_port, record.init_pid, port)
    reader, writer = await asyncio.open_connection(sock=sock)
    upstream = Upstream(reader, writer)
    try:
        await upstream.send(head, body)
        response = await upstream.response()
    except BaseException:
        upstream.close()
        raise
    await gateway.audit_event(
        principal, "allowed", sandbox=sandbox_id, tool="ports",
        args={"port": port, "method": method, "path": target},
        status=response.status_code,
    )  # fmt: skip
    return StreamingResponse(
        upstream.body(), status_code=response.status_code, headers=response_headers(response)
    )
