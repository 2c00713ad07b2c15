"""The web console end to end: a real gateway on a loopback port and real headless Chromium
(Debian's, driven by Playwright) doing what an operator does: log in with the operator
token, watch sandboxes, approve a waiting command, follow the audit tail.

And its security promises: the token stays in page memory (no storage, cookie or URL),
server data is shown as text (an audit record carrying markup creates no element and runs
no script), and the console's responses carry a strict Content-Security-Policy that the
page works under (no violation is reported).

Screenshots go to ``$AGENTBOX_TEST_ARTIFACTS/console`` (default: a pytest temp dir); each
test prints where.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, expect, sync_playwright

from browserkit import require_browser
from gateway_harness import RunningGateway, running_gateway

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # the tests run as root, where Chromium's own sandbox cannot start
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--no-first-run",
    # Loopback only: every host name fails to resolve (the gateway is addressed by IP).
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
]
WAIT_MS = 20_000
XSS = "<img src=x onerror=alert(1)>"
OPTIONAL = ("/v1/usage", "/v1/providers")
REQUIRED_CSP = [
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "connect-src 'self'",
    "frame-ancestors 'none'",
    "base-uri 'none'",
]


@pytest.fixture(scope="module")
def gw(
    tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None
) -> Iterator[RunningGateway]:
    with running_gateway(
        agentbox_home, tmp_path_factory.mktemp("console-gw"), approval_timeout="60s"
    ) as running:
        yield running


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("AGENTBOX_TEST_ARTIFACTS")
    base = Path(configured) if configured else tmp_path_factory.mktemp("artifacts")
    path = base / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    require_browser()
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Watched:
    """What the page did besides what the test asked: dialogs, errors, requests."""

    page: Page
    dialogs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def watched(browser: Browser, gw: RunningGateway) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    w = Watched(page)

    def on_dialog(dialog: Dialog) -> None:
        w.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def on_console(message: ConsoleMessage) -> None:
        # The provider pool's routes may be absent: their 404 is the "not configured" case.
        if message.type == "error" and not message.location["url"].endswith(OPTIONAL):
            w.errors.append(f"{message.text} ({message.location['url']})")

    page.on("dialog", on_dialog)
    page.on("console", on_console)
    page.on("pageerror", lambda error: w.errors.append(f"page error: {error}"))
    page.on("request", lambda request: w.requests.append(request.url))
    try:
        yield w
        assert w.dialogs == [], "the page opened a dialog"
        assert all(u.startswith(gw.url + "/") for u in w.requests), w.requests
    finally:
        context.close()


@pytest.fixture
def sandbox_id(gw: RunningGateway) -> Iterator[str]:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"})
        assert r.status_code == 201, r.text
        sid = str(r.json()["id"])
        yield sid
        op.delete(f"/v1/sandboxes/{sid}")


def session_token(gw: RunningGateway, sandbox: str) -> str:
    with gw.operator() as op:
        r = op.post("/v1/tokens", json={"sandbox": sandbox})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


class Waiting:
    """A command run in a background thread: it blocks until an operator decides."""

    def __init__(self, gw: RunningGateway, sandbox: str, command: str) -> None:
        self.gw, self.sandbox = gw, sandbox
        self.token = session_token(gw, sandbox)
        self.response: httpx2.Response | None = None
        self.thread = threading.Thread(target=self._run, args=(command,), daemon=True)
        self.thread.start()

    def _run(self, command: str) -> None:
        with self.gw.client(self.token) as c:
            self.response = c.post(
                f"/v1/sandboxes/{self.sandbox}/commands", json={"command": command}
            )

    def result(self) -> httpx2.Response:
        self.thread.join(WAIT_MS / 1000)
        assert self.response is not None, "the command did not return after the decision"
        return self.response

    def release(self) -> None:
        """Deny whatever is still pending for the sandbox, so no thread outlives a test."""
        if not self.thread.is_alive():
            return
        with self.gw.operator() as op:
            for a in op.get("/v1/approvals", params={"status": "pending"}).json():
                if a["sandbox"] == self.sandbox:
                    op.post(f"/v1/approvals/{a['id']}/deny")
        self.thread.join(WAIT_MS / 1000)


def snap(page: Page, artifacts: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = artifacts / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    with capsys.disabled():
        print(f"\n[console screenshot] {path}")


def log_in(page: Page, gw: RunningGateway, token: str) -> None:
    page.goto(gw.url + "/")
    page.get_by_label("Operator token").fill(token)
    page.get_by_role("button", name="Log in").click()


def logged_in(page: Page, gw: RunningGateway) -> None:
    log_in(page, gw, gw.operator_token)
    expect(page.get_by_role("heading", name="Sandboxes")).to_be_visible()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()


def sandbox_row(page: Page, sandbox: str) -> Any:
    return page.locator("#sandboxes-rows tr").filter(has_text=sandbox)


def test_console_is_served_with_a_strict_csp(gw: RunningGateway) -> None:
    with gw.client() as c:  # no token: the console holds no data
        page = c.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        for name in ("/", "/console/console.js", "/console/console.css"):
            r = c.get(name)
            assert r.status_code == 200, name
            csp = [d.strip() for d in r.headers["content-security-policy"].split(";")]
            assert all(d in csp for d in REQUIRED_CSP), (name, csp)
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["referrer-policy"] == "no-referrer"
        assert c.get("/console/console.js").headers["content-type"].startswith("text/javascript")
        assert c.get("/console/console.css").headers["content-type"].startswith("text/css")
        assert c.get("/console/../app.py").status_code == 404
        assert c.get("/console/index.py").status_code == 404
        # The page's references stay on this origin and nothing runs inline.
        assert re.search(r"<script(?![^>]*\bsrc=\"/console/)", page.text) is None
        assert re.search(r"<[^>]*\s(on[a-z]+|style)\s*=", page.text) is None
        assert c.get("/v1/sandboxes").status_code == 401  # the data stays behind auth
    with gw.client(headers={"Host": "evil.example"}) as c:
        assert c.get("/").status_code == 421  # the Host guard covers the console too


def test_wrong_tokens_show_a_readable_error(
    watched: Watched,
    gw: RunningGateway,
    sandbox_id: str,
    artifacts: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = watched.page
    log_in(page, gw, "not-the-operator-token")
    alert = page.get_by_role("alert")
    expect(alert).to_contain_text("rejected that token")
    expect(page.locator("#console")).to_be_hidden()
    expect(page.get_by_label("Operator token")).to_have_value("")
    snap(page, artifacts, "wrong-token", capsys)

    page.get_by_label("Operator token").fill(session_token(gw, sandbox_id))
    page.get_by_role("button", name="Log in").click()
    expect(alert).to_contain_text("not the operator token")
    expect(page.locator("#console")).to_be_hidden()
    # The refusals are the only errors: each is a 401 / 403 answer Chromium logs.
    assert all("401" in e or "403" in e for e in watched.errors), watched.errors


def test_operator_approves_a_command_and_manages_a_sandbox(
    watched: Watched,
    gw: RunningGateway,
    sandbox_id: str,
    artifacts: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = watched.page
    logged_in(page, gw)

    # The token is in no storage, cookie, URL or markup.
    kept = page.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]")
    assert kept == [0, 0, ""]
    assert page.context.cookies() == []
    assert gw.operator_token not in page.url
    assert gw.operator_token not in page.content()
    assert not any(gw.operator_token in u for u in watched.requests)

    # Landmarks, row/column headers, a live region that says what happened.
    for role in ("banner", "navigation", "main"):
        expect(page.get_by_role(role)).to_be_visible()
    assert page.evaluate("() => document.querySelectorAll('th:not([scope])').length") == 0
    expect(page.locator("#announce")).to_have_text("Logged in.")

    row = sandbox_row(page, sandbox_id)
    expect(row).to_be_visible()
    expect(row).to_contain_text("running")
    expect(row).to_contain_text("256 MiB")
    expect(row).to_contain_text(re.compile(r"\d.* memory, \d+\.\d s CPU"))  # resource use
    # today's usage in this home (other tests' gateways may have spent some), or none
    expect(page.locator(
        "#usage-body table, #usage-status:has-text('No model usage today')").first
    ).to_be_visible()  # fmt: skip
    expect(page.locator("#usage-status")).not_to_contain_text("Could not")
    expect(page.locator("#providers-status")).to_contain_text("No model providers configured")
    audit_rows = page.locator("#audit-rows tr")
    expect(audit_rows.first).to_be_visible()
    newest = int(audit_rows.first.locator("th").inner_text())
    snap(page, artifacts, "logged-in", capsys)

    waiting = Waiting(gw, sandbox_id, "mkdir -p /tmp/x && rm -rf /tmp/x")
    try:
        approval = page.locator("#approvals-rows tr").filter(has_text="rm -rf /tmp/x")
        expect(approval).to_be_visible()
        expect(approval).to_contain_text(sandbox_id)
        expect(page.locator("#approvals-status")).to_contain_text("1 request waits")
        approval_id = approval.get_attribute("data-id")
        assert approval_id
        # The tail shows the request as it happens.
        requested = audit_rows.filter(has_text="approval_requested").filter(has_text=approval_id)
        expect(requested).to_be_visible()
        assert int(requested.locator("th").inner_text()) > newest
        snap(page, artifacts, "approval-pending", capsys)

        approval.get_by_role("button", name=re.compile("^Approve")).click()
        r = waiting.result()
        assert r.status_code == 200, r.text
        assert r.json()["exit_code"] == 0
    finally:
        waiting.release()
    expect(approval).to_have_count(0)
    # Two records: the operator's decision and the call's going ahead.
    granted = audit_rows.filter(has_text="approval_granted").filter(has_text=approval_id)
    expect(granted).to_have_count(2)
    snap(page, artifacts, "approved", capsys)

    # Lifecycle actions from the table.
    row.get_by_role("button", name=re.compile("^Pause")).click()
    expect(row.locator("td").first).to_have_text("paused")
    row.get_by_role("button", name=re.compile("^Resume")).click()
    expect(row.locator("td").first).to_have_text("running")

    row.get_by_role("button", name=re.compile("^Destroy")).click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_contain_text(sandbox_id)
    snap(page, artifacts, "confirm-destroy", capsys)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(row).to_contain_text("running")
    row.get_by_role("button", name=re.compile("^Destroy")).click()
    dialog.get_by_role("button", name="Destroy").click()
    expect(row).to_have_count(0)
    with gw.operator() as op:
        assert sandbox_id not in [s["id"] for s in op.get("/v1/sandboxes").json()]

    page.get_by_role("button", name="Log out").click()
    expect(page.get_by_label("Operator token")).to_be_visible()
    expect(page.locator("#console")).to_be_hidden()
    assert page.locator("#audit-rows tr").count() == 0
    assert watched.errors == []


def test_attacker_markup_in_commands_and_audit_is_shown_as_text(
    watched: Watched,
    gw: RunningGateway,
    sandbox_id: str,
    artifacts: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = watched.page
    logged_in(page, gw)
    waiting = Waiting(gw, sandbox_id, f"rm -rf '{XSS}'")
    try:
        approval = page.locator("#approvals-rows tr").filter(has_text=XSS)
        expect(approval).to_be_visible()
        # The audit record of the request carries the command too.
        expect(page.locator("#audit-rows tr").filter(has_text=XSS).first).to_be_visible()
        snap(page, artifacts, "xss-as-text", capsys)
        markup = page.evaluate(
            "() => [document.querySelectorAll('img').length,"
            " document.querySelectorAll('[onerror]').length]"
        )
        assert markup == [0, 0]

        approval.get_by_role("button", name=re.compile("^Deny")).click()
        r = waiting.result()
        assert r.status_code == 403 and r.json()["error"]["code"] == "approval_denied", r.text
    finally:
        waiting.release()
    expect(page.locator("#audit-rows tr").filter(has_text="approval_denied").first).to_be_visible()
    assert watched.dialogs == []
    assert watched.errors == []  # among them: no CSP violation report


def test_usage_and_providers_render_as_text_once_served(
    watched: Watched,
    gw: RunningGateway,
    artifacts: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The provider pool's routes, answered in the browser (the gateway may not serve them
    yet): whatever their shape, lists become tables and every value is text."""
    page = watched.page
    usage = {
        "period": "2025-01-01",
        "projects": [
            {"project": XSS, "tokens": 1200, "cost_usd": 0.42, "budget_usd": 5.0},
            {"project": "default", "tokens": 10, "cost_usd": 0.01, "budget_usd": None},
        ],
    }
    providers = [{"name": "local", "healthy": True, "circuit": "closed", "last_error": XSS}]
    page.route(f"{gw.url}/v1/usage", lambda route: route.fulfill(json=usage))
    page.route(f"{gw.url}/v1/providers", lambda route: route.fulfill(json=providers))
    logged_in(page, gw)
    section = page.locator("#usage")
    expect(section.get_by_role("row").filter(has_text=XSS)).to_contain_text("0.42")
    expect(section.get_by_role("columnheader", name="budget usd")).to_be_visible()
    expect(section).to_contain_text("2025-01-01")
    expect(page.locator("#providers").get_by_role("row").filter(has_text="local")).to_contain_text(
        XSS
    )
    expect(page.locator("#usage-status")).to_have_text("")
    snap(page, artifacts, "usage-and-providers", capsys)
    assert page.evaluate("() => document.querySelectorAll('img, [onerror]').length") == 0
    assert watched.errors == []


