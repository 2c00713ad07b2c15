"""The browser tool: what running Chromium inside a sandbox costs.

    .venv/bin/python bench/bench_browser.py [--quick] [--write]   (as root)

Measured in the same run, against the same page of a web site in a network namespace
this script creates (tests/nettopo.py + tests/browserkit.py: no packet leaves the host):

* **tool path**: ``browser_open`` through ``Gateway.call_tool`` (in process: policy,
  redaction and audit included) with no browser running yet: Playwright's driver, the
  launcher, ``agentbox-nsexec enter``, Chromium inside the sandbox, a context, a page,
  the page loaded through the sandbox's egress proxy and its text;
* **host baseline**: Playwright launching the same Chromium binary directly on the host
  with the same flags (names resolved by ``--host-resolver-rules`` only: nothing else
  resolves), a context, a page, the same page loaded directly and its text.

Then a navigation of an already open page, both ways. Writes nothing to docs unless
``--write`` (the ``<!-- browser:begin -->`` section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from agentbox import Sandbox  # noqa: E402
from agentbox.browser.launch import chromium_args  # noqa: E402
from agentbox.browser.manager import CHROMIUM  # noqa: E402
from agentbox.config.settings import GatewaySettings  # noqa: E402
from agentbox.gateway.app import create_app  # noqa: E402
from browserkit import SITE_PORT, require_browser, site  # noqa: E402
from common import bench_home, percentile, progress, write_doc_section  # noqa: E402
from nettopo import UPSTREAM_A, internet  # noqa: E402

URL = f"http://allowed.test:{SITE_PORT}/"
SECOND = f"http://allowed.test:{SITE_PORT}/second"
NETWORK = {
    "mode": "allowlist",
    "allow": ["allowed.test"],
    "ports": [SITE_PORT],
    "hosts": {"allowed.test": UPSTREAM_A},
}


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def tool_path(home: Path, n: int) -> tuple[list[float], list[float]]:
    settings = GatewaySettings.model_validate({"audit": {"path": str(home / "audit.jsonl")}})
    operator = secrets.token_hex(24)
    app = create_app(settings, operator_token=operator, home=home)
    gateway = app.state.parts.gateway
    principal = gateway.tokens.authenticate(operator)
    sb = Sandbox.create(memory="1GiB", disk="512MiB", network=NETWORK, home=home)

    def call(tool: str, **arguments: Any) -> dict[str, Any]:
        args = {**arguments, "sandbox_id": sb.id}
        return dict(asyncio.run(gateway.call_tool(principal, tool, args)).result)

    first, nav = [], []
    try:
        call("browser_close", handle=call("browser_open", url=URL)["handle"])  # warm-up
        for i in range(n):
            progress(f"tool path {i + 1}/{n}")
            start = time.perf_counter()
            handle = call("browser_open", url=URL)["handle"]
            first.append(ms_since(start))
            start = time.perf_counter()
            call("browser_open", url=SECOND, handle=handle)
            nav.append(ms_since(start))
            call("browser_close", handle=handle)  # the last page: the browser stops too
    finally:
        gateway.browsers.close_all()
        app.state.parts.audit.close()
        sb.kill()
    return first, nav


def _load(page: Any, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_load_state("load")
    page.evaluate("() => document.body.innerText")
    page.title()


def host_baseline(n: int) -> tuple[list[float], list[float]]:
    from playwright.sync_api import sync_playwright

    rules = (
        f"--host-resolver-rules=MAP allowed.test {UPSTREAM_A}, MAP * ~NOTFOUND"  # first match wins
    )
    args = [a for a in chromium_args([], "/tmp/unused", None) if not a.startswith("--user-data")]
    first, nav = [], []
    for i in range(-1, n):  # -1: warm-up
        progress(f"host baseline {i + 1}/{n}")
        start = time.perf_counter()
        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[*args, rules])
        page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
        _load(page, URL)
        elapsed = ms_since(start)
        start = time.perf_counter()
        _load(page, SECOND)
        navigation = ms_since(start)
        browser.close()
        pw.stop()
        if i >= 0:
            first.append(elapsed)
            nav.append(navigation)
    return first, nav


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    require_browser()
    n = 5 if args.quick else 15
    with (
        tempfile.TemporaryDirectory() as tmp,
        internet(Path(tmp)) as world,
        site(world.netns, Path(tmp)),
        bench_home("browser") as home,
    ):
        sandbox_first, sandbox_nav = tool_path(home, n)
        host_first, host_nav = host_baseline(n)
    rows = [
        "| measure | in the sandbox (tool path) | host (Playwright direct) | ratio p50 |",
        "|---|---|---|---|",
        f"| launch + first page, p50 / p95 ms | {percentile(sandbox_first, 50):.0f} / "
        f"{percentile(sandbox_first, 95):.0f} | {percentile(host_first, 50):.0f} / "
        f"{percentile(host_first, 95):.0f} | "
        f"{statistics.median(sandbox_first) / statistics.median(host_first):.2f}x |",
        f"| next page in an open browser, p50 / p95 ms | {percentile(sandbox_nav, 50):.1f} / "
        f"{percentile(sandbox_nav, 95):.1f} | {percentile(host_nav, 50):.1f} / {percentile(host_nav, 95):.1f} | "
        f"{statistics.median(sandbox_nav) / statistics.median(host_nav):.2f}x |",
    ]
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "browser", "Browser: Chromium inside the sandbox", "bench_browser.py",
            "--quick" if args.quick else "",
            f"{n} runs each way, same Chromium binary, same page (Python's http.server in a "
            "network namespace made by the run). Tool path: `BrowserManager.open` through "
            "`Gateway.call_tool` on a fresh browser (Playwright driver, launcher, "
            "`agentbox-nsexec enter`, Chromium in the sandbox, page through the egress proxy) "
            "up to the page's text; host: Playwright launching Chromium directly, page loaded "
            "directly, its text read. The navigation row reuses an open page.",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
