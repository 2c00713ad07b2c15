"""The desktop's VNC relay through a replica: the WebSocket is routed to the sandbox's
node, an RFB handshake passes both ways, and the node's refusals reach the viewer as the
single host's do (403 at the upgrade)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import Cluster

from vnckit import handshake_status, rfb_handshake


@pytest.fixture(scope="module")
def desktop(cluster: Cluster) -> Iterator[str]:
    for program in ("/usr/bin/Xvnc", "/usr/bin/openbox"):
        if not Path(program).exists():
            pytest.fail(f"{program} is missing: run scripts/install.sh (it installs desktops)")
    with cluster.client("gw-1") as c:
        created = c.post(
            "/v1/sandboxes", json={"desktop": True, "memory": "1GiB", "disk": "512MiB"}
        )
        assert created.status_code == 201, created.text
        sandbox = str(created.json()["id"])
        try:
            yield sandbox
        finally:
            c.delete(f"/v1/sandboxes/{sandbox}")


def vnc_url(cluster: Cluster, gateway: str, sandbox: str) -> str:
    return cluster.gateway_urls[gateway].replace("http://", "ws://") + (
        f"/v1/sandboxes/{sandbox}/desktop/vnc"
    )


def test_a_vnc_handshake_through_a_replica(cluster: Cluster, desktop: str) -> None:
    url = vnc_url(cluster, "gw-2", desktop)  # made through gw-1: any replica routes it
    version, security = asyncio.run(rfb_handshake(url, cluster.token))
    assert version.startswith(b"RFB 003.") and version.endswith(b"\n"), version
    assert security[0] >= 1 and len(security) >= 1 + security[0], security


def test_refusals_reach_the_viewer(cluster: Cluster, desktop: str) -> None:
    url = vnc_url(cluster, "gw-2", desktop)
    assert asyncio.run(handshake_status(url, "not-a-token")) == 403  # the replica's check
    with cluster.client("gw-1") as c:  # a session token without desktop_view: the node's
        issued = c.post("/v1/tokens", json={"sandbox": desktop, "tools": ["terminal_run"]})
        assert issued.status_code in (200, 201), issued.text
        token = issued.json()["token"]
    assert asyncio.run(handshake_status(url, token)) == 403
    missing = vnc_url(cluster, "gw-2", "sb-000000000000")
    assert asyncio.run(handshake_status(missing, cluster.token)) == 403
