"""MCP's HTTP authorization as clients see it: 401/403 with RFC 6750/9728 challenges,
protected resource metadata, and JSON-RPC errors with documented codes (never 0). Raw
protocol (httpx) and the official TypeScript SDK client."""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agentbox import errors
from agentbox.gateway.mcp_server import JSONRPC_CODES, jsonrpc_error
from gateway_harness import RunningGateway, running_gateway
from tsclient import run_ts_client

INIT = {
    "jsonrpc": "2.0",
    "id": 7,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("mcpauth")) as running:
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        yield str(sid)
        op.delete(f"/v1/sandboxes/{sid}")


def issue(gw: RunningGateway, sandbox: str, **body: Any) -> tuple[str, str]:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox, **body}).json()
        return str(r["token"]), str(r["id"])


def expire(gw: RunningGateway, token_id: str) -> None:
    # The token's own row, dated in the past (the clock is not the test's to wait on).
    with sqlite3.connect(gw.home / "gateway.db") as db:
        db.execute("UPDATE gateway_tokens SET expires_at = 0 WHERE id = ?", (token_id,))


def post(gw: RunningGateway, body: dict[str, Any], token: str | None = None,
         version: str | None = None) -> httpx2.Response:  # fmt: skip
    headers = dict(HEADERS)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if version:
        headers["MCP-Protocol-Version"] = version
    return httpx2.post(f"{gw.url}/mcp", json=body, headers=headers, timeout=60)


def challenge(response: httpx2.Response) -> dict[str, str]:
    value = response.headers["www-authenticate"]
    assert value.startswith("Bearer ")
    return dict(re.findall(r'(\w+)="([^"]*)"', value))


def test_missing_forged_and_expired_tokens_get_401(gw: RunningGateway, sandbox_id: str) -> None:
    metadata = f"{gw.url}/.well-known/oauth-protected-resource/mcp"
    missing = post(gw, INIT)
    assert missing.status_code == 401, missing.text
    params = challenge(missing)
    assert params["resource_metadata"] == metadata
    assert "error" not in params  # RFC 6750 3.1: no error code when no token was sent
    body = missing.json()
    assert body["id"] == 7 and body["error"]["code"] == -32050
    assert body["error"]["data"]["code"] == "unauthenticated"

    token, token_id = issue(gw, sandbox_id)
    expire(gw, token_id)
    for bad in ("abx_forged", token):
        r = post(gw, INIT, bad)
        assert r.status_code == 401, r.text
        params = challenge(r)
        assert params["error"] == "invalid_token"
        assert params["resource_metadata"] == metadata and params["error_description"]
    # Every method, not only initialize; GET and DELETE too.
    listing = {"jsonrpc": "2.0", "id": 8, "method": "tools/list"}
    assert post(gw, listing, version="2025-11-25").status_code == 401
    assert httpx2.get(f"{gw.url}/mcp", headers=HEADERS).status_code == 401
    assert httpx2.delete(f"{gw.url}/mcp").status_code == 401


def test_token_of_a_destroyed_sandbox_gets_401(gw: RunningGateway) -> None:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        token, _ = issue(gw, sid)
        assert post(gw, INIT, token).status_code == 200
        op.delete(f"/v1/sandboxes/{sid}")
    r = post(gw, INIT, token)
    assert r.status_code == 401 and challenge(r)["error"] == "invalid_token"


def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}


def test_insufficient_scope_is_403_and_audited(gw: RunningGateway, sandbox_id: str) -> None:
    token, token_id = issue(gw, sandbox_id, tools=["fs_read", "fs_list"])
    assert post(gw, INIT, token).status_code == 200
    outside = post(gw, call("terminal_run", {"command": "true"}), token, "2025-11-25")
    assert outside.status_code == 403, outside.text
    params = challenge(outside)
    assert params["error"] == "insufficient_scope" and params["scope"] == "terminal_run"
    assert params["resource_metadata"].endswith("/.well-known/oauth-protected-resource/mcp")
    error = outside.json()["error"]
    assert error["code"] == -32051 and error["data"]["code"] == "insufficient_scope"

    other = post(gw, call("fs_list", {"path": "/", "sandbox_id": "sb-000000000000"}), token,
                 "2025-11-25")  # fmt: skip
    assert other.status_code == 403 and challenge(other)["scope"] == "sandbox:sb-000000000000"
    # The denial was decided and audited on the gateway's one call path.
    records = [json.loads(line) for line in gw.audit_path.read_text().splitlines()]
    mine = [r for r in records if r.get("session") == token_id]
    assert [r["decision"] for r in mine if r.get("tool")] == ["denied", "denied"]


