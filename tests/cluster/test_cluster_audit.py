"""Audit across a cluster: each replica and node keeps its own hash chain, copied into
PostgreSQL; `agentbox audit verify --cluster` checks every chain and reports gaps (a
record altered, a truncated tail, a replica whose chain stopped)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from clusterkit import AGENTBOX, Cluster, wait_for

from agentbox.audit.log import canonical_json, record_hash
from agentbox.state.postgres import PostgresDB


def verify(cluster: Cluster) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [AGENTBOX, "audit", "verify", "--cluster", "--config", str(cluster.base / "gw-1.yaml"),
         "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def chains(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["chain"]: c for c in result["chains"]}


def replica_chain(cluster: Cluster, gateway: str) -> str:
    port = cluster.gateway_urls[gateway].rpartition(":")[2]
    rows = (
        cluster_db(cluster)
        .conn()
        .execute("SELECT id FROM audit_chains WHERE id LIKE ?", (f"replica:%-{port}",))
    )
    (chain,) = [r[0] for r in rows]
    return str(chain)


_DBS: dict[str, PostgresDB] = {}


def cluster_db(cluster: Cluster) -> PostgresDB:
    if cluster.state_url not in _DBS:
        _DBS[cluster.state_url] = PostgresDB(cluster.state_url)
    return _DBS[cluster.state_url]


@pytest.fixture
def shipped(cluster: Cluster) -> Iterator[dict[str, int]]:
    """Requests through both replicas, each replica's chain copied that far."""
    want = {}
    for gateway in cluster.gateways:
        with cluster.client(gateway) as c:
            for path in ("/v1/sandboxes", "/v1/tokens", "/v1/sandboxes/sbx-nope"):
                c.get(path)
        audit = cluster.gateways[gateway].home / "audit" / "audit.jsonl"
        want[replica_chain(cluster, gateway)] = len(audit.read_bytes().splitlines())
    db = cluster_db(cluster)

    def copied() -> bool:
        rows = db.conn().execute("SELECT id, head_seq FROM audit_chains")
        heads = {r[0]: int(r[1]) for r in rows}
        return all(heads.get(chain, 0) >= n for chain, n in want.items())

    wait_for("replica chains copied", copied, timeout=30)
    yield want


def test_verify_passes_on_a_healthy_cluster(cluster: Cluster, shipped: dict[str, int]) -> None:
    code, result = verify(cluster)
    found = chains(result)
    assert code == 0 and result["ok"], result
    assert {f"node:{n}" for n in cluster.nodes} <= found.keys()
    for chain, records in shipped.items():
        assert found[chain]["records"] >= records >= 3
        assert found[chain]["kind"] == "replica" and not found[chain]["closed"]
    # A routed request's record names its node; a refused one says so.
    lines = (cluster.gateways["gw-1"].home / "audit" / "audit.jsonl").read_bytes().splitlines()
    records = [json.loads(line) for line in lines]
    assert any(r["decision"] == "routed" and r["node"] for r in records)
    assert any(r["error"] == "sandbox_not_found" and r["status"] == 404 for r in records)


def test_a_tampered_record_is_reported(cluster: Cluster, shipped: dict[str, int]) -> None:
    chain = replica_chain(cluster, "gw-1")
    db = cluster_db(cluster)
    (line,) = (
        db.conn()
        .execute("SELECT line FROM audit_records WHERE chain = ? AND seq = 2", (chain,))
        .fetchone()
    )
    record = json.loads(line)
    record["status"] = 200 if record["status"] != 200 else 201
    forged = canonical_json(record).decode()
    db.conn().execute(
        "UPDATE audit_records SET line = ? WHERE chain = ? AND seq = 2", (forged, chain)
    )
    try:
        code, result = verify(cluster)
        bad = chains(result)[chain]
        assert code == 1 and not result["ok"]
        assert bad["first_bad"] == 2 and "hash mismatch" in bad["problems"][0], bad
        others = [c for c in result["chains"] if c["chain"] != chain]
        assert all(c["ok"] for c in others), others
        # A forger who also recomputes the hash breaks the next record's link instead.
        record["hash"] = record_hash(record)
        db.conn().execute(
            "UPDATE audit_records SET line = ? WHERE chain = ? AND seq = 2",
            (canonical_json(record).decode(), chain),
        )
        code, result = verify(cluster)
        bad = chains(result)[chain]
        assert code == 1 and bad["first_bad"] == 3 and "prev does not match" in bad["problems"][0]
    finally:
        db.conn().execute(
            "UPDATE audit_records SET line = ? WHERE chain = ? AND seq = 2", (line, chain)
        )
    assert verify(cluster)[0] == 0


def test_a_truncated_chain_is_reported(cluster: Cluster, shipped: dict[str, int]) -> None:
    chain = replica_chain(cluster, "gw-2")
    db = cluster_db(cluster)
    head = int(db.conn().execute("SELECT head_seq FROM audit_chains WHERE id = ?", (chain,))
               .fetchone()[0])  # fmt: skip
    tail = (
        db.conn()
        .execute(
            "DELETE FROM audit_records WHERE chain = ? AND seq > ? RETURNING seq, line",
            (chain, head - 2),
        )
        .fetchall()
    )
    assert len(tail) == 2
    try:
        code, result = verify(cluster)
        bad = chains(result)[chain]
        assert code == 1 and bad["first_bad"] == head - 1
        assert bad["problems"][0].startswith("truncated:"), bad
        assert f"records {head - 1}..{head} were removed" in bad["problems"][0]
        # A hole in the middle reads as records missing there.
        db.conn().execute(
            "INSERT INTO audit_records (chain, seq, line) VALUES (?, ?, ?)",
            (chain, *next(row for row in tail if row[0] == head)),
        )
        bad = chains(verify(cluster)[1])[chain]
        assert f"seq jumps from {head - 2} to {head}" in bad["problems"][0], bad
    finally:
        db.conn().execute(
            "DELETE FROM audit_records WHERE chain = ? AND seq > ?", (chain, head - 2)
        )
        for seq, line in tail:
            db.conn().execute(
                "INSERT INTO audit_records (chain, seq, line) VALUES (?, ?, ?)", (chain, seq, line)
            )
    assert verify(cluster)[0] == 0


def test_a_replica_whose_chain_stopped_is_reported(
    cluster: Cluster, shipped: dict[str, int]
) -> None:
    chain = replica_chain(cluster, "gw-2")
    cluster.gateways["gw-2"].kill9()
    try:
        # Its chain is neither closed nor advanced: after lost_after_seconds it is a gap.
        def stopped() -> dict[str, Any] | None:
            code, result = verify(cluster)
            bad = chains(result)[chain]
            return bad if code == 1 and bad["problems"] else None

        bad = wait_for("the stopped chain reported", stopped, timeout=30)
        assert bad["problems"][0].startswith("stopped:"), bad
        assert not bad["closed"]
    finally:
        cluster.start_gateway("gw-2")
    # Back with its home, it resumes the same chain: nothing missing, nothing stopped.
    wait_for("the chain resumed", lambda: verify(cluster)[0] == 0, timeout=30)
