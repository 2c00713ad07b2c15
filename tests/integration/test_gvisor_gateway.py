"""The gVisor tier through the gateway's REST API: the tier is asked for and shown on the
wire, and a refusal keeps its code (``tier_unsupported``, 409) across it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.isolation import gvisor
from gateway_harness import RunningGateway, running_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    probe = gvisor.probe()
    if not probe.ok:
        pytest.fail(f"the gvisor tier cannot run on this host: {probe.detail}")
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("gw")) as running:
        yield running


def test_rest_creates_lists_and_runs_a_gvisor_sandbox(gw: RunningGateway) -> None:
    with gw.operator() as op:
        body = {"isolation": "gvisor", "memory": "256MiB", "disk": "64MiB", "network": "none"}
        r = op.post("/v1/sandboxes", json=body)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert r.json()["isolation"] == "gvisor"
            listed = {s["id"]: s for s in op.get("/v1/sandboxes").json()}
            assert listed[sid]["isolation"] == "gvisor"
            token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
            with gw.client(token) as agent:
                command = {"command": "head -c 40 /proc/version; echo; exit 4"}
                ran = agent.post(f"/v1/sandboxes/{sid}/commands", json=command)
            assert ran.status_code == 200, ran.text
            assert ran.json()["stdout"].startswith("Linux version 4.4.0"), ran.text
            assert ran.json()["exit_code"] == 4
            refused = op.post("/v1/sandboxes", json={**body, "on_idle": "stop"})
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["code"] == "tier_unsupported" and "namespaces" in error["message"]
            forwarded = op.get(f"/v1/sandboxes/{sid}/ports/8000/")
            assert forwarded.status_code == 409, forwarded.text
            assert forwarded.json()["error"]["code"] == "tier_unsupported"
            default = op.post("/v1/sandboxes", json={"memory": "256MiB", "network": "none"})
            assert default.json()["isolation"] == "namespaces"
            op.delete(f"/v1/sandboxes/{default.json()['id']}")
        finally:
            assert op.delete(f"/v1/sandboxes/{sid}").status_code == 200


def test_a_port_of_a_networked_gvisor_sandbox_is_forwarded(gw: RunningGateway) -> None:
    """With a network, a service in the Sentry listens on a host socket in the sandbox's
    netns: the gateway reaches it as on the default tier (network none: the 409 above)."""
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"isolation": "gvisor", "memory": "256MiB",
                                           "disk": "64MiB"})  # fmt: skip
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            assert r.json()["network"]["mode"] != "none", r.text
            service = {"command": "cd /workspace && printf 'from gvisor' > page.txt && "
                                  "exec python3 -m http.server 8765 --bind 127.0.0.1"}  # fmt: skip
            assert op.post(f"/v1/sandboxes/{sid}/processes", json=service).status_code == 201
            url = f"/v1/sandboxes/{sid}/ports/8765/page.txt"
            deadline = time.monotonic() + 15
            while (got := op.get(url)).status_code == 404:
                assert time.monotonic() < deadline, got.text  # the service is starting
                time.sleep(0.05)
            assert got.status_code == 200 and got.text == "from gvisor", got.text
        finally:
            assert op.delete(f"/v1/sandboxes/{sid}").status_code == 200


def test_an_unknown_tier_is_a_400(gw: RunningGateway) -> None:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"isolation": "kata"})
    assert r.status_code in (400, 422), r.text
    assert "isolation" in r.text
