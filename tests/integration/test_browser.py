"""The browser tools end to end: a real gateway over HTTP, a real sandbox, real Chromium
inside it, and a web site in the test internet (nettopo's namespace; no packet leaves
the host, every name resolves through the sandbox's static host map).

The gateway's config allows ``allowed.test`` and ``*.blocked.test`` and blocks
``*.blocked.test`` for the browser (``block_domains``): the create route puts that into
the sandbox's ``network.deny``, so only the egress path can be what refuses
``www.blocked.test``. ``other.test`` is simply not on the allowlist.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import re
import secrets
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from agentbox.audit.log import read_records
from agentbox.browser.manager import CHROMIUM, GVISOR_MIN_PIDS
from agentbox.config.settings import parse_settings
from agentbox.egressd import daemon as egressd
from agentbox.gateway.app import create_app
from agentbox.gateway.mcp_server import result_content
from agentbox.runtime.host import UID_BASE
from browserkit import SITE_PORT, Site, chromium_pids, leaf_pids, require_browser, site
from gateway_harness import RunningGateway, free_port
from hostres import runsc_execs, wait_for
from nettopo import UPSTREAM_A, UPSTREAM_B, Internet, internet
from tierkit import PROCESS_LISTING

SETTINGS = """
gateway:
  listen: 127.0.0.1:{port}
  auth:
    operator_token_env: AGENTBOX_TEST_OPERATOR_TOKEN
    ttl_seconds: 600
    rate_limit_per_minute: 100000
sandbox:
  network:
    mode: allowlist
    allow: ["allowed.test", "*.blocked.test"]
    ports: [{site_port}]
    hosts:
      allowed.test: {a}
      other.test: {b}
      www.blocked.test: {a}
tools:
  - name: terminal.run
    timeout_ms: 60000
  - name: browser.open
    headless: true
    viewport: 800x600
    block_domains: ["*.blocked.test"]
audit:
  path: {audit_path}
