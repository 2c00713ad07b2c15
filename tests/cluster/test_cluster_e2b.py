"""The unmodified E2B Python SDK against a replica's ``/e2b``: creates placed on a node,
commands, files and envd calls routed by the sandbox id (path or ``E2b-Sandbox-Id``),
lists merged from every node, and a sandbox made through one replica reached through
the other."""

from __future__ import annotations

import secrets

import pytest
from clusterkit import Cluster
from e2b import NotFoundException, Sandbox, SandboxQuery

from conftest import E2B_KEY


def use(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, gateway: str) -> None:
    """What an E2B user changes: the three variables."""
    monkeypatch.setenv("E2B_API_URL", f"{cluster.gateway_urls[gateway]}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{cluster.gateway_urls[gateway]}/e2b")
    monkeypatch.setenv("E2B_API_KEY", E2B_KEY)


def test_the_e2b_sdk_through_a_replica(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = secrets.token_hex(4)
    use(monkeypatch, cluster, "gw-1")
    boxes = [Sandbox.create(timeout=300, metadata={"suite": tag}) for _ in range(2)]
    try:
        with cluster.client("gw-1") as c:
            nodes = {r["id"]: r["node"] for r in c.get("/v1/sandboxes").json()}
        assert {b.sandbox_id for b in boxes} <= nodes.keys()
        for i, sb in enumerate(boxes):
            r = sb.commands.run(f"echo out-{i}; pwd")
            assert (r.stdout, r.exit_code) == (f"out-{i}\n/home/user\n", 0)
            sb.files.write("/workspace/note.txt", f"note {i}")
            assert sb.files.read("/workspace/note.txt") == f"note {i}"
        # The other replica: connect, list (every node's sandboxes), kill.
        use(monkeypatch, cluster, "gw-2")
        again = Sandbox.connect(boxes[0].sandbox_id)
        assert again.files.read("/workspace/note.txt") == "note 0"
        listed = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
        assert {s.sandbox_id for s in listed} == {b.sandbox_id for b in boxes}
        if len({nodes[b.sandbox_id] for b in boxes}) < 2:
            print(f"\n[cluster] e2b: both sandboxes on {nodes[boxes[0].sandbox_id]}")
        assert Sandbox.kill(boxes[1].sandbox_id)
        with pytest.raises(NotFoundException):
            Sandbox.connect(boxes[1].sandbox_id)
    finally:
        for sb in boxes:
            try:
                Sandbox.kill(sb.sandbox_id)
            except Exception as e:  # already gone: fine
                print(f"kill {sb.sandbox_id}: {e}")
