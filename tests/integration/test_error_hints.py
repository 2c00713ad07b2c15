"""One error, the next step spelled for the surface that raised it: over MCP the tool and
its arguments, over REST the tool route, on the CLI the command, in the SDK the method
(in-process and through a gateway alike). No MCP error text reads like a Python call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agentbox import Sandbox
from agentbox.errors import AgentboxError, EditMismatch, FileNotFound, SandboxNotFound
from gateway_harness import RunningGateway, running_gateway

AGENTBOX = str(Path(sys.executable).parent / "agentbox")
GONE = "sb-000000000000"
MISSING = "/workspace/nope/deeper"  # its parent does not exist either
# What a Python method call, or a hint of another surface, looks like in a message.
PYTHON_CALL = re.compile(r"\b\w+\.\w+\(|=None|\bsb\.|Sandbox\.|`agentbox ")


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("hints"), "20s") as running:
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()["id"]
        op.post("/v1/tools/fs_write", json={"arguments": {
            "sandbox_id": sid, "path": "twice.txt", "content": "a = 1\nb = 1\n"}})  # fmt: skip
        yield sid
        op.delete(f"/v1/sandboxes/{sid}")


def mcp_errors(gw: RunningGateway, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The text of each call's error result, through the official MCP client."""
    out: list[str] = []

    async def main() -> None:
        headers = {"Authorization": f"Bearer {gw.operator_token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as h:
            async with Client(streamable_http_client(f"{gw.url}/mcp", http_client=h)) as c:
                for name, args in calls:
                    r = await c.call_tool(name, args)
                    assert r.is_error, (name, r.structured_content)
                    out.append(r.content[0].text)

    anyio.run(main)
    return out


def test_mcp_names_tools_and_arguments(gw: RunningGateway, sandbox_id: str) -> None:
    with gw.operator() as op:  # a background process without stdin
        started = op.post(f"/v1/sandboxes/{sandbox_id}/processes", json={"command": "sleep 60"})
    deaf = started.json()["process_id"]
    missing, ambiguous, gone, denied, no_process, no_stdin = mcp_errors(gw, [
        ("fs_list", {"sandbox_id": sandbox_id, "path": MISSING}),
        ("fs_edit", {"sandbox_id": sandbox_id, "path": "twice.txt", "old": "= 1", "new": "= 2"}),
        ("fs_list", {"sandbox_id": GONE}),
        ("terminal_run", {"sandbox_id": sandbox_id, "command": "curl http://x"}),
        ("process_read", {"sandbox_id": sandbox_id, "process_id": "p-000000000000"}),
        ("process_write", {"sandbox_id": sandbox_id, "process_id": deaf, "data": "y\n"}),
    ])  # fmt: skip
    assert missing.startswith("file_not_found: ")
    assert 'call `fs_list` with {"path": "/workspace/nope"} to see what exists' in missing
    assert ambiguous.startswith("edit_mismatch: ")
    assert 'call `fs_edit` with {"count": 2}' in ambiguous
    assert gone.startswith("sandbox_not_found: ") and "does not exist" in gone
    assert denied.startswith("policy_denied: ")
    assert "call `process_list` with {}" in no_process
    assert 'call `process_start` with {"stdin": true}' in no_stdin
    for text in (missing, ambiguous, gone, denied, no_process, no_stdin):
        assert not PYTHON_CALL.search(text), text


def test_rest_names_the_tool_route(gw: RunningGateway, sandbox_id: str) -> None:
    with gw.operator() as op:
        r = op.get(f"/v1/sandboxes/{sandbox_id}/files/list", params={"path": MISSING})
    error = r.json()["error"]
    assert error["code"] == "file_not_found"
    assert (
        'send `POST /v1/tools/fs_list` with {"arguments": {"path": "/workspace/nope"}}'
        in (error["message"])
    )
    assert error["details"]["hint"] == {
        "action": "fs_list", "args": {"path": "/workspace/nope"},
        "text": "{call} to see what exists",
    }  # fmt: skip
    assert not PYTHON_CALL.search(error["message"])


def _sdk_errors(sb: Sandbox, connect: Any) -> list[AgentboxError]:
    errors: list[AgentboxError] = []
    with pytest.raises(FileNotFound) as missing:
        sb.files.list(MISSING)
    with pytest.raises(EditMismatch) as ambiguous:
        sb.files.edit("/workspace/twice.txt", "= 1", "= 2")
    with pytest.raises(SandboxNotFound) as gone:
        connect(GONE)
    errors += [missing.value, ambiguous.value, gone.value]
    return errors


def _assert_sdk_spelling(errors: list[AgentboxError]) -> None:
    missing, ambiguous, gone = (str(e) for e in errors)
    assert "call `sb.files.list('/workspace/nope')` to see what exists" in missing
    assert "pass `count=2` to `sb.files.edit`" in ambiguous
    assert "call `Sandbox.list()` to list live sandboxes" in gone
    for text in (missing, ambiguous, gone):
        assert "POST /v1" not in text and "`fs_" not in text and "`agentbox " not in text


def test_sdk_in_process_names_methods(
    gw: RunningGateway, sandbox_id: str, agentbox_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGENTBOX_URL", raising=False)
    sb = Sandbox.connect(sandbox_id, home=agentbox_home)
    _assert_sdk_spelling(_sdk_errors(sb, lambda sid: Sandbox.connect(sid, home=agentbox_home)))


def test_sdk_through_the_gateway_names_methods(
    gw: RunningGateway, sandbox_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENTBOX_URL", gw.url)
    monkeypatch.setenv("AGENTBOX_TOKEN", gw.operator_token)
    sb = Sandbox.connect(sandbox_id)
    _assert_sdk_spelling(_sdk_errors(sb, Sandbox.connect))


@pytest.mark.parametrize("through", ["in-process", "gateway"])
def test_cli_names_commands(
    gw: RunningGateway, sandbox_id: str, agentbox_home: Path, through: str
) -> None:
    env = {**os.environ, "AGENTBOX_HOME": str(agentbox_home)}
    env.pop("AGENTBOX_URL", None)
    if through == "gateway":
        env |= {"AGENTBOX_URL": gw.url, "AGENTBOX_TOKEN": gw.operator_token}
        env.pop("AGENTBOX_HOME")

    def cli(*args: str) -> str:
        done = subprocess.run([AGENTBOX, *args], capture_output=True, text=True, env=env,
                              timeout=120)  # fmt: skip
        assert done.returncode == 1, done
        return done.stderr

    missing = cli("files", "ls", sandbox_id, MISSING)
    assert missing.startswith("error[file_not_found]: ")
    assert "run `agentbox files ls ID /workspace/nope` to see what exists" in missing
    gone = cli("sandbox", "get", GONE)
    assert "run `agentbox sandbox ls` to list live sandboxes" in gone
    for text in (missing, gone):
        assert not re.search(r"\bsb\.|Sandbox\.|\w\(|POST /v1|`fs_", text), text