"""
BASE = f"http://allowed.test:{SITE_PORT}"
EXPECTED_HOSTS = {"allowed.test", "other.test", "www.blocked.test"}


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Internet, Site]]:
    require_browser()
    tmp = tmp_path_factory.mktemp("browser-net")
    with internet(tmp) as world, site(world.netns, tmp) as web:
        yield world, web


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    tmp = tmp_path_factory.mktemp("browser-gw")
    port = free_port()
    token = "op-" + secrets.token_hex(16)
    audit_path = tmp / "audit.jsonl"
    text = SETTINGS.format(port=port, site_port=SITE_PORT, a=UPSTREAM_A, b=UPSTREAM_B,
                           audit_path=audit_path)  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AGENTBOX_TEST_OPERATOR_TOKEN", token)
        app = create_app(parse_settings(text, "browser-test.yaml"), operator_token=token,
                         home=agentbox_home)  # fmt: skip
        server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
        )
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        wait_for(lambda: server.started or not thread.is_alive(), 30, "the gateway to start")
        assert thread.is_alive(), "the gateway thread died at start"
        try:
            yield RunningGateway(f"http://127.0.0.1:{port}", port, token, agentbox_home,
                                 audit_path, app)  # fmt: skip
        finally:
            server.should_exit = True
            thread.join(60)


def _create(gw: RunningGateway, isolation: str = "namespaces") -> str:
    body: dict[str, Any] = {"memory": "1GiB", "disk": "512MiB", "isolation": isolation}
    if isolation == "gvisor":
        body["pids"] = GVISOR_MIN_PIDS  # every Chromium thread is a host thread there
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])


def _destroy(gw: RunningGateway, sandbox: str) -> None:
    with gw.operator() as op:
        op.delete(f"/v1/sandboxes/{sandbox}")


@pytest.fixture(scope="module", params=("namespaces", "gvisor"))
def box(
    request: pytest.FixtureRequest, gw: RunningGateway, net: tuple[Internet, Site]
) -> Iterator[str]:
    """A sandbox on each isolation tier: every test below runs on both."""
    sandbox = _create(gw, request.param)
    try:
        yield sandbox
    finally:
        _destroy(gw, sandbox)


def call(gw: RunningGateway, sandbox: str, tool: str, token: str | None = None,
         **arguments: Any) -> httpx2.Response:  # fmt: skip
    with gw.client(token or gw.operator_token) as c:
        return c.post(f"/v1/tools/{tool}", json={"arguments": {**arguments, "sandbox_id": sandbox}})


def ok(gw: RunningGateway, sandbox: str, tool: str, **arguments: Any) -> dict[str, Any]:
    r = call(gw, sandbox, tool, **arguments)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def _ref(snapshot: str, role: str, name: str) -> str:
    match = re.search(rf'- {role} "{re.escape(name)}".*\[ref=([a-z0-9]+)\]', snapshot)
    assert match, f"no {role} {name!r} in the snapshot:\n{snapshot}"
    return match.group(1)


def _egress(gw: RunningGateway, sandbox: str) -> list[dict[str, Any]]:
    path = egressd.audit_path(gw.home)
    return [r for r in read_records(path, limit=None) if r["sandbox"] == sandbox]


def _denied(gw: RunningGateway, sandbox: str, host: str) -> list[dict[str, Any]]:
    return [
        r for r in _egress(gw, sandbox) if r["decision"] == "egress_denied" and r["host"] == host
    ]


def test_the_sandbox_network_carries_the_browser_block_domains(
    gw: RunningGateway, box: str
) -> None:
    with gw.operator() as op:
        network = op.get(f"/v1/sandboxes/{box}").json()["network"]
    assert "*.blocked.test" in network["deny"]


def test_an_allowed_page_renders_and_its_text_comes_back(
    gw: RunningGateway, box: str, net: tuple[Internet, Site]
) -> None:
    _, web = net
    opened = ok(gw, box, "browser_open", url=f"{BASE}/")
    assert opened["status"] == 200 and opened["title"] == "Welcome"
    assert opened["url"] == f"{BASE}/" and re.fullmatch(r"br-[0-9a-f]{12}", opened["handle"])
    assert "The sandbox browser rendered this paragraph." in opened["text"]
    assert opened["truncated"] is False
    assert f"GET allowed.test:{SITE_PORT} /" in web.requests()
    short = ok(gw, box, "browser_open", url=f"{BASE}/", handle=opened["handle"], max_chars=10)
    assert short["truncated"] is True and len(short["text"]) == 10
    # Chromium phoned nobody: every name it asked the proxy for is one a page named (a
    # connection it opened and closed unused, e.g. a preconnect on a busy host, names none).
    named = {r["host"] for r in _egress(gw, box) if r["host"]}
    assert "allowed.test" in named, named  # the control: the page's own name is there
    assert named <= EXPECTED_HOSTS, named - EXPECTED_HOSTS
    ok(gw, box, "browser_close", handle=opened["handle"])


def test_snapshot_then_click_a_link_by_ref_navigates(gw: RunningGateway, box: str) -> None:
    handle = ok(gw, box, "browser_open", url=f"{BASE}/")["handle"]
    snap = ok(gw, box, "browser_snapshot", handle=handle)
    assert (
        'navigation "Site"' in snap["snapshot"]
        and 'heading "Welcome to the test site"' in (snap["snapshot"])
    )
    ref = _ref(snap["snapshot"], "link", "Next page")
    clicked = ok(gw, box, "browser_click", handle=handle, ref=ref)
    assert clicked["navigated"] is True
    assert clicked["url"] == f"{BASE}/second" and clicked["title"] == "Second page"
    # The old refs ended with the old page: the error says what to do.
    stale = call(gw, box, "browser_click", handle=handle, ref=ref)
    assert stale.status_code == 404, stale.text
    error = stale.json()["error"]
    assert error["code"] == "browser_ref_not_found" and "browser_snapshot" in error["message"]
    ok(gw, box, "browser_close", handle=handle)


def test_type_into_a_field_and_enter_submits_the_form(
    gw: RunningGateway, box: str, net: tuple[Internet, Site]
) -> None:
    _, web = net
    handle = ok(gw, box, "browser_open", url=f"{BASE}/")["handle"]
    snap = ok(gw, box, "browser_snapshot", handle=handle)
    ref = _ref(snap["snapshot"], "textbox", "Query")
    typed = ok(gw, box, "browser_type", handle=handle, ref=ref, text="blue kittens", submit=True)
    assert typed["navigated"] is True and typed["title"] == "Results"
    assert typed["url"] == f"{BASE}/search?q=blue+kittens"
    after = ok(gw, box, "browser_snapshot", handle=handle, text=True)
    assert "Results for blue kittens" in after["text"]
    assert f"GET allowed.test:{SITE_PORT} /search?q=blue+kittens" in web.requests()
    # A key press on the page, and a key that does not exist.
    pressed = ok(gw, box, "browser_press", handle=handle, key="Tab")
    assert pressed["navigated"] is False
    bad = call(gw, box, "browser_press", handle=handle, key="NoSuchKey")
    assert bad.status_code == 400 and "Enter" in bad.json()["error"]["message"]
    ok(gw, box, "browser_close", handle=handle)


def test_blocked_subresources_and_redirects_never_reach_the_upstream(
    gw: RunningGateway, box: str, net: tuple[Internet, Site]
) -> None:
    _, web = net
    opened = ok(gw, box, "browser_open", url=f"{BASE}/mixed")
    handle = opened["handle"]
    assert opened["status"] == 200 and "mixed content" in opened["text"]
    seen = web.requests()
    assert f"GET allowed.test:{SITE_PORT} /ok.png" in seen  # the allowed image: control
    assert not [line for line in seen if "pixel.png" in line or "evil.js" in line], seen
    wait_for(lambda: _denied(gw, box, "other.test"), 10, "the denied image in egress.jsonl")
    blocked = wait_for(lambda: _denied(gw, box, "www.blocked.test"), 10, "the denied script")
    assert any("deny pattern" in r["reason"] for r in blocked), blocked

    for target, host in [("www.blocked.test", "www.blocked.test"), ("other.test", "other.test")]:
        before = len(_denied(gw, box, host))
        hop = f"{BASE}/redirect-to/{target}:{SITE_PORT}/landing"
        result = ok(gw, box, "browser_open", url=hop, handle=handle)
        assert result["status"] == 403, result  # the egress proxy's answer
        assert result["url"] == f"http://{target}:{SITE_PORT}/landing"
        wait_for(lambda h=host, n=before: len(_denied(gw, box, h)) > n, 10,  # type: ignore[misc]
                 f"the redirect to {host} in egress.jsonl")  # fmt: skip
    reached = [line.split()[1] for line in web.requests()]
    assert set(reached) == {f"allowed.test:{SITE_PORT}"}, web.requests()
    ok(gw, box, "browser_close", handle=handle)


def test_a_page_that_cannot_load_says_why_and_leaves_no_handle(
    gw: RunningGateway, box: str
) -> None:
    gateway = gw.app.state.parts.gateway
    before = gateway.browsers.handles(box)
    r = call(gw, box, "browser_open", url="https://other.test/")  # CONNECT refused
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "navigation_failed" and "egress policy" in error["message"]
    assert gateway.browsers.handles(box) == before
    wait_for(lambda: _denied(gw, box, "other.test"), 10, "the refused CONNECT in egress.jsonl")


def test_the_gateway_refuses_a_blocked_top_level_url_with_its_rule(
    gw: RunningGateway, box: str, net: tuple[Internet, Site]
) -> None:
    _, web = net
    before = web.requests()
    r = call(gw, box, "browser_open", url=f"http://WWW.Blocked.test:{SITE_PORT}/")
    assert r.status_code == 403, r.text
    error = r.json()["error"]
    assert error["code"] == "policy_denied" and "block_domains" in error["message"]
    assert web.requests() == before
    bad = call(gw, box, "browser_open", url="javascript:alert(1)")
    assert bad.status_code == 400 and "absolute URL" in bad.json()["error"]["message"]


def test_a_screenshot_is_a_png_of_the_viewport(gw: RunningGateway, box: str) -> None:
    handle = ok(gw, box, "browser_open", url=f"{BASE}/")["handle"]
    shot = ok(gw, box, "browser_screenshot", handle=handle)
    png = base64.b64decode(shot["png_base64"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png[12:16] == b"IHDR"
    assert struct.unpack(">II", png[16:24]) == (800, 600) == (shot["width"], shot["height"])
    # In MCP the picture is an image block, not base64 inside the text.
    blocks = result_content(shot)
    assert [b.type for b in blocks] == ["text", "image"]
    assert shot["png_base64"] not in blocks[0].text  # type: ignore[union-attr]
    ok(gw, box, "browser_close", handle=handle)


def test_screenshot_over_mcp_is_an_image_block(gw: RunningGateway, box: str) -> None:
    handle = ok(gw, box, "browser_open", url=f"{BASE}/second")["handle"]
    with gw.operator() as op:
        token = op.post("/v1/tokens", json={"sandbox": box}).json()["token"]

    async def main() -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=120) as h:
            transport = streamable_http_client(f"{gw.url}/mcp", http_client=h)
            async with Client(transport) as client:
                names = {t.name for t in (await client.list_tools()).tools}
                assert {"browser_open", "browser_snapshot", "browser_screenshot"} <= names
                shot = await client.call_tool("browser_screenshot", {"handle": handle})
                # The same PNG, saved in the sandbox, comes as a resource link to read.
                [link] = [c for c in shot.content if c.type == "resource_link"]
                return shot, link, await client.read_resource(link.uri)

    result, link, read = asyncio.run(main())
    assert not result.is_error, result
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data)[:8] == b"\x89PNG\r\n\x1a\n"
    path = result.structured_content["file"]
    assert link.uri == f"sandbox://{box}{path}" and link.mime_type == "image/png"
    [blob] = read.contents
    assert blob.mime_type == "image/png" and blob.blob == images[0].data
    ok(gw, box, "browser_close", handle=handle)


def test_handles_belong_to_their_sandbox(gw: RunningGateway, box: str) -> None:
    handle = ok(gw, box, "browser_open", url=f"{BASE}/")["handle"]
    other = _create(gw)
    try:
        with gw.operator() as op:
            token = op.post("/v1/tokens", json={"sandbox": other}).json()["token"]
        r = call(gw, other, "browser_snapshot", token=token, handle=handle)
        assert r.status_code == 404 and r.json()["error"]["code"] == "browser_handle_not_found"
        r = call(gw, box, "browser_snapshot", token=token, handle=handle)
        assert r.status_code == 403, r.text  # the token is bound to the other sandbox
    finally:
        _destroy(gw, other)
    ok(gw, box, "browser_close", handle=handle)
    closed = call(gw, box, "browser_snapshot", handle=handle)
    assert closed.status_code == 404 and "browser_open" in closed.json()["error"]["message"]


def _in_sandbox_chromium(gw: RunningGateway, sandbox: str) -> list[str]:
    """Chromium's processes as the sandbox's own /proc lists them (gVisor's kernel: none
    of them is a host process there)."""
    r = gw.app.state.parts.gateway.runtime.commands(sandbox).run(PROCESS_LISTING)
    # The control: the listing ran and saw itself (else "no Chromium" would mean nothing).
    assert r.ok and "/proc/[0-9]*" in r.stdout, r
    return [line for line in r.stdout.splitlines() if line.startswith(CHROMIUM)]


def _browser_runs(gw: RunningGateway, sandbox: str, leaf: str) -> bool:
    """Whether anything of the browser ``leaf`` still runs: on the namespaces tier its
    cgroup leaf; on gvisor its host-side ``runsc exec`` (gone once its process tree is)
    and Chromium in the sandbox's /proc."""
    if gw.app.state.parts.gateway.runtime.get(sandbox).isolation == "namespaces":
        return bool(leaf_pids(sandbox, leaf))
    return bool(runsc_execs(sandbox, leaf)) or bool(_in_sandbox_chromium(gw, sandbox))


