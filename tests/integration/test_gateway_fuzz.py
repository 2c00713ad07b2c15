"""The OpenAPI spec fuzzed with schemathesis against a real gateway: never a 500."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway_harness import RunningGateway, running_gateway

ST = str(Path(sys.executable).parent / "st")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("fuzz"), "1s") as running:
        yield running


def fuzz(gw: RunningGateway, token: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ST, "run", f"{gw.url}/openapi.json", "--checks", "not_a_server_error",
         "--max-examples", "15", "--generation-deterministic", "--request-timeout", "60",
         "-H", f"Authorization: Bearer {token}",
         # an open-ended stream by design (tested in test_gateway_lifecycle.py)
         "--exclude-path", "/v1/events", *extra],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def test_fuzz_every_route_with_a_session_token(gw: RunningGateway) -> None:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
    try:
        r = fuzz(gw, token)
        assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{sid}")


def test_fuzz_operator_routes(gw: RunningGateway) -> None:
    """As the operator, minus sandbox creation (it would start hundreds of sandboxes)."""
    r = fuzz(gw, gw.operator_token, "--exclude-path", "/v1/sandboxes", "--exclude-method", "POST")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    with gw.operator() as op:
        assert op.get("/healthz").status_code == 200
