"""The node API is never public: mutual TLS with the cluster CA, roles kept apart by the
certificates' key usage, and tokens that reach only their own sandbox whichever replica
and node they pass through."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import httpx2
import pytest
from clusterkit import Cluster

from agentbox.client.remote import GatewayClient, RemoteRuntime
from agentbox.cluster import pki
from agentbox.errors import InsufficientScope, PermissionDenied


def _refused(url: str, verify: ssl.SSLContext | bool) -> bool:
    """Whether a request to ``url`` dies in the handshake (no HTTP answer at all)."""
    try:
        with httpx2.Client(verify=verify, timeout=10) as c:
            c.get(url)
    except (httpx2.ConnectError, httpx2.ReadError, httpx2.RemoteProtocolError):
        return True
    return False


def test_node_api_needs_a_gateway_certificate(cluster: Cluster, tmp_path: Path) -> None:
    url = cluster.node_urls["node-1"] + "/node/v1/status"
    with httpx2.Client(verify=cluster.node_context("gw-1"), timeout=10) as c:
        assert c.get(url).json()["id"] == "node-1"  # the control: a gateway's is accepted
    trust_only = ssl.create_default_context(cafile=str(cluster.pki / "ca.pem"))
    assert _refused(url, trust_only)  # no client certificate
    # A node's certificate (serverAuth only) cannot call another node.
    assert _refused(url, cluster.node_context("node-2"))
    # A gateway certificate from another CA, however named.
    other = tmp_path / "other-ca"
    pki.init_ca(other)
    pki.issue(other, "gw-1", "gateway", [])
    context = pki.client_context(other / "ca.pem", other / "gw-1.pem", other / "gw-1.key")
    context.load_verify_locations(cluster.pki / "ca.pem")  # it trusts the node; not vice versa
    assert _refused(url, context)
    # Plain HTTP on the node's port gets no API either.
    plain = cluster.node_urls["node-1"].replace("https://", "http://") + "/healthz"
    with httpx2.Client(timeout=10) as c:
        try:
            answer = c.get(plain)
            assert answer.status_code >= 400 and "node-1" not in answer.text
        except (httpx2.ReadError, httpx2.RemoteProtocolError):
            pass


def test_gateway_refuses_a_node_not_signed_by_the_ca(cluster: Cluster, tmp_path: Path) -> None:
    """A gateway dials only nodes the cluster CA signed for that address: a node
    certificate from another CA is refused by the gateway's context."""
    other = tmp_path / "rogue"
    pki.init_ca(other)
    pki.issue(other, "rogue", "node", ["127.0.0.1"])
    server = pki.server_context(other / "ca.pem", other / "rogue.pem", other / "rogue.key")
    client = cluster.node_context("gw-1")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def accept() -> None:
        conn, _ = listener.accept()
        try:
            server.wrap_socket(conn, server_side=True)
        except (ssl.SSLError, OSError):
            pass
        finally:
            conn.close()

    thread = threading.Thread(target=accept)
    thread.start()
    with pytest.raises(httpx2.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        with httpx2.Client(verify=client, timeout=10) as c:
            c.get(f"https://127.0.0.1:{port}/node/v1/status")
    thread.join(10)
    listener.close()


def raw_status(url: str, target: str, token: str) -> int:
    """The status line's code of a GET sent byte for byte as given."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer "
                  f"{token}\r\nConnection: close\r\n\r\n".encode())  # fmt: skip
        return int(s.recv(64).split()[1])


def test_session_token_reaches_only_its_sandbox_on_any_replica(cluster: Cluster) -> None:
    operator = RemoteRuntime(GatewayClient(cluster.gateway_urls["gw-1"], cluster.token))
    mine, theirs = operator.create({}), operator.create({})
    with cluster.client("gw-1") as c:
        token = c.post("/v1/tokens", json={"sandbox": mine.id}).raise_for_status().json()["token"]
    # Routed by the first id and normalised to the second further on: refused here (raw
    # requests: HTTP clients normalise dot segments before sending).
    for dots in ("..", "%2e%2e", "."):
        target = f"/v1/sandboxes/{mine.id}/{dots}/{theirs.id}/files?path=/etc/hostname"
        assert raw_status(cluster.gateway_urls["gw-2"], target, token) == 400, target
    for gateway in sorted(cluster.gateways):  # minted on gw-1, valid on every replica
        agent = RemoteRuntime(GatewayClient(cluster.gateway_urls[gateway], token))
        assert agent.commands(mine.id).run("echo ok").stdout == "ok\n"
        with pytest.raises(PermissionDenied):
            agent.files(theirs.id).read("/etc/hostname")
        with pytest.raises((PermissionDenied, InsufficientScope)):
            agent.create({})  # only the operator places sandboxes
        agent.client.close()
    operator.destroy(mine.id)
    operator.destroy(theirs.id)
    operator.client.close()