def test_metadata_documents(gw: RunningGateway) -> None:
    for suffix in ("", "/mcp"):
        r = httpx2.get(f"{gw.url}/.well-known/oauth-protected-resource{suffix}")
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["resource"] == gw.url + suffix  # RFC 9728 3.3: the URL it was derived from
        assert doc["bearer_methods_supported"] == ["header"]
        assert {"operator", "terminal_run", "fs_read", "ports"} <= set(doc["scopes_supported"])
        assert "authorization_servers" not in doc  # no OAuth server: operator-issued tokens
        assert "agentbox token issue" in doc["agentbox_token_issuance"]


def test_valid_token_and_protocol_errors_have_documented_codes(
    gw: RunningGateway, sandbox_id: str
) -> None:
    token, _ = issue(gw, sandbox_id)
    init = post(gw, INIT, token)
    assert init.status_code == 200 and init.json()["result"]["serverInfo"]["name"] == "agentbox"
    unknown = post(gw, call("no_such_tool", {}), token, "2025-11-25")
    assert unknown.status_code == 200
    error = unknown.json()["error"]
    assert error["code"] == -32602 and error["data"]["code"] == "tool_not_found"
    method = post(gw, {"jsonrpc": "2.0", "id": 3, "method": "no/such"}, token, "2025-11-25")
    assert method.json()["error"]["code"] == -32601


def test_every_error_class_has_a_jsonrpc_code() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        e = cls("what happened; what to do")
        wire = jsonrpc_error(e)
        assert wire["code"] in set(JSONRPC_CODES.values()), name
        assert wire["code"] == -32602 or -32099 <= wire["code"] <= -32002, name
        assert wire["data"]["code"] == e.code
    assert jsonrpc_error(errors.InsufficientScope("x", scope="fs_read"))["data"]["details"] == {
        "scope": "fs_read"
    }


def ts_http(gw: RunningGateway, token: str, *call_args: str) -> Any:
    return run_ts_client("http", f"{gw.url}/mcp", token, *call_args)


def test_typescript_client_sees_auth_failures(gw: RunningGateway, sandbox_id: str) -> None:
    expired, expired_id = issue(gw, sandbox_id)
    expire(gw, expired_id)
    with gw.operator() as op:  # a token whose sandbox is gone
        gone = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        orphan, _ = issue(gw, gone)
        op.delete(f"/v1/sandboxes/{gone}")
    for token in ("-", "abx_forged", expired, orphan):
        out = ts_http(gw, token)
        assert not out["ok"] and out["stage"] == "connect", out
        assert out["error"]["name"] == "StreamableHTTPError" and out["error"]["status"] == 401

    scoped, _ = issue(gw, sandbox_id, tools=["fs_list"])
    out = ts_http(gw, scoped, "terminal_run", '{"command": "true"}')
    assert not out["ok"] and out["stage"] == "call", out
    assert out["error"]["name"] == "StreamableHTTPError" and out["error"]["status"] == 403
    assert "insufficient_scope" in out["error"]["message"]
    out = ts_http(gw, scoped, "fs_list", '{"path": "/", "sandbox_id": "sb-000000000000"}')
    assert not out["ok"] and out["error"]["status"] == 403, out


def test_typescript_client_with_a_valid_token(gw: RunningGateway, sandbox_id: str) -> None:
    token, _ = issue(gw, sandbox_id)
    out = ts_http(gw, token, "terminal_run", '{"command": "echo from-ts"}')
    assert out["ok"], out
    assert "terminal_run" in out["tools"]
    assert out["result"]["structuredContent"]["stdout"] == "from-ts\n"


def test_typescript_oauth_client_learns_there_is_no_authorization_server(
    gw: RunningGateway, sandbox_id: str
) -> None:
    """A client with an OAuth provider: on 401 it discovers the metadata (no
    authorization_servers), falls back to registering at the origin and is told there."""
    out = run_ts_client("http-oauth", f"{gw.url}/mcp", "abx_forged")
    assert not out["ok"] and out["stage"] == "connect", out
    assert out["error"]["name"] == "InvalidClientMetadataError", out
    assert "agentbox token issue" in out["error"]["message"]
    token, _ = issue(gw, sandbox_id, tools=["fs_list"])
    out = run_ts_client("http-oauth", f"{gw.url}/mcp", token, "fs_list", '{"path": "/"}')
    assert out["ok"] and out["tools"] == ["fs_list"], out