def test_an_idle_page_is_closed_and_the_browser_with_it(gw: RunningGateway, box: str) -> None:
    browsers = gw.app.state.parts.gateway.browsers
    config = browsers.config
    browsers.config = dataclasses.replace(config, idle_timeout=1.0)
    try:
        handle = ok(gw, box, "browser_open", url=f"{BASE}/")["handle"]
        leaf = browsers.leaf(box)
        assert leaf is not None and _browser_runs(gw, box, leaf)
        wait_for(lambda: handle not in browsers.handles(box), 15, "the idle page to close")
        r = call(gw, box, "browser_snapshot", handle=handle)
        assert r.status_code == 404 and "idle" in r.json()["error"]["message"]
        # The browser went with its last page: no process, no leaf left.
        wait_for(lambda: not _browser_runs(gw, box, leaf) and browsers.leaf(box) is None, 30,
                 "the browser to stop with its last page")  # fmt: skip
    finally:
        browsers.config = config


def test_the_browser_refuses_a_gvisor_sandbox_with_too_few_pids(gw: RunningGateway) -> None:
    """It would end the whole sandbox at the pids limit: refused first, saying what to do."""
    with gw.operator() as op:
        body = {"memory": "512MiB", "disk": "256MiB", "isolation": "gvisor", "network": "none"}
        sandbox = op.post("/v1/sandboxes", json=body).json()["id"]
    try:
        r = call(gw, sandbox, "browser_open", url="data:text/html,<p>x</p>")
        assert r.status_code == 429, r.text
        error = r.json()["error"]
        assert error["code"] == "limit_exceeded" and f"pids={GVISOR_MIN_PIDS}" in error["message"]
    finally:
        _destroy(gw, sandbox)


