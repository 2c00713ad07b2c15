"""Egress mode ask across a cluster: a node's egress daemon files the approval in the
shared state database, so a person sees it through any replica and decides there, and
the held connection on the node gets that answer."""

from __future__ import annotations

import concurrent.futures
import secrets
import time
from typing import Any

from clusterkit import Cluster, wait_for

from agentbox.audit.log import read_records
from agentbox.egressd import daemon as egressd


def test_an_egress_approval_is_decided_through_any_replica(cluster: Cluster) -> None:
    name = f"asked-{secrets.token_hex(3)}.test"
    body = {"memory": "256MiB", "disk": "64MiB", "network": {"mode": "ask", "ask_timeout": 90}}
    with cluster.client("gw-1") as c:
        created = c.post("/v1/sandboxes", json=body)
        assert created.status_code == 201, created.text
        sandbox = created.json()["id"]
        node = {r["id"]: r["node"] for r in c.get("/v1/sandboxes").json()}[sandbox]
    curl = f"curl -sS --max-time 90 -o /dev/null -w '%{{http_code}}' http://{name}/"

    def run() -> Any:
        with cluster.client("gw-1") as c:
            r = c.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": curl})
            assert r.status_code == 200, r.text
            return r.json()

    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool, cluster.client("gw-2") as other:
            held = pool.submit(run)

            def pending() -> list[dict[str, Any]]:
                found = other.get("/v1/approvals", params={"status": "pending"}).json()
                return [a for a in found if a["sandbox"] == sandbox]

            (approval,) = wait_for("the approval through the other replica", pending, 60)
            assert approval["tool"] == "egress" and name in approval["summary"]
            assert not held.done()
            decided = other.post(f"/v1/approvals/{approval['id']}/deny")
            assert decided.status_code == 200, decided.text
            result = held.result(120)
        assert result["stdout"].strip() == "403", result
        home = cluster.nodes[node].home
        deadline = time.monotonic() + 60
        while True:  # the daemon records the decision as the connection ends
            records = [r for r in read_records(egressd.audit_path(home), limit=None)
                       if r["sandbox"] == sandbox and r["decision"] == "egress_approval_decided"]  # fmt: skip
            if records or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert [(r["outcome"], r["by"]) for r in records] == [("denied", "operator")]
    finally:
        with cluster.client("gw-1") as c:
            c.delete(f"/v1/sandboxes/{sandbox}")
