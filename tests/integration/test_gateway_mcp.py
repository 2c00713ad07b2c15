"""MCP with the official client: Streamable HTTP (both protocol eras) and stdio."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from agentbox.gateway.sealed import load_key, unseal
from gateway_harness import RunningGateway, running_gateway

NAME_RULE = r"^[a-zA-Z0-9_-]{1,64}$"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("mcp"), "20s") as running:
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()["id"]
        yield sid
        op.delete(f"/v1/sandboxes/{sid}")


def issue(gw: RunningGateway, sandbox: str, **body: Any) -> str:
    with gw.operator() as op:
        return str(op.post("/v1/tokens", json={"sandbox": sandbox, **body}).json()["token"])


@contextlib.asynccontextmanager
async def mcp_client(gw: RunningGateway, token: str, mode: str = "auto",
                     **kwargs: Any) -> AsyncIterator[Client]:  # fmt: skip
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as h:
        async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=h), mode=mode,
                          **kwargs) as client:  # fmt: skip
            yield client


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_list_and_call_tools_over_http(gw: RunningGateway, sandbox_id: str, mode: str) -> None:
    import re

    token = issue(gw, sandbox_id)

    async def main() -> None:
        async with mcp_client(gw, token, mode) as c:
            assert c.protocol_version == ("2026-07-28" if mode == "auto" else "2025-11-25")
            tools = {t.name: t for t in (await c.list_tools()).tools}
            assert {"terminal_run", "fs_read", "fs_write", "fs_edit", "fs_list", "fs_stat",
                    "fs_remove", "fs_move", "process_start", "shell_run"} <= tools.keys()  # fmt: skip
            for tool in tools.values():
                assert re.match(NAME_RULE, tool.name)
                assert tool.input_schema["type"] == "object" and tool.output_schema
                assert tool.annotations is not None
            assert tools["fs_read"].annotations.read_only_hint is True
            assert tools["fs_remove"].annotations.destructive_hint is True

            r = await c.call_tool("terminal_run", {"command": "echo hi; exit 4"})
            assert not r.is_error and r.structured_content["stdout"] == "hi\n"
            assert r.structured_content["exit_code"] == 4
            w = await c.call_tool("fs_write", {"path": "m.txt", "content": "alpha\n"})
            assert not w.is_error, w.content
            e = await c.call_tool("fs_edit", {"path": "m.txt", "old": "alpha", "new": "beta"})
            assert e.structured_content["replacements"] == 1
            read = await c.call_tool("fs_read", {"path": "m.txt"})
            assert read.structured_content["content"] == "beta\n"
            bad = await c.call_tool("fs_read", {"path": "missing.txt"})
            assert bad.is_error and "file_not_found" in bad.content[0].text
            denied = await c.call_tool("terminal_run", {"command": "curl http://x"})
            assert denied.is_error and "policy_denied" in denied.content[0].text
            invalid = await c.call_tool("terminal_run", {"nope": 1})
            assert invalid.is_error and "invalid_request" in invalid.content[0].text

    anyio.run(main)


def test_session_token_sees_only_its_tools_and_sandbox(gw: RunningGateway, sandbox_id: str) -> None:
    token = issue(gw, sandbox_id, tools=["fs_read", "fs_list"])

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            names = sorted(t.name for t in (await c.list_tools()).tools)
            assert names == ["fs_list", "fs_read"]
            # Authorization failures are JSON-RPC errors (HTTP 403), not tool results.
            with pytest.raises(MCPError) as outside:
                await c.call_tool("terminal_run", {"command": "true"})
            assert outside.value.error.data["code"] == "insufficient_scope"
            with pytest.raises(MCPError) as other:
                await c.call_tool("fs_list", {"path": "/", "sandbox_id": "sb-000000000000"})
            assert other.value.code == -32051
            assert other.value.error.data["details"]["scope"] == "sandbox:sb-000000000000"

    anyio.run(main)


def test_mcp_rejects_bad_tokens(gw: RunningGateway) -> None:
    async def main() -> None:
        async with mcp_client(gw, "abx_forged") as c:
            await c.list_tools()

    with pytest.raises(BaseException) as failed:
        anyio.run(main)
    error = failed.value
    while isinstance(error, BaseExceptionGroup):  # the client's task groups wrap it
        (error,) = error.exceptions
    assert isinstance(error, MCPError), error
    assert error.code == -32050 and error.error.data["code"] == "unauthenticated"


def test_input_required_approval_for_current_clients(gw: RunningGateway, sandbox_id: str) -> None:
    token = issue(gw, sandbox_id)
    prompts: list[str] = []

    async def operator_decides(
        context: Any, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        prompts.append(params.message)
        with gw.operator() as op:
            pending = op.get("/v1/approvals", params={"status": "pending"}).json()
            mine = [a for a in pending if a["sandbox"] == sandbox_id]
            op.post(f"/v1/approvals/{mine[0]['id']}/approve")
        return types.ElicitResult(action="accept", content={"recheck": True})

    async def main() -> None:
        async with mcp_client(gw, token, elicitation_callback=operator_decides) as c:
            r = await c.call_tool(
                "terminal_run", {"command": "git push --force origin main || true"}
            )
            assert not r.is_error, r.content
            raw = await c.session.call_tool(
                "terminal_run", {"command": "rm -rf /tmp/never"}, allow_input_required=True
            )
            assert isinstance(raw, types.InputRequiredResult)
            # The state the client must return is sealed: it names a real pending approval
            # and cannot be edited to name another.
            state = unseal(load_key(gw.home), raw.request_state)
            assert state is not None and state["approval_id"].startswith("ap")
            assert unseal(load_key(gw.home), raw.request_state + "x") is None

    anyio.run(main)
    assert prompts and "approval" in prompts[0]


def test_stdio_server_beside_the_gateway(gw: RunningGateway) -> None:
    """This module's gateway serves the home: ``agentbox mcp`` relays to it (both eras)."""
    agentbox = str(Path(sys.executable).parent / "agentbox")
    env = {
        **os.environ,
        "AGENTBOX_HOME": str(gw.home),
        "AGENTBOX_OPERATOR_TOKEN": gw.operator_token,
    }
    params = StdioServerParameters(command=agentbox, args=["mcp"], env=env)

    async def main() -> None:
        for mode in ("auto", "legacy"):
            async with Client(params, mode=mode) as c:
                names = {t.name for t in (await c.list_tools()).tools}
                assert "terminal_run" in names
                r = await c.call_tool("terminal_run", {"command": "id -u; pwd"})
                assert r.structured_content["stdout"] == "1000\n/workspace\n", r.content

    from agentbox.runtime.runtime import Runtime

    before = {r.id for r in Runtime(gw.home).list()}
    anyio.run(main)
    # The sandboxes the stdio servers created died with them.
    assert {r.id for r in Runtime(gw.home).list()} == before
