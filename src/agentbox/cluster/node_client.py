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

_PER_NODE = 256  # concurrent requests to one node (streams included)
_IDLE_PER_NODE = 16
IDLE_S = 240.0


def forwarded_headers(raw: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower() not in _DROP]


class NodeClient:
    """One small pool per node, not one pool for the cluster: httpx's pool walks (and polls
    the socket of) every connection it holds on each request it assigns, quadratically in
    part, so a single pool with an idle connection per node spent ~30 ms of CPU per request
    at 1,000 nodes (docs/scale.md). Per node, a request looks at that node's few
    connections only; each stays idle up to ``IDLE_S`` (the node keeps it longer,
    node_api.py), so a create placed on any node reuses its connection."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self._pools: dict[str, httpx2.AsyncClient] = {}

    def _pool(self, address: str) -> httpx2.AsyncClient:
        pool = self._pools.get(address)
        if pool is None:
            pool = self._pools[address] = httpx2.AsyncClient(
                verify=self.context,
                # No read timeout: a command or an event stream runs as long as it runs;
                # the node's own limits end it.
                timeout=httpx2.Timeout(connect=5.0, read=None, write=60.0, pool=60.0),
                limits=httpx2.Limits(
                    max_connections=_PER_NODE, max_keepalive_connections=_IDLE_PER_NODE,
                    keepalive_expiry=IDLE_S,
                ),
            )  # fmt: skip
        return pool

    async def open(
        self,
        address: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes],
        node: str,
        host: bytes | None = None,
    ) -> httpx2.Response:
        """The node's response, headers read and body still streaming (close it).
        ``host``: the Host to send instead of the node's (an E2B port host, which the
        node routes by; TLS still checks the node's own name).
        Raises NodeUnreachable when no connection could be made (nothing was sent)."""
        http = self._pool(address)
        sent = forwarded_headers(headers) + ([(b"host", host)] if host else [])
        request = http.build_request(method, address + target, headers=sent, content=body)
        try:
            return await http.send(request, stream=True)
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
        response = await self._pool(address).get(address + path, headers=forwarded_headers(headers))
        return response.status_code, response.json()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
