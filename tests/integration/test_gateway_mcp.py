"""MCP with the official client: Streamable HTTP (both protocol eras) and stdio."""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from agentbox.gateway.sealed import load_key, unseal
from agentbox.runtime.host import UID_BASE
from agentbox.runtime.runtime import Runtime
from gateway_harness import RunningGateway, issue, mcp_client, running_gateway
from tierkit import not_on_gvisor

# Every test on both isolation tiers (tests/conftest.py, default_tier).
pytestmark = pytest.mark.usefixtures("default_tier")

NAME_RULE = r"^[a-zA-Z0-9_-]{1,64}$"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("mcp"), "20s") as running:
        yield running


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway, default_tier: str) -> Iterator[str]:
    with gw.sandbox() as sid:  # after default_tier: the sandbox is on the module's tier
        yield sid


MODE_AND_OWNER = (
    "python3 -c 'import os, stat, sys; s = os.stat(sys.argv[1]); "
    "print(stat.filemode(s.st_mode), s.st_nlink, s.st_uid, s.st_gid)'"
)


def sandbox_uid(gw: RunningGateway, sandbox: str) -> str:
    """The sandbox user's uid as its commands see it: 1000, or its host uid on gvisor."""
    record = Runtime(gw.home).get(sandbox)
    return "1000" if record.isolation == "namespaces" else str(UID_BASE + record.slot)


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


def _raw_post(gw: RunningGateway, token: str, body: dict[str, Any],
              headers: list[tuple[str, str]]) -> tuple[int, Any]:  # fmt: skip
    """POST /mcp with header values sent byte for byte (httpx refuses trailing OWS)."""
    data = json.dumps(body).encode()
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=60)
    try:
        conn.putrequest("POST", "/mcp", skip_accept_encoding=True)
        for key, value in [("Content-Type", "application/json"),
                           ("Accept", "application/json, text/event-stream"),
                           ("Authorization", f"Bearer {token}"),
                           ("Content-Length", str(len(data))), *headers]:  # fmt: skip
            conn.putheader(key, value)
        conn.endheaders(data)
        response = conn.getresponse()
        text = response.read().decode()
    finally:
        conn.close()
    if response.getheader("content-type", "").startswith("text/event-stream"):
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    return response.status, json.loads(text)


def test_header_values_are_read_without_surrounding_whitespace(
    gw: RunningGateway, sandbox_id: str
) -> None:
    """RFC 9110 section 5.5: a field value excludes its leading and trailing OWS, so
    ``Mcp-Name:  terminal_run \t`` names terminal_run (the conformance suite's
    sep-2243-server-accepts-whitespace-header-value; it was a 400 mismatch here, and the
    test proxy's 500)."""
    token = issue(gw, sandbox_id)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {}}  # fmt: skip
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call",
            "params": {"name": "terminal_run", "arguments": {"command": "echo ows-ok"},
                       "_meta": meta}}  # fmt: skip
    for pad in (" ", "\t", "  \t "):
        status, reply = _raw_post(gw, token, call, [
            ("MCP-Protocol-Version", f"2026-07-28{pad}"),
            ("Mcp-Method", f"{pad}tools/call{pad}"),
            ("Mcp-Name", f"{pad}terminal_run{pad}"),
        ])  # fmt: skip
        assert status == 200, reply
        assert reply["result"]["structuredContent"]["stdout"] == "ows-ok\n", reply
    # Whitespace inside the value is still a mismatch.
    status, reply = _raw_post(gw, token, call, [("MCP-Protocol-Version", "2026-07-28"),
                                                ("Mcp-Method", "tools/call"),
                                                ("Mcp-Name", "terminal _run")])  # fmt: skip
    assert status == 400 and reply["error"]["code"] == -32020, reply


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


def test_approval_waits_for_a_current_client_without_elicitation(
    gw: RunningGateway, sandbox_id: str
) -> None:
    """A 2026-07-28 client that declares no elicitation is never sent the approval's
    elicitation (SEP-2322: only input requests the client declared; the suite's
    input-required-result-capability-check): its call waits for the operator instead."""
    token = issue(gw, sandbox_id)

    def operator_approves() -> None:
        with gw.operator() as op:
            for _ in range(600):  # the request lands asynchronously; bounded
                pending = op.get("/v1/approvals", params={"status": "pending"}).json()
                mine = [a for a in pending if "/tmp/waited" in a["summary"]]
                if mine:
                    op.post(f"/v1/approvals/{mine[0]['id']}/approve").raise_for_status()
                    return
                time.sleep(0.05)
        raise AssertionError("no approval was asked for")

    async def main() -> None:
        async with mcp_client(gw, token) as c:  # no elicitation_callback: none declared
            assert c.protocol_version == "2026-07-28"
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, operator_approves)
                r = await c.session.call_tool(
                    "terminal_run", {"command": "rm -rf /tmp/waited"}, allow_input_required=True
                )
            assert isinstance(r, types.CallToolResult) and not r.is_error, r

    anyio.run(main)


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
                uid, cwd = r.structured_content["stdout"].split()
                # gvisor: the sandbox user is its host uid (no user namespace there)
                assert uid == "1000" or int(uid) >= UID_BASE, r.content
                assert cwd == "/workspace", r.content

    before = {r.id for r in Runtime(gw.home).list() if r.state != "destroying"}
    anyio.run(main)
    # The sandboxes the stdio servers created died with them (the gateway may still be
    # removing their host side: "destroying", runtime/teardown.py).
    left = {r.id for r in Runtime(gw.home).list() if r.state != "destroying"}
    assert left == before


