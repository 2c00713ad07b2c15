"""Helpers of the browser tests: what must be installed, a web site in the test internet,
and the host's view of a sandbox's browser processes.

The site runs inside nettopo's namespace on port 8081 of both upstream addresses (so it
never collides with nettopo's own servers on 80 and 8080) and logs every request it gets
(``Host`` and path): a request that is absent from the log never reached it.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentbox.browser.manager import CHROMIUM
from hostres import CGROUP_ROOT, cmdline

SITE_PORT = 8081

_SITE = r"""
import html, sys, threading, urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
log = open(sys.argv[1], "a", buffering=1)
lock = threading.Lock()
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000b49444154789c6360000200000500017a5eab3f0000000049454e44ae426082")
PAGES = {
    "/": (
        "<title>Welcome</title><main><h1>Welcome to the test site</h1>"
        "<p>The sandbox browser rendered this paragraph.</p>"
        "<nav aria-label='Site'><a href='/second'>Next page</a></nav>"
        "<form action='/search' role='search'><input name='q' aria-label='Query'></form></main>"
    ),
    "/second": "<title>Second page</title><h1>You clicked through</h1>",
    "/mixed": (
        "<title>Mixed</title><p>mixed content</p>"
        "<img src='http://allowed.test:8081/ok.png' alt='ok'>"
        "<img src='http://other.test:8081/pixel.png' alt='other'>"
        "<script src='http://www.blocked.test:8081/evil.js'></script>"
    ),
}

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def reply(self, status, body, ctype="text/html; charset=utf-8", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers:
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        with lock:
            log.write("GET %s %s\n" % (self.headers.get("Host"), self.path))
        path, _, query = self.path.partition("?")
        if path.startswith("/redirect-to/"):
            target = "http://" + path[len("/redirect-to/"):]
            self.reply(302, b"", headers=[("Location", target)])
        elif path == "/search":
            q = urllib.parse.parse_qs(query).get("q", [""])[0]
            body = "<title>Results</title><p>Results for %s</p>" % html.escape(q)
            self.reply(200, body.encode())
        elif path.endswith(".png"):
            self.reply(200, PNG, "image/png")
        elif path in PAGES:
            self.reply(200, PAGES[path].encode())
        else:
            self.reply(404, b"<title>Not found</title>not found")

server = ThreadingHTTPServer(("0.0.0.0", int(sys.argv[2])), Handler)
print("ready", flush=True)
server.serve_forever()
"""


def require_browser() -> None:
    """Fail (never skip) with what to install when the browser stack is missing."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        pytest.fail(
            "the browser tests need Playwright's Python package: pip install -e . (pins "
            "playwright); never `playwright install`, Debian's chromium is used"
        )
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"the browser tests need Debian's chromium at {CHROMIUM}: "
            "apt-get install -y chromium fonts-dejavu-core (scripts/install.sh does)"
        )


@dataclass
class Site:
    log: Path

    def requests(self) -> list[str]:
        """``GET host path`` lines, in arrival order."""
        return self.log.read_text().splitlines() if self.log.exists() else []


@contextlib.contextmanager
def site(netns: str, tmp: Path) -> Iterator[Site]:
    log = tmp / "site.log"
    proc = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", _SITE, str(log), str(SITE_PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield Site(log)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def leaf_pids(sandbox_id: str, leaf: str) -> list[int]:
    """Processes in the browser's cgroup leaf (v2 hierarchy, read on the host)."""
    base = CGROUP_ROOT / "unified" if (CGROUP_ROOT / "unified").is_dir() else CGROUP_ROOT
    path = base / "agentbox" / sandbox_id / leaf / "cgroup.procs"
    try:
        return [int(p) for p in path.read_text().split()]
    except FileNotFoundError:
        return []


def chromium_pids(uid: int) -> list[int]:
    """Host pids of Chromium processes owned by ``uid`` (a sandbox's host uid)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
        except OSError:
            continue
        if cmdline(entry).startswith(CHROMIUM):
            out.append(int(entry))
    return out
