"""A cluster replica reads the node list once per heartbeat interval, not once per create:
at 1,000 nodes the per-create read of every node row was the first thing the simulation
(bench/sim_cluster.py, docs/scale.md) saturated. Real PostgreSQL (tests/pgkit.py), the
real replica app driven over ASGI; the nodes are rows whose addresses refuse connections,
so each create fails over to the next node and ends ``node_unreachable``."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import Iterator

import pytest

from agentbox.cluster.gateway_app import ClusterGateway
from agentbox.cluster.node_client import NodeClient
from agentbox.cluster.registry import Node, Registry
from agentbox.gateway.auth import TokenStore
from agentbox.state.postgres import PostgresDB, migrate
from pgkit import PgServer

TOKEN = "operator-token-for-the-test"


class CountingRegistry(Registry):
    """The real registry, counting its node-list reads."""

    reads = 0

    def nodes(self) -> list[Node]:
        self.reads += 1
        return super().nodes()


@pytest.fixture
def db(postgres: PgServer) -> Iterator[PostgresDB]:
    url = postgres.new_database()
    migrate(url)
    database = PostgresDB(url)
    yield database
    database.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens once the socket closes


async def create(app: ClusterGateway) -> int:
    body = json.dumps({"template": "default"}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/sandboxes",
        "raw_path": b"/v1/sandboxes",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {TOKEN}".encode())],
    }
    sent: list[dict[str, object]] = []

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await app(scope, receive, send)  # type: ignore[arg-type]
    return int(sent[0]["status"])  # type: ignore[call-overload]


def test_a_burst_of_creates_reads_the_node_list_once(db: PostgresDB) -> None:
    registry = CountingRegistry(db)
    for i in range(3):
        address = f"https://127.0.0.1:{closed_port()}"
        registry.heartbeat(f"n{i}", address, {}, {"sandboxes": 0, "templates": ["default"]})
    app = ClusterGateway(
        db,
        TokenStore(db, TOKEN, 3600),
        NodeClient(ssl.create_default_context()),
        # A long interval: the burst below fits in one whatever the host's speed (the
        # heartbeat ages the rows were written with stay well inside lost_after).
        heartbeat_seconds=3600.0,
        lost_after_seconds=10.0,
    )
    app.registry = registry

    async def burst() -> list[int]:
        try:
            return [await create(app) for _ in range(20)]
        finally:
            await app.nodes.aclose()

    statuses = asyncio.run(burst())
    assert statuses == [503] * 20  # every node refused: node_unreachable, nothing made
    assert registry.reads == 1