def test_output_is_sized_for_a_context_and_saved_whole(gw: RunningGateway, sandbox_id: str) -> None:
    """`seq 1 200000` is 1.3 MB: the result keeps 16 KiB of it (head and tail, cut marked,
    naming the file), and the whole of it is in the sandbox for fs_read to page."""
    token = issue(gw, sandbox_id)
    full = "".join(f"{i}\n" for i in range(1, 200001)).encode()

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            r = await c.call_tool("terminal_run", {"command": "seq 1 200000"})
            out = r.structured_content
            assert not r.is_error and out["truncated"] and out["exit_code"] == 0
            assert out["stdout_bytes_total"] == len(full)
            assert len(out["stdout"].encode()) < 17_000  # the 16 KiB default and its marker
            assert sum(len(b.text) for b in r.content if b.type == "text") < 40_000
            assert out["stdout"].startswith("1\n2\n3\n") and out["stdout"].endswith("200000\n")
            path = out["stdout_file"]
            assert path.startswith("/tmp/agentbox-output/") and path.endswith(".stdout")
            assert f"of stdout cut here; the full stdout is in {path}" in out["stdout"]
            assert out["stderr_file"] is None and out["limits_applied"] == []
            got = b""
            while len(got) < len(full):  # paged with fs_read, as an agent would
                page = await c.call_tool("fs_read", {"path": path, "offset": len(got),
                                                     "length": 500_000})  # fmt: skip
                assert not page.is_error, page.content
                got += page.structured_content["content"].encode()
            assert got == full
            # python's stat, not ls -l: coreutils' statx fails on this runsc (docs/design.md)
            owner = await c.call_tool("terminal_run", {"command": f"{MODE_AND_OWNER} {path}"})
            uid = sandbox_uid(gw, sandbox_id)
            assert owner.structured_content["stdout"].split() == ["-rw-------", "1", uid, uid]

            # The cap is per call, within the configured maximum (65536 in this config).
            more = await c.call_tool(
                "terminal_run", {"command": "seq 1 200000", "max_output_bytes": 40_000}
            )
            assert 40_000 <= len(more.structured_content["stdout"]) < 41_000
            assert more.structured_content["limits_applied"] == []
            most = await c.call_tool(
                "terminal_run", {"command": "seq 1 200000", "max_output_bytes": 10**6}
            )
            assert 65_536 <= len(most.structured_content["stdout"]) < 66_600
            [note] = most.structured_content["limits_applied"]
            assert "max_output_bytes 1000000 was cut to the maximum 65536" in note
            small = await c.call_tool("terminal_run", {"command": "echo hi"})
            assert small.structured_content["stdout_file"] is None

            # Saving is charged to the sandbox's disk: when it is full, the result says so.
            fill = "rm -f /tmp/agentbox-output/*; head -c 200000000 /dev/zero > /workspace/fill"
            await c.call_tool("terminal_run", {"command": fill})
            try:
                r = await c.call_tool("terminal_run", {"command": "seq 1 200000"})
                out = r.structured_content
                assert out["truncated"] and out["stdout_file"] is None
                assert "the full stdout could not be saved: " in out["stdout"]
                assert "disk space or quota is used up" in out["stdout"] and out["stdout"].endswith(
                    "200000\n"
                )
            finally:
                await c.call_tool("terminal_run", {"command": "rm -f /workspace/fill"})

    anyio.run(main)


