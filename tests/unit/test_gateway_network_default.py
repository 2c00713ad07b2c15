"""The REST create route's network default: the gateway config's sandbox.network, with its
credentials (names only: domain, header, secret_env, format), never a secret value."""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn

from agentbox.config.settings import parse_settings
from agentbox.config.specs import SandboxSpec
from agentbox.errors import InvalidRequest
from agentbox.gateway.app import create_app
from agentbox.runtime.runtime import Runtime
from agentbox.runtime.spec_input import spec_from
from gateway_harness import free_port

CONFIG = """
gateway:
  listen: 127.0.0.1:PORT
  auth:
    operator_token_env: AGENTBOX_TEST_OPERATOR_TOKEN
sandbox:
  network:
    mode: allowlist
    allow: ["api.github.com"]
    credentials:
      - domain: API.GitHub.com
        secret_env: AGENTBOX_TEST_GH_TOKEN
      - domain: api.github.com
        header: X-Extra
        secret_env: AGENTBOX_TEST_GH_EXTRA
        format: "token={secret}"
audit:
  path: AUDIT_PATH
"""


class _RecordingRuntime(Runtime):
    """Validates the spec as the real create does, records it, creates nothing."""

    specs: list[SandboxSpec]

    def create(
        self, spec: Mapping[str, object] | SandboxSpec | None = None, *, actor: str = "local"
    ) -> Any:
        self.specs.append(spec_from(spec))
        # A known error: answered as a normal 400 (a bare exception resets the connection).
        raise InvalidRequest("spec captured; no sandbox in this test")


def test_create_defaults_network_with_credential_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOX_TEST_GH_TOKEN", "gh-secret-value-123")
    port = free_port()
    settings = parse_settings(
        CONFIG.replace("AUDIT_PATH", str(tmp_path / "audit.jsonl")).replace("PORT", str(port)),
        "gw.yaml",
    )
    home = Path(tempfile.mkdtemp(prefix="agentbox-netdefault-", dir="/var/tmp"))
    try:
        _check(settings, home, port)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _check(settings: Any, home: Path, port: int) -> None:
    runtime = _RecordingRuntime(home)
    runtime.specs = []
    app = create_app(settings, operator_token="op-token", runtime=runtime)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
            time.sleep(0.01)
        headers = {"Authorization": "Bearer op-token"}
        with httpx2.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
            for body in ({}, {"network": "open"}):
                answer = client.post("/v1/sandboxes", json=body)
                assert answer.status_code == 400 and "spec captured" in answer.text, answer.text
    finally:
        server.should_exit = True
        thread.join(30)
    assert len(runtime.specs) == 2, "the create route did not reach the runtime"
    spec = runtime.specs[0]
    assert [c.model_dump() for c in spec.network.credentials] == [
        {
            "domain": "api.github.com",
            "header": "Authorization",
            "secret_env": "AGENTBOX_TEST_GH_TOKEN",
            "format": "Bearer {secret}",
        },
        {
            "domain": "api.github.com",
            "header": "X-Extra",
            "secret_env": "AGENTBOX_TEST_GH_EXTRA",
            "format": "token={secret}",
        },
    ]
    assert spec.network.allow == ("api.github.com",)
    assert "gh-secret-value-123" not in json.dumps(spec.model_dump())
    # An explicit network in the request replaces the default, credentials included.
    assert runtime.specs[1].network.mode == "open" and runtime.specs[1].network.credentials == ()


def test_a_create_may_only_use_credentials_the_config_grants() -> None:
    from agentbox.config.settings import CredentialSettings
    from agentbox.gateway.service import _check_credentials

    granted = [CredentialSettings(domain="API.GitHub.com", secret_env="GH_TOKEN")]
    ok = {"credentials": [{"domain": "api.github.com.", "secret_env": "GH_TOKEN"}]}
    _check_credentials(ok, granted)
    _check_credentials("allowlist", granted)
    for bad in (
        {"credentials": [{"domain": "evil.test", "secret_env": "GH_TOKEN"}]},
        {"credentials": [{"domain": "api.github.com", "secret_env": "AGENTBOX_OPERATOR_TOKEN"}]},
        {"credentials": ["GH_TOKEN"]},
    ):
        with pytest.raises(InvalidRequest):
            _check_credentials(bad, granted)
