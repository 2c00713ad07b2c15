"""Every invalid network spec is refused at create, on every surface that creates (the SDK
in-process and through a gateway, REST, the CLI), with a typed error naming the field and
the value; nothing is recorded, so the egress daemon never meets a spec it cannot parse.

Before the one NetworkSpec, ``allow=['bad..name']`` or ``hosts={'a.test': 'not-an-ip'}``
was accepted at create and then failed on every connection in the egress daemon.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.egressd.daemon import PolicyBook
from agentbox.errors import InvalidRequest
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, running_gateway
from network_variants import BAD_CREDENTIALS, INVALID

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
VARIANTS = [pytest.param(n, f, v, id=f"{f}={v!a}"[:60]) for n, f, v in INVALID] + [
    pytest.param({"credentials": [c]}, "credentials.0", None, id=f"credential-{i}")
    for i, c in enumerate(BAD_CREDENTIALS)
]


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("netspec")) as running:
        yield running


@pytest.fixture
def nothing_recorded(runtime: Runtime) -> Iterator[None]:
    """No record is added, and every record there is has a spec the daemon can apply."""
    before = {r.id for r in runtime.store.list()}
    yield
    records = runtime.store.list()
    assert {r.id for r in records} <= before, "a refused create left a record"
    for record in records:
        assert record.spec.network is not None  # raises if the daemon could not parse it
        assert PolicyBook._build(record).sandbox_id == record.id


def _check(error: InvalidRequest | dict[str, Any], field: str, value: Any) -> None:
    details = error.details if isinstance(error, InvalidRequest) else error["details"]
    if value is None:  # a credential: the field names the entry, its value may be a dict
        assert details["field"].startswith(f"network.{field}"), details
        return
    assert details["field"] == f"network.{field}", details
    assert details["value"] == value, details


@pytest.mark.parametrize(("network", "field", "value"), VARIANTS)
def test_sdk_in_process_refuses(
    runtime: Runtime, agentbox_home: Path, nothing_recorded: None,
    network: dict[str, Any], field: str, value: Any,
) -> None:  # fmt: skip
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(memory="128MiB", disk="64MiB", network=network, home=agentbox_home)
    _check(e.value, field, value)
    with pytest.raises(InvalidRequest) as direct:  # the runtime refuses it on its own too
        runtime.create({"memory": "128MiB", "disk": "64MiB", "network": network})
    _check(direct.value, field, value)


@pytest.mark.parametrize(("network", "field", "value"), VARIANTS)
def test_rest_refuses(
    gw: RunningGateway, nothing_recorded: None, network: dict[str, Any], field: str, value: Any
) -> None:
    with gw.operator() as client:
        answer = client.post("/v1/sandboxes", json={"memory": "128MiB", "network": network})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    _check(error, field, value)


@pytest.mark.parametrize(("network", "field", "value"), VARIANTS[:4])
def test_sdk_through_a_gateway_refuses(
    gw: RunningGateway, monkeypatch: pytest.MonkeyPatch, nothing_recorded: None,
    network: dict[str, Any], field: str, value: Any,
) -> None:  # fmt: skip
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    with pytest.raises(InvalidRequest) as e:
        Sandbox.create(memory="128MiB", disk="64MiB", network=network)
    _check(e.value, field, value)


def test_rest_refuses_a_mode_it_does_not_know(gw: RunningGateway, nothing_recorded: None) -> None:
    with gw.operator() as client:
        answer = client.post("/v1/sandboxes", json={"network": "sometimes"})
    assert answer.status_code == 400
    assert answer.json()["error"]["details"]["field"] == "network.mode"


@pytest.mark.parametrize("name", ["bad..name", "a*.test", "1.2.3.4", "xn--a.test"])
def test_cli_refuses(agentbox_home: Path, nothing_recorded: None, name: str) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    env.pop("AGENTBOX_URL", None)
    done = subprocess.run(
        [AGENTBOX, "sandbox", "create", "--disk", "64MiB", "--allow", name],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    assert "invalid_request" in done.stderr and "network.allow.0" in done.stderr, done.stderr


def test_a_valid_spec_is_stored_normalised(gw: RunningGateway, runtime: Runtime) -> None:
    """Mode none (no egress daemon needed) with names to normalise: what the record holds
    is the canonical form the proxy compares."""
    network = {"mode": "none", "allow": ["*.Bücher.TEST."], "hosts": {"A.Test.": "::1"}}
    with gw.operator() as client:
        answer = client.post("/v1/sandboxes", json={"memory": "128MiB", "disk": "64MiB",
                                                     "network": network})  # fmt: skip
        assert answer.status_code == 201, answer.text
        sandbox_id = answer.json()["id"]
        try:
            record = runtime.store.get(sandbox_id)
            assert record is not None
            stored = json.loads(record.stored)["network"]
            assert stored["allow"] == ["*.xn--bcher-kva.test"], json.dumps(stored)
            assert stored["hosts"] == {"a.test": "::1"}
        finally:
            assert client.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 200
