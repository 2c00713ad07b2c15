"""The browser tool: what running Chromium inside a sandbox costs.

    .venv/bin/python bench/bench_browser.py [--quick] [--write]   (as root)

Measured in the same run, against the same page of a web site in a network namespace
this script creates (tests/nettopo.py + tests/browserkit.py: no packet leaves the host):

* **tool path**: ``browser_open`` through ``Gateway.call_tool`` (in process: policy,
  redaction and audit included) with no browser running yet: Playwright's driver, the
  launcher, ``agentbox-nsexec enter``, Chromium inside the sandbox, a context, a page,
  the page loaded through the sandbox's egress proxy and its text, on each isolation
  tier (gvisor: ``runsc exec`` with the DevTools pipe on its stdio);
* **host baseline**: Playwright launching the same Chromium binary directly on the host
  with the same flags (names resolved by ``--host-resolver-rules`` only: nothing else
  resolves), a context, a page, the same page loaded directly and its text.

Then a navigation of an already open page, each way. Writes nothing to docs unless
``--write`` (the ``<!-- browser:begin -->`` section of docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import asyncio
import os
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
from agentbox.browser.manager import CHROMIUM, GVISOR_MIN_PIDS  # noqa: E402
from agentbox.config.settings import GatewaySettings  # noqa: E402
from agentbox.gateway.app import create_app  # noqa: E402
from browserkit import SITE_PORT, require_browser, site  # noqa: E402
from common import bench_home, percentile, progress, write_doc_section  # noqa: E402
from nettopo import UPSTREAM_A, internet  # noqa: E402

URL = f"http://allowed.test:{SITE_PORT}/"
SECOND = f"http://allowed.test:{SITE_PORT}/second"
TIERS = ("namespaces", "gvisor", "host")
NETWORK = {
    "mode": "allowlist",
    "allow": ["allowed.test"],
    "ports": [SITE_PORT],
    "hosts": {"allowed.test": UPSTREAM_A},
}


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


class ToolPath:
    """``browser_open`` through ``Gateway.call_tool``, one sandbox per isolation tier."""

    def __init__(self, home: Path) -> None:
        settings = GatewaySettings.model_validate({"audit": {"path": str(home / "audit.jsonl")}})
        operator = secrets.token_hex(24)
        self.app = create_app(settings, operator_token=operator, home=home)
        self.gateway = self.app.state.parts.gateway
        self.principal = self.gateway.tokens.authenticate(operator)
        self.boxes = {
            "namespaces": Sandbox.create(memory="1GiB", disk="512MiB", network=NETWORK, home=home),
            "gvisor": Sandbox.create(memory="1GiB", disk="512MiB", network=NETWORK, home=home,
                                     isolation="gvisor", pids=GVISOR_MIN_PIDS),
        }  # fmt: skip

    def call(self, tier: str, tool: str, **arguments: Any) -> dict[str, Any]:
        args = {**arguments, "sandbox_id": self.boxes[tier].id}
        return dict(asyncio.run(self.gateway.call_tool(self.principal, tool, args)).result)

    def round(self, tier: str) -> tuple[float, float]:
        """A fresh browser: launch + first page, then a navigation; the last page's
        close stops the browser too."""
        start = time.perf_counter()
        handle = self.call(tier, "browser_open", url=URL)["handle"]
        first = ms_since(start)
        start = time.perf_counter()
        self.call(tier, "browser_open", url=SECOND, handle=handle)
        nav = ms_since(start)
        self.call(tier, "browser_close", handle=handle)
        return first, nav

    def close(self) -> None:
        self.gateway.browsers.close_all()
        self.app.state.parts.audit.close()
        for sb in self.boxes.values():
            sb.kill()


def _load(page: Any, url: str) -> None:
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_load_state("load")
    page.evaluate("() => document.body.innerText")
    page.title()


def host_round() -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    rules = (
        f"--host-resolver-rules=MAP allowed.test {UPSTREAM_A}, MAP * ~NOTFOUND"  # first match wins
    )
    args = [a for a in chromium_args([], "/tmp/unused", None) if not a.startswith("--user-data")]
    start = time.perf_counter()
    pw = sync_playwright().start()
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=[*args, rules])
    page = browser.new_context(viewport={"width": 1280, "height": 800}).new_page()
    _load(page, URL)
    first = ms_since(start)
    start = time.perf_counter()
    _load(page, SECOND)
    nav = ms_since(start)
    browser.close()
    pw.stop()
    return first, nav


def interleaved(home: Path, n: int) -> dict[str, tuple[list[float], list[float]]]:
    """Each round: the namespaces tier, the gvisor tier, the host; a warm-up round first."""
    tools = ToolPath(home)
    out: dict[str, tuple[list[float], list[float]]] = {t: ([], []) for t in TIERS}
    try:
        for i in range(-1, n):
            for tier in TIERS:
                progress(f"{tier} {i + 1}/{n}")
                first, nav = host_round() if tier == "host" else tools.round(tier)
                if i >= 0:
                    out[tier][0].append(first)
                    out[tier][1].append(nav)
    finally:
        tools.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    require_browser()
    n = 5 if args.quick else 10
    with (
        tempfile.TemporaryDirectory() as tmp,
        internet(Path(tmp)) as world,
        site(world.netns, Path(tmp)),
        bench_home("browser") as home,
    ):
        load_before = os.getloadavg()[0]
        runs = interleaved(home, n)
        load_after = os.getloadavg()[0]

    def cell(values: list[float]) -> str:
        return f"{percentile(values, 50):.0f} / {percentile(values, 95):.0f}"

    def ratio(tier: str, k: int) -> str:
        return f"{statistics.median(runs[tier][k]) / statistics.median(runs['host'][k]):.2f}x"

    rows = [
        "| measure | namespaces tier (tool path) | gvisor tier (tool path) | host (Playwright "
        "direct) | namespaces / host p50 | gvisor / host p50 |",
        "|---|---|---|---|---|---|",
    ]
    for k, what in enumerate(("launch + first page", "next page in an open browser")):
        rows.append(
            f"| {what}, p50 / p95 ms | {cell(runs['namespaces'][k])} | {cell(runs['gvisor'][k])} "
            f"| {cell(runs['host'][k])} | {ratio('namespaces', k)} | {ratio('gvisor', k)} |"
        )
    table = "\n".join(rows)
    print(table)
    if args.write:
        write_doc_section(
            "browser", "Browser: Chromium inside the sandbox", "bench_browser.py",
            "--quick" if args.quick else "",
            f"{n} rounds, each one namespaces tier, gvisor tier, host in turn (after a "
            "warm-up round), same Chromium binary, same page (Python's http.server in a "
            "network namespace made by the run). Tool path: `BrowserManager.open` through "
            "`Gateway.call_tool` on a fresh browser (Playwright driver, launcher, "
            "`agentbox-nsexec enter` or `runsc exec`, Chromium in the sandbox, page through "
            "the egress proxy) up to the page's text; host: Playwright launching Chromium "
            "directly, page loaded directly, its text read. The navigation row reuses an "
            "open page. The host (2 cores) is shared by several engineers' work: numbers are "
            f"noisy (1-minute load average {load_before:.1f} at the start, {load_after:.1f} "
            "at the end).",
            table,
        )  # fmt: skip


if __name__ == "__main__":
    main()