def test_operator_approves_a_new_egress_name_always(
    watched: Watched,
    gw: RunningGateway,
    artifacts: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Network mode ask: a sandbox's held connection shows as an approval with four
    choices; "Approve always" lets the held curl through and puts the name on the
    project's allowlist."""
    import concurrent.futures
    import secrets

    from agentbox import Sandbox
    from nettopo import UPSTREAM_A, internet

    name = f"console-{secrets.token_hex(3)}.test"
    project = f"console-{secrets.token_hex(3)}"
    page = watched.page
    logged_in(page, gw)
    with internet(tmp_path) as net, gw.operator() as op:
        network = {"mode": "ask", "hosts": {name: UPSTREAM_A}}
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "64MiB",
                                            "project": project, "network": network})  # fmt: skip
        assert r.status_code == 201, r.text
        sb = Sandbox.connect(r.json()["id"], home=gw.home)
        try:
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                held = pool.submit(sb.commands.run, f"curl -sS --max-time 60 http://{name}/",
                                   timeout=90)  # fmt: skip
                approval = page.locator("#approvals-rows tr").filter(has_text=f"{name}:80")
                expect(approval).to_be_visible()
                expect(approval).to_contain_text(sb.id)
                expect(approval).to_contain_text(f"project {project}")
                for label in ("Approve once", "Approve for this sandbox", "Approve always",
                              "Deny"):  # fmt: skip
                    expect(approval.get_by_role("button", name=re.compile(f"^{label}:"))
                           ).to_be_visible()  # fmt: skip
                assert name not in net.seen()
                snap(page, artifacts, "egress-approval-pending", capsys)
                approval.get_by_role("button", name=re.compile("^Approve always:")).click()
                result = held.result(90)
            assert result.stdout.startswith(f"hello from {name}"), result.stdout + result.stderr
            expect(approval).to_have_count(0)
            listed = op.get("/v1/egress/allowlist", params={"project": project}).json()
            assert [g["host"] for g in listed] == [name]
        finally:
            sb.kill()
            op.delete(f"/v1/egress/allowlist/{project}/{name}")
