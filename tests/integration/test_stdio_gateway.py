"""``agentbox mcp`` (stdio) driven by the official TypeScript SDK's StdioClientTransport:
beside a running ``agentbox serve`` on the same home (it relays to the gateway, which owns
the audit chain) and with no gateway (in-process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from agentbox.gateway.presence import Served, advertise, listening, serving
from agentbox.runtime.runtime import Runtime
from gateway_harness import AGENTBOX, GatewayProcess
from tsclient import run_ts_client

# The audit chain is the home's default one, which `agentbox mcp` would open too.
CONFIG = """
gateway:
  listen: 127.0.0.1:{port}
  auth: {{operator_token_env: GATEWAY_PROCESS_TOKEN}}
sandbox:
  limits: {{memory: 256MiB, disk: 64MiB}}
  network: {{mode: none}}
tools:
  - name: terminal.run
    allow: [sh, echo, id, pwd, "true"]
audit:
  path: {home}/audit/audit.jsonl
"""
ID_AND_PWD = ("terminal_run", '{"command": "id -u; pwd"}')


def test_stdio_with_no_gateway(agentbox_home: Path, host_ready: None) -> None:
    assert serving(agentbox_home) is None
    before = {r.id for r in Runtime(agentbox_home).list()}
    out = stdio(agentbox_home)
    assert out["result"]["structuredContent"]["stdout"] == "1000\n/workspace\n"  # type: ignore[index]
    assert {r.id for r in Runtime(agentbox_home).list()} == before


def test_only_the_advertising_process_is_trusted_with_the_port(
    agentbox_home: Path, host_ready: None
) -> None:
    """Another local process on the advertised port (the gateway has not bound it yet, or
    failed to) is not the gateway: agentbox mcp sends it nothing."""
    script = (
        "import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); sys.stdin.read()"
    )
    with subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as impostor:  # fmt: skip
        assert impostor.stdout is not None and impostor.stdin is not None
        port = int(impostor.stdout.readline())
        advert = advertise(agentbox_home, f"http://127.0.0.1:{port}")
        assert advert is not None
        try:
            served = serving(agentbox_home)
            assert served == Served(f"http://127.0.0.1:{port}", os.getpid())
            assert not listening(served)  # the port is held, but not by the advertiser
            with socket.socket() as own:
                own.bind(("127.0.0.1", 0))
                own.listen()
                assert listening(Served(f"http://127.0.0.1:{own.getsockname()[1]}", os.getpid()))
        finally:
            advert.close()
            impostor.stdin.close()  # the impostor exits
        assert serving(agentbox_home) is None


def test_a_stopped_gateway_is_no_longer_served(agentbox_home: Path, host_ready: None) -> None:
    gw = GatewayProcess(agentbox_home, CONFIG)
    gw.start()
    assert (served := serving(agentbox_home)) is not None and served.url == gw.url
    gw.kill(signal.SIGKILL)  # no clean withdrawal: the lock dies with the process
    assert serving(agentbox_home) is None


# One gateway for the tests below (the ones above need none running on the home).
@pytest.fixture(scope="module")
def gateway(agentbox_home: Path, host_ready: None) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(agentbox_home, CONFIG)
    gw.start()
    try:
        yield gw
    finally:
        if gw.proc is not None and gw.proc.poll() is None:
            gw.kill(signal.SIGTERM)


def stdio(home: Path, env: dict[str, str] | None = None) -> dict[str, object]:
    out = run_ts_client("stdio", AGENTBOX, "mcp", "--", *ID_AND_PWD,
                        env={"AGENTBOX_HOME": str(home), **(env or {})})  # fmt: skip
    assert out["ok"], out
    return dict(out)


def test_stdio_beside_a_running_gateway(gateway: GatewayProcess, agentbox_home: Path) -> None:
    assert (served := serving(agentbox_home)) is not None and served.url == gateway.url
    with gateway.client() as op:
        before = {s["id"] for s in op.get("/v1/sandboxes").json()}
    # The operator token as the gateway was given it (here: in the variable the default
    # configuration names).
    out = stdio(agentbox_home, {"AGENTBOX_OPERATOR_TOKEN": gateway.token})
    assert "terminal_run" in out["tools"]  # type: ignore[operator]
    result = out["result"]
    assert isinstance(result, dict) and not result.get("isError"), result
    assert result["structuredContent"]["stdout"] == "1000\n/workspace\n"
    with gateway.client() as op:
        # Its sandbox went with it, and the gateway wrote the call into its one chain.
        assert {s["id"] for s in op.get("/v1/sandboxes").json()} == before
    audit = (agentbox_home / "audit/audit.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in audit]
    calls = [r for r in records if r.get("tool") == "terminal_run" and r["sandbox"] not in before]
    assert calls and calls[-1]["decision"] == "allowed" and calls[-1]["actor"].startswith("token:")
    verify = subprocess.run([AGENTBOX, "audit", "verify", str(agentbox_home / "audit/audit.jsonl")],
                            capture_output=True, text=True, check=False)  # fmt: skip
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_stdio_for_a_given_sandbox_renews_its_token(
    gateway: GatewayProcess, agentbox_home: Path
) -> None:
    with gateway.client() as op:
        sid = op.post("/v1/sandboxes", json={}).json()["id"]
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home),
           "AGENTBOX_OPERATOR_TOKEN": gateway.token}  # fmt: skip
    params = StdioServerParameters(command=AGENTBOX, args=["mcp", "--sandbox", sid], env=env)

    async def main() -> None:
        async with Client(params) as c:
            first = await c.call_tool("terminal_run", {"command": "echo one"})
            assert first.structured_content["stdout"] == "one\n", first.content
            # The relay's session token runs out mid-session: it gets a new one.
            with sqlite3.connect(agentbox_home / "gateway.db") as db:
                db.execute("UPDATE gateway_tokens SET expires_at = 0 WHERE sandbox = ?", (sid,))
            second = await c.call_tool("terminal_run", {"command": "echo two"})
            assert second.structured_content["stdout"] == "two\n", second.content

    try:
        anyio.run(main)
        with gateway.client() as op:
            # The given sandbox stays; the relay's tokens for it are revoked.
            assert op.get(f"/v1/sandboxes/{sid}").status_code == 200
            tokens = op.get("/v1/tokens", params={"sandbox": sid}).json()
            assert len(tokens) == 2 and tokens[-1]["revoked"], tokens
    finally:
        with gateway.client() as op:
            op.delete(f"/v1/sandboxes/{sid}")


def test_stdio_beside_a_gateway_without_the_operator_token(
    gateway: GatewayProcess, agentbox_home: Path, tmp_path: Path
) -> None:
    env = {"AGENTBOX_OPERATOR_TOKEN": "", "AGENTBOX_HOME": str(agentbox_home)}
    config = tmp_path / "gateway.yaml"
    config.write_text(f"gateway:\n  auth:\n    operator_token_file: {tmp_path}/none\n")
    proc = subprocess.run([AGENTBOX, "mcp", "--config", str(config)], input="",
                          capture_output=True, text=True, env={**os.environ, **env}, timeout=120)  # fmt: skip
    assert proc.returncode != 0
    assert "cannot read the operator token file" in proc.stderr, proc.stderr


def test_relay_answers_malformed_lines_and_keeps_going(
    gateway: GatewayProcess, agentbox_home: Path
) -> None:
    init = {"jsonrpc": "2.0", "id": 5, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}}  # fmt: skip
    lines = [
        "not json",
        '[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]',  # a batch
        '{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}',  # an id that is no id
        '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": []}}',
        json.dumps(init),
    ]
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home),
           "AGENTBOX_OPERATOR_TOKEN": gateway.token}  # fmt: skip
    proc = subprocess.run([AGENTBOX, "mcp"], input="\n".join(lines) + "\n", env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [a["error"]["code"] for a in answers[:3]] == [-32700, -32600, -32600], answers
    assert answers[3]["id"] == 5 and answers[3]["result"]["serverInfo"]["name"] == "agentbox"
