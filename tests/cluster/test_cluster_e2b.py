"""The unmodified E2B Python SDK against a replica's ``/e2b``: creates placed on a node,
commands, files and envd calls routed by the sandbox id (path or ``E2b-Sandbox-Id``),
lists merged from every node, and a sandbox made through one replica reached through
the other; ``get_host`` port hosts and signed ``download_url``/``upload_url`` at the
replica's root reaching sandboxes on every node."""

from __future__ import annotations

import secrets

import httpx2
import pytest
from clusterkit import Cluster, wait_for
from e2b import NotFoundException, Sandbox, SandboxQuery

from conftest import E2B_KEY


def use(monkeypatch: pytest.MonkeyPatch, cluster: Cluster, gateway: str) -> None:
    """What an E2B user changes: the three variables."""
    monkeypatch.setenv("E2B_API_URL", f"{cluster.gateway_urls[gateway]}/e2b")
    monkeypatch.setenv("E2B_SANDBOX_URL", f"{cluster.gateway_urls[gateway]}/e2b")
    monkeypatch.setenv("E2B_API_KEY", E2B_KEY)


def kill_all(boxes: list[Sandbox]) -> None:
    for sb in boxes:
        try:
            Sandbox.kill(sb.sandbox_id)
        except Exception as e:  # already gone: fine
            print(f"kill {sb.sandbox_id}: {e}")


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
        kill_all(boxes)


def test_port_hosts_and_signed_file_urls_through_a_replica(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One sandbox per node (a signed URL names no sandbox: the replica asks the nodes in
    turn, so each position in that order is tried)."""
    use(monkeypatch, cluster, "gw-2")
    url = cluster.gateway_urls["gw-2"]
    boxes = [Sandbox.create(timeout=300) for _ in range(len(cluster.nodes))]
    try:
        with cluster.client("gw-1") as c:
            nodes = {r["id"]: r["node"] for r in c.get("/v1/sandboxes").json()}
        print(f"\n[cluster] e2b signed URLs on {sorted(nodes[b.sandbox_id] for b in boxes)}")
        with httpx2.Client(timeout=60) as anonymous:  # no key, no token, no sandbox header
            for sb in boxes:
                sb.files.write("/workspace/signed.txt", f"signed {sb.sandbox_id}")
                download = sb.download_url("/workspace/signed.txt")
                assert download.startswith(f"{url}/files?") and "signature=v1_" in download
                assert anonymous.get(download).text == f"signed {sb.sandbox_id}"
                forged = download.replace("signed.txt", "other.txt")
                assert anonymous.get(forged).status_code == 401
                expired = sb.download_url("/workspace/signed.txt", use_signature_expiration=-10)
                assert anonymous.get(expired).status_code == 401
                upload = sb.upload_url("/workspace/up.txt")
                sent = anonymous.post(upload, files={"file": ("up.txt", sb.sandbox_id.encode())})
                assert sent.status_code == 200, sent.text
                assert sb.files.read("/workspace/up.txt") == sb.sandbox_id

        sb, other = boxes[0], boxes[1]
        service = "python3 -m http.server 8765 --bind 127.0.0.1 --directory /workspace"
        sb.commands.run(service, background=True, timeout=0)
        host = sb.get_host(8765)
        assert host == f"8765-{sb.sandbox_id}.e2b.localhost"
        token = {"e2b-traffic-access-token": str(sb.traffic_access_token)}
        port = url.rsplit(":", 1)[1]
        with httpx2.Client(base_url=url, headers={"Host": f"{host}:{port}"}, timeout=60) as client:

            def served() -> httpx2.Response | None:
                answer = client.get("/signed.txt", headers=token)
                return answer if answer.status_code == 200 else None

            assert wait_for("the sandbox's service", served, 30).text == f"signed {sb.sandbox_id}"
            # The sandbox's own answer, not the replica's /healthz: the Host decides.
            assert client.get("/healthz", headers=token).status_code == 404
            assert client.get("/signed.txt").status_code == 401  # ports are never public
            wrong = {"e2b-traffic-access-token": str(other.traffic_access_token)}
            assert client.get("/signed.txt", headers=wrong).status_code == 401
    finally:
        kill_all(boxes)
