"""``agentbox node``: the single-host gateway app on the node's own runtime, served on
``cluster.node.listen`` with mutual TLS only, plus ``GET /node/v1/status`` and the
heartbeat thread.

The node keeps its runtime's records in its home (SQLite, as on one host): only the
registry row (which node runs a sandbox) is shared. Tokens, approvals, usage and tasks
are the shared PostgreSQL tables, so a token minted through any replica works here.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agentbox.cluster.audit_chain import ChainShipper
from agentbox.cluster.heartbeat import Heartbeat
from agentbox.cluster.node_client import IDLE_S
from agentbox.cluster.node_runtime import NodeRuntime
from agentbox.cluster.registry import Registry
from agentbox.config.settings import GatewaySettings
from agentbox.errors import InvalidConfig
from agentbox.gateway.app import GatewayApp, create_app
from agentbox.state import open_shared


def create_node_app(
    settings: GatewaySettings, *, operator_token: str, home: Path
) -> tuple[GatewayApp, Heartbeat]:
    cluster = settings.cluster
    if cluster is None or cluster.node is None:
        raise InvalidConfig(
            "agentbox node needs a cluster section with cluster.node (id, listen, "
            "advertise): see docs/cluster.md"
        )
    node = cluster.node
    db = open_shared(settings.gateway.state)
    assert db is not None  # settings refuse cluster: without postgresql
    runtime = NodeRuntime(home, Registry(db), node.id)
    # Gateways name the node by its advertised host; the node API has no TLS setting of
    # its own (it is always the cluster's mutual TLS).
    section = settings.gateway.model_copy(
        update={
            "listen": node.listen,
            "allowed_hosts": [*settings.gateway.allowed_hosts, urlsplit(node.advertise).netloc],
            "tls": None,
        }
    )
    app = create_app(
        settings.model_copy(update={"gateway": section}),
        operator_token=operator_token,
        home=home,
        runtime=runtime,
    )
    warm = settings.sandbox.warm_pool
    sizes = warm if isinstance(warm, dict) else {settings.sandbox.template: warm}
    heartbeat = Heartbeat(
        runtime, node.advertise, node.labels, cluster.heartbeat_seconds,
        {name: size for name, size in sizes.items() if size > 0},
    )  # fmt: skip
    # The node's own audit chain (its home's log, as on one host), copied to the cluster's
    # database for `agentbox audit verify --cluster`; the CLI starts and stops it.
    app.state.audit_chain = ChainShipper(
        db, app.state.parts.audit, f"node:{node.id}", "node", cluster.heartbeat_seconds
    )

    @app.get("/node/v1/status", tags=["cluster"])
    async def status() -> dict[str, Any]:
        """This node: its id and sandboxes (the node API is reachable with mutual TLS only)."""
        records = runtime.store.list()
        return {"id": node.id, "sandboxes": [r.id for r in records if r.state != "pooled"]}

    return app, heartbeat


def uvicorn_tls(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn's keyword arguments for the node API: the node's certificate, and a client
    certificate signed by the cluster CA required of every connection."""
    cluster = settings.cluster
    assert cluster is not None
    return {
        "ssl_certfile": str(cluster.cert_file),
        "ssl_keyfile": str(cluster.key_file),
        "ssl_ca_certs": str(cluster.ca_file),
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        # Longer than the replicas keep an idle connection (node_client.IDLE_S): the
        # replica closes first, so it never sends on a connection the node just closed.
        "timeout_keep_alive": int(IDLE_S) + 60,
    }
