"""A replica keeps a connection open to every node of a large cluster: placement spreads
creates over all nodes, so a pool smaller than the cluster (or one that drops connections
idle for a few seconds) re-does a mutual-TLS handshake for almost every create (bench/sim_cluster.py, docs/scale.md). Real TLS listeners on
loopback with the node API's context (``pki.server_context``), the replica's real client."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agentbox.cluster import pki
from agentbox.cluster.node_client import NodeClient

NODES = 250  # more than the 200 idle connections the pool used to keep


def test_a_second_round_over_every_node_opens_no_connection(tmp_path: Path) -> None:
    pki.init_ca(tmp_path)
    pki.issue(tmp_path, "node", "node", ["127.0.0.1"])
    pki.issue(tmp_path, "gw", "gateway", [])
    server_tls = pki.server_context(
        tmp_path / "ca.pem", tmp_path / "node.pem", tmp_path / "node.key"
    )
    client_tls = pki.client_context(tmp_path / "ca.pem", tmp_path / "gw.pem", tmp_path / "gw.key")
    accepted = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[0] += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                body = b'{"status": "ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def run() -> tuple[int, int]:
        servers = [
            await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_tls) for _ in range(NODES)
        ]
        addresses = [f"https://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers]
        client = NodeClient(client_tls)
        try:
            for address in addresses:
                assert (await client.get_json(address, "/healthz", []))[0] == 200
            first = accepted[0]
            for address in addresses:
                assert (await client.get_json(address, "/healthz", []))[0] == 200
            return first, accepted[0] - first
        finally:
            await client.aclose()
            for s in servers:
                s.close()

    first, again = asyncio.run(run())
    assert first == NODES
    assert again == 0
