"""A gateway's connections to the nodes: one HTTP/1.1 pool over mutual TLS (the
gateway's certificate out, only nodes signed by the cluster CA and named for the
address they advertise accepted)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from agentbox.errors import NodeUnreachable

# Hop-by-hop headers (RFC 9110 7.6.1) and those the gateway sets itself: Host names the
# node, Origin was checked here (the node's allow-list knows only its own address).
_DROP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
    b"origin",
    b"content-length",
}

_POOL = 4096
IDLE_S = 240.0


def forwarded_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _DROP]


class NodeClient:
    def __init__(self, context: ssl.SSLContext) -> None:
        self.http = httpx2.AsyncClient(
            verify=context,
            # No read timeout: a command or an event stream runs as long as it runs; the
            # node's own limits end it.
            timeout=httpx2.Timeout(connect=5.0, read=None, write=60.0, pool=60.0),
            # An idle connection kept per node, for minutes: placement spreads creates over
            # every node, so a pool smaller than the cluster, or one that drops a connection
            # idle for 5 s, re-did a mutual-TLS handshake for almost every create at 1,000
            # nodes (docs/scale.md). The node keeps them longer still (node_api.py).
            limits=httpx2.Limits(
                max_connections=_POOL, max_keepalive_connections=_POOL, keepalive_expiry=IDLE_S
            ),
        )

    async def open(
        self,
        address: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes],
        node: str,
    ) -> httpx2.Response:
        """The node's response, headers read and body still streaming (close it).
        Raises NodeUnreachable when no connection could be made (nothing was sent)."""
        request = self.http.build_request(
            method, address + target, headers=forwarded_headers(headers), content=body
        )
        try:
            return await self.http.send(request, stream=True)
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as e:
            raise NodeUnreachable(
                f"cluster node {node} ({address}) did not answer: retry shortly; if it "
                "stays down its sandboxes are declared lost",
                node=node,
                retry_after=1,
                delivered=False,
            ) from e
        except httpx2.TransportError as e:  # sent, then cut: the node may have acted
            raise NodeUnreachable(
                f"cluster node {node} ({address}) dropped the connection: {e}; retry",
                node=node,
                retry_after=1,
                delivered=True,
            ) from e

    async def get_json(self, address: str, path: str, headers: list[tuple[bytes, bytes]]) -> Any:
        response = await self.http.get(address + path, headers=forwarded_headers(headers))
        return response.status_code, response.json()

    async def aclose(self) -> None:
        await self.http.aclose()
