"""Warm pools per node, claimed cluster-wide: a node keeps its own warm pool and reports
it in its heartbeat (size, and the warm sandboxes a create can claim); a plain create
through any replica goes to a node with a warm sandbox and claims it there, in the
node's own transaction, so creates through both replicas at once never get the same
one. Its own cluster (two nodes, only node-2 with a pool) so the other scenarios'
placement is not steered."""

from __future__ import annotations

import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from clusterkit import Cluster, destroy_all, placed, running_cluster, wait_for

from agentbox.client.remote import GatewayClient, RemoteRuntime
from pgkit import PgServer

NODE, SIZE = "node-2", 2


@pytest.fixture(scope="module")
def pooled(postgres: PgServer, agentbox_home: Path, host_ready: None) -> Iterator[Cluster]:
    agentbox_home.chmod(0o711)  # node homes live under it
    base = agentbox_home / f"cluster-pool-{secrets.token_hex(4)}"
    with running_cluster(
        postgres.new_database(), base, nodes=2, gateways=2, warm={NODE: SIZE}
    ) as running:
        yield running
    subprocess.run(["rm", "-rf", "--one-file-system", str(base)], check=False)


def reported(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """Each node's pools as its last heartbeat gave them to the replicas."""
    return {row["id"]: row["capacity"]["pools"] for row in cluster.nodes_table()}


def on_disk(cluster: Cluster, node: str) -> list[str]:
    """The node's warm sandboxes as its own store holds them, oldest first."""
    db = sqlite3.connect(cluster.nodes[node].home / "state.db")
    try:
        rows = db.execute("SELECT id FROM sandboxes WHERE state='pooled' ORDER BY created_at")
        return [str(r[0]) for r in rows]
    finally:
        db.close()


def full_pool(cluster: Cluster) -> list[str]:
    """Wait until NODE's pool is full and its heartbeat reports exactly what its store
    holds; the warm sandboxes' ids, oldest first."""

    def check() -> list[str] | None:
        pools = reported(cluster)
        held = on_disk(cluster, NODE)
        if pools[NODE] == [{"template": "default", "size": SIZE, "ready": SIZE, "ids": held}]:
            return held
        return None

    held = wait_for(f"{NODE}'s warm pool full and reported", check)
    assert reported(cluster)["node-1"] == []  # no pool there, none reported
    return list(held)


def create(cluster: Cluster, gateway: str, spec: dict[str, Any]) -> dict[str, Any]:
    with cluster.client(gateway) as c:
        answer = c.post("/v1/sandboxes", json=spec)
        assert answer.status_code == 201, answer.text
        return dict(answer.json())


def test_a_create_through_replica_b_claims_the_warm_one_on_its_node(pooled: Cluster) -> None:
    warm = full_pool(pooled)
    # Through gw-2 (node-1 is as empty; only the pool makes node-2 the place).
    first = create(pooled, "gw-2", {"env": {"WHO": "first"}})
    second = create(pooled, "gw-2", {})
    assert [first["id"], second["id"]] == warm  # the oldest first, each once
    assert first["from_pool"] and second["from_pool"]
    nodes = placed(pooled)
    assert nodes[first["id"]] == nodes[second["id"]] == NODE
    rt = RemoteRuntime(GatewayClient(pooled.gateway_urls["gw-1"], pooled.token, timeout=120))
    try:  # a claimed one is the create's: its environment, reachable through the other replica
        assert rt.commands(first["id"]).run("echo $WHO").stdout == "first\n"
        assert rt.get(first["id"]).from_pool  # the SDK's record says so too
    finally:
        rt.client.close()
    # A create naming a launch-time setting is not steered by the pool (it may not match).
    fixed = create(pooled, "gw-1", {"memory": "256m"})
    assert not fixed["from_pool"]
    refilled = full_pool(pooled)  # the node tops its pool up; the report follows
    assert not set(refilled) & set(warm)
    destroy_all(pooled, [first["id"], second["id"], fixed["id"]])


def test_concurrent_creates_through_both_replicas_never_share_a_warm_one(pooled: Cluster) -> None:
    warm = full_pool(pooled)
    gateways = ["gw-1", "gw-2"] * 3
    with ThreadPoolExecutor(len(gateways)) as pool:
        made = list(pool.map(lambda gw: create(pooled, gw, {}), gateways))
    ids = [m["id"] for m in made]
    claimed = [m["id"] for m in made if m["from_pool"]]
    print(f"\n[cluster] warm pool: {len(claimed)} of {len(made)} concurrent creates claimed")
    assert len(set(ids)) == len(ids)  # no warm sandbox handed to two creates
    assert set(warm) <= set(claimed)  # both replicas sent creates to the warm ones
    nodes = placed(pooled)
    assert all(nodes[sandbox] == NODE for sandbox in claimed)
    destroy_all(pooled, ids)
    full_pool(pooled)
