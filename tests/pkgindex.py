"""A package site in the test internet: the project page of ``demo`` (``Latest version:
1.2.0``) and a PEP 503 index holding pure-Python wheels of demo 1.0.0 and 1.2.0, served
on ``pkg.test:8000`` (203.0.113.10, nettopo's namespace: reached through a /32 route
only). A sandbox reaches it through its egress proxy when its allowlist names the host."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

from hostres import wait_for
from nettopo import UPSTREAM_A, internet

HOST = "pkg.test"
PORT = 8000
INDEX = f"http://{HOST}:{PORT}"
LATEST = "1.2.0"
# The sandbox side: the network section that lets a sandbox reach the site.
NETWORK_YAML = f"""  network:
    mode: allowlist
    allow: [{HOST}]
    ports: [{PORT}]
    hosts: {{{HOST}: {UPSTREAM_A}}}
"""


def wheel(directory: Path, version: str) -> str:
    """A pure-Python wheel of the package ``demo`` (what pip installs)."""
    name = f"demo-{version}-py3-none-any.whl"
    info = f"demo-{version}.dist-info"
    files = {
        "demo/__init__.py": f'__version__ = "{version}"\n',
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: demo\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return name


def _listening() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((UPSTREAM_A, PORT)) == 0


@contextlib.contextmanager
def package_site(tmp: Path) -> Iterator[Path]:
    """The site's files under ``tmp``, served in a fresh test internet while in use."""
    root = tmp / "site"
    (root / "project" / "demo").mkdir(parents=True)
    (root / "project" / "demo" / "index.html").write_text(
        "<!doctype html><html><head><title>demo</title></head><body><main>"
        f"<h1>demo</h1><p>Latest version: {LATEST}</p><p>Released 2026-11-01.</p>"
        "</main></body></html>"
    )
    simple = root / "simple" / "demo"
    simple.mkdir(parents=True)
    links = "".join(f'<a href="{w}">{w}</a>\n' for w in (wheel(simple, "1.0.0"),
                                                         wheel(simple, LATEST)))  # fmt: skip
    (simple / "index.html").write_text(f"<!doctype html><html><body>\n{links}</body></html>")
    with internet(tmp) as world:
        server = subprocess.Popen(
            ["ip", "netns", "exec", world.netns, sys.executable, "-m", "http.server",
             str(PORT), "--bind", "0.0.0.0", "--directory", str(root)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(_listening, 30, f"the package site on {UPSTREAM_A}:{PORT}")
            yield root
        finally:
            server.kill()
            server.wait()


# The project an agent upgrades: a manifest pinning the old version, and a test that
# passes only with the latest installed.
REQUIREMENTS = "demo==1.0.0\n"
PROJECT_TEST = f"""import unittest
import demo

class DemoTest(unittest.TestCase):
    def test_latest(self):
        self.assertEqual(demo.__version__, "{LATEST}")
"""
VENV = "/workspace/.venv"
# Two calls: a program path is resolved in the sandbox when the command is checked, and
# before the first call the venv's python does not exist yet.
MAKE_VENV = f"python3 -m venv {VENV}"
INSTALL = (
    f"{VENV}/bin/python3 -m pip install -q"
    f" --disable-pip-version-check --index-url {INDEX}/simple --trusted-host {HOST}"
    " -r /workspace/requirements.txt"
)
# Discovery from tests/ (no __init__.py needed), so the test is found and run.
INSTALL_TIMEOUT_MS = 120000  # a venv and a pip install, on a shared 2-core machine
RUN_TESTS = f"cd /workspace && {VENV}/bin/python3 -m unittest discover -s tests -v"
