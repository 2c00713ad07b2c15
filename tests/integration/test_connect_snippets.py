"""The README's "Connect your agent" snippets, each used as written by the official client.

Only the port is changed (the test gateway listens on a free one) and the token is the
one the README exports.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

import readmekit
from gateway_harness import RunningGateway, running_gateway


def snippet(name: str) -> str:
    return readmekit.snippet("connect", name)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("snip")) as running:
        yield running


@pytest.fixture(scope="module")
def session_token(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"disk": "64MiB"}).json()["id"]
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
        yield str(token)
        op.delete(f"/v1/sandboxes/{sid}")


def local(url: str, gw: RunningGateway) -> str:
    return url.replace("127.0.0.1:8848", f"127.0.0.1:{gw.port}")


def call_over_http(url: str, headers: dict[str, str]) -> str:
    async def main() -> str:
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with Client(streamable_http_client(url, http_client=http)) as client:
                result = await client.call_tool("terminal_run", {"command": "echo connected"})
                assert not result.is_error, result.content
                return str(result.structured_content["stdout"])

    return anyio.run(main)


def test_claude_code_snippet(gw: RunningGateway, session_token: str) -> None:
    argv = shlex.split(snippet("claude").replace("$AGENTBOX_SESSION_TOKEN", session_token))
    assert argv[:5] == ["claude", "mcp", "add", "--transport", "http"]
    url = local(argv[6], gw)
    name, _, value = argv[argv.index("--header") + 1].partition(": ")
    assert call_over_http(url, {name: value}) == "connected\n"


def test_codex_snippet(
    gw: RunningGateway, session_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = tomllib.loads(snippet("codex"))["mcp_servers"]["agentbox"]
    monkeypatch.setenv(server["bearer_token_env_var"], session_token)
    token = os.environ[server["bearer_token_env_var"]]
    assert (
        call_over_http(local(server["url"], gw), {"Authorization": f"Bearer {token}"})
        == "connected\n"
    )


def test_vscode_snippet(gw: RunningGateway, session_token: str) -> None:
    config = json.loads(snippet("vscode"))
    server = config["servers"]["agentbox"]
    assert server["type"] == "http"
    (prompt,) = config["inputs"]
    headers = {
        k: v.replace("${input:" + prompt["id"] + "}", session_token)
        for k, v in server["headers"].items()
    }
    assert call_over_http(local(server["url"], gw), headers) == "connected\n"


def test_stdio_snippet(gw: RunningGateway) -> None:
    server = json.loads(snippet("stdio"))["mcpServers"]["agentbox"]
    assert server["args"] == ["mcp"]
    # The README names the link scripts/install.sh makes; the test runs this checkout's.
    installed = Path(server["command"])
    assert installed.is_symlink() and installed.resolve().name == "agentbox", installed
    assert installed.resolve().parent.name == "bin", installed.resolve()
    command = str(Path(sys.executable).parent / "agentbox")
    # The module's gateway serves the home: the snippet's server talks to it.
    env = {
        **os.environ,
        "AGENTBOX_HOME": str(gw.home),
        "AGENTBOX_OPERATOR_TOKEN": gw.operator_token,
    }

    async def main() -> str:
        async with Client(
            StdioServerParameters(command=command, args=server["args"], env=env)
        ) as c:
            result = await c.call_tool("terminal_run", {"command": "echo connected"})
            return str(result.structured_content["stdout"])

    assert anyio.run(main) == "connected\n"