def test_limits_applied_are_named_and_relative_cwd_is_workspace(
    gw: RunningGateway, sandbox_id: str
) -> None:
    token = issue(gw, sandbox_id)

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            r = await c.call_tool("terminal_run", {"command": "true", "timeout_ms": 300_000})
            [note] = r.structured_content["limits_applied"]
            assert "timeout_ms 300000 was cut to the maximum 30000" in note
            assert "tools[terminal.run].timeout_ms" in note
            ok = await c.call_tool("terminal_run", {"command": "true", "timeout_ms": 20_000})
            assert ok.structured_content["limits_applied"] == []
            made = await c.call_tool("fs_mkdir", {"path": "rel/sub"})
            assert not made.is_error, made.content
            here = await c.call_tool("terminal_run", {"command": "pwd", "cwd": "rel/sub"})
            assert here.structured_content["stdout"] == "/workspace/rel/sub\n", here.content
            up = await c.call_tool("process_start", {"command": "pwd", "cwd": "rel/../rel"})
            pid = up.structured_content["process_id"]
            for _ in range(200):
                read = await c.call_tool("process_read", {"process_id": pid})
                if not read.structured_content["running"]:
                    break
                await anyio.sleep(0.05)
            assert read.structured_content["data"] == "/workspace/rel\n"

    anyio.run(main)


def test_terminal_run_returns_when_the_command_waits_for_input(
    gw: RunningGateway, sandbox_id: str, default_tier: str
) -> None:
    not_on_gvisor(default_tier, "no input detection there: a command's stdin is what was "
                  "given, then end-of-file (docs/design.md, feature table)")  # fmt: skip
    token = issue(gw, sandbox_id)
    ask = 'python3 -c \'print("deleted" if input("Delete 3 files? [y/N] ") == "y" else "kept")\''

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            r = await c.call_tool("terminal_run", {"command": ask, "timeout_ms": 25_000})
            out = r.structured_content
            assert not r.is_error and out["waiting_for_input"] and not out["timed_out"]
            assert out["prompt"] == "Delete 3 files? [y/N]" and out["exit_code"] is None
            pid = out["process_id"]
            assert pid.startswith("p-") and pid in out["hint"] and "process_write" in out["hint"]
            assert out["duration_ms"] < 20_000  # early: not at the timeout
            read = await c.call_tool("process_read", {"process_id": pid})
            assert read.structured_content["waiting_for_input"], read.structured_content
            assert read.structured_content["prompt"] == "Delete 3 files? [y/N]"
            w = await c.call_tool("process_write", {"process_id": pid, "data": "y\n"})
            assert w.structured_content["written"] == 2
            while (read := await c.call_tool("process_read", {"process_id": pid})
                   ).structured_content["running"]:  # fmt: skip
                await anyio.sleep(0.05)
            assert read.structured_content["exit_code"] == 0
            assert read.structured_content["data"].endswith("deleted\n")
            assert not read.structured_content["waiting_for_input"]
            late = await c.call_tool("process_signal", {"process_id": pid})
            assert late.structured_content == {"process_id": pid, "signalled": False,
                                               "running": False, "exit_code": 0}  # fmt: skip
            # With the answer in stdin it just runs.
            again = await c.call_tool("terminal_run", {"command": ask, "stdin": "n\n"})
            assert again.structured_content["stdout"].endswith("kept\n")
            assert not again.structured_content["waiting_for_input"]

    anyio.run(main)


def test_saved_outputs_do_not_pile_up(gw: RunningGateway, sandbox_id: str) -> None:
    from agentbox.gateway.tools import SAVED_OUTPUTS_KEPT

    token = issue(gw, sandbox_id)

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            paths = []
            for _ in range(SAVED_OUTPUTS_KEPT + 5):
                r = await c.call_tool("terminal_run", {"command": "seq 1 20000"})
                paths.append(r.structured_content["stdout_file"])
            listed = await c.call_tool("fs_list", {"path": "/tmp/agentbox-output"})
            left = {e["path"] for e in listed.structured_content["entries"]}
            assert left == set(paths[-SAVED_OUTPUTS_KEPT:])  # the newest, the last one too

    anyio.run(main)


def test_tools_list_states_this_gateways_limits(gw: RunningGateway, sandbox_id: str) -> None:
    """The harness config (timeout_ms 30000, max_output_bytes 65536, fs.read 1 MiB) is what
    tools/list and GET /v1/tools tell the client, and what a call without them gets."""
    token = issue(gw, sandbox_id)

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            tools = {t.name: t.input_schema["properties"] for t in (await c.list_tools()).tools}
            assert tools["terminal_run"]["timeout_ms"]["default"] == 30000
            assert "30000" in tools["terminal_run"]["timeout_ms"]["description"]
            assert "65536" in tools["shell_run"]["max_output_bytes"]["description"]
            assert tools["fs_read"]["length"]["default"] == 1048576
            assert "1048576" in tools["fs_read"]["length"]["description"]
            listed = await c.call_tool("fs_list", {})  # path and depth from their defaults
            assert not listed.is_error, listed.content

    anyio.run(main)
    with gw.client(token) as rest:
        listed = {t["name"]: t["input_schema"]["properties"] for t in rest.get("/v1/tools").json()}
    assert listed["process_read"]["limit"]["default"] == 65536