def test_destroying_a_gvisor_sandbox_ends_its_browser(gw: RunningGateway) -> None:
    """On gvisor Chromium is no host process: what the host holds of it is one runsc
    exec, which ends with the sandbox."""
    sandbox = _create(gw, "gvisor")
    destroyed = False
    try:
        handle = ok(gw, sandbox, "browser_open", url="data:text/html,<title>x</title>")["handle"]
        assert runsc_execs(sandbox, "b") and _in_sandbox_chromium(gw, sandbox)
        slot = gw.app.state.parts.gateway.runtime.get(sandbox).slot
        assert not chromium_pids(UID_BASE + slot)  # inside the Sentry, not on the host
        _destroy(gw, sandbox)
        destroyed = True
        assert gw.app.state.parts.gateway.browsers.handles(sandbox) == []
        wait_for(lambda: not runsc_execs(sandbox, "b"), 15, "the browser's runsc exec to end")
        r = call(gw, sandbox, "browser_snapshot", handle=handle)
        assert r.status_code == 404, r.text
    finally:
        if not destroyed:
            _destroy(gw, sandbox)


def test_destroying_the_sandbox_ends_its_browser(gw: RunningGateway) -> None:
    sandbox = _create(gw)
    destroyed = False
    try:
        handle = ok(gw, sandbox, "browser_open", url="data:text/html,<title>x</title>")["handle"]
        browsers = gw.app.state.parts.gateway.browsers
        slot = gw.app.state.parts.gateway.runtime.get(sandbox).slot
        pids = chromium_pids(UID_BASE + slot)
        assert pids
        _destroy(gw, sandbox)
        destroyed = True
        assert browsers.handles(sandbox) == []
        wait_for(lambda: not chromium_pids(UID_BASE + slot), 15, "chromium to die")
        r = call(gw, sandbox, "browser_snapshot", handle=handle)
        assert r.status_code == 404, r.text
    finally:
        if not destroyed:
            _destroy(gw, sandbox)


def test_browser_calls_are_audited(gw: RunningGateway, box: str) -> None:
    records = [r for r in read_records(gw.audit_path, limit=None) if r["sandbox"] == box]
    tools = {r["tool"] for r in records if r["decision"] == "allowed"}
    assert {"browser_open", "browser_snapshot", "browser_click", "browser_type"} <= tools
    assert any(r["decision"] == "denied" and r["tool"] == "browser_open" for r in records)
