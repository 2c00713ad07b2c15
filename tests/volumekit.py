"""A PEP 503 package index that counts what it serves, in the test internet: wheels of
``cachedemo-N`` (each with ``payload`` bytes of incompressible data, so a download costs
something), served on ``pypi.test:8000`` (203.0.113.10, nettopo's namespace, reached by a
/32 route only) with PyPI's own caching headers for files (``max-age=1y, immutable``), so
pip's HTTP cache keeps them. Every request goes to ``requests.log`` (``GET PATH STATUS``):
a wheel that pip took from its cache volume never shows up there."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hostres import wait_for
from nettopo import UPSTREAM_A, internet

HOST = "pypi.test"
PORT = 8000
INDEX = f"http://{HOST}:{PORT}/simple"
NETWORK = {"mode": "allowlist", "allow": [HOST], "ports": [PORT], "hosts": {HOST: UPSTREAM_A}}
CACHE = "/home/user/.cache/pip"

_SERVER = r"""
import sys
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
log = open(sys.argv[2], "a", buffering=1)

class Handler(SimpleHTTPRequestHandler):
    def end_headers(self):
        if self.path.endswith(".whl"):  # what files.pythonhosted.org sends
            self.send_header("Cache-Control", "max-age=365000000, immutable, public")
        super().end_headers()
    def log_request(self, code="-", size="-"):
        log.write("%s %s %s\n" % (self.command, self.path, code))
    def address_string(self):
        return self.client_address[0]

ThreadingHTTPServer(("0.0.0.0", int(sys.argv[3])), partial(Handler, directory=sys.argv[1])).serve_forever()
"""


def wheel(directory: Path, name: str, payload: int) -> str:
    """A pure-Python wheel of ``name`` 1.0 carrying ``payload`` random bytes."""
    filename = f"{name.replace('-', '_')}-1.0-py3-none-any.whl"
    module = name.replace("-", "_")
    info = f"{module}-1.0.dist-info"
    files = {
        f"{module}/__init__.py": "VERSION = '1.0'\n",
        f"{module}/blob.bin": os.urandom(payload),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(directory / filename, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return filename


@dataclass
class Index:
    root: Path
    log: Path
    packages: list[str]

    def requests(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def wheel_downloads(self) -> int:
        """Wheels sent in full (200): what no cache answered."""
        return sum(1 for r in self.requests() if ".whl " in r and r.endswith(" 200"))

    def install(self, venv: str = "/tmp/venv") -> str:
        """The shell command a sandbox runs to install every package of the index."""
        return f"python3 -m venv {venv} && {self.pip_install(venv)}"

    def pip_install(self, venv: str = "/tmp/venv") -> str:
        """The pip command alone, into an existing venv."""
        return (
            f"{venv}/bin/pip install -q --disable-pip-version-check"
            f" --index-url {INDEX} --trusted-host {HOST} {' '.join(self.packages)}"
        )


def _listening() -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((UPSTREAM_A, PORT)) == 0


@contextlib.contextmanager
def counted_index(
    tmp: Path, count: int = 1, payload: int = 64 * 1024, rate: str | None = None
) -> Iterator[Index]:
    """``count`` packages ``cachedemo-0..`` in a fresh test internet while in use;
    ``rate`` (tc's syntax, ``50mbit``): what the index sends at most, like a real uplink."""
    root = tmp / "index"
    packages = [f"cachedemo-{i}" for i in range(count)]
    for name in packages:
        directory = root / "simple" / name
        directory.mkdir(parents=True)
        filename = wheel(directory, name, payload)
        (directory / "index.html").write_text(
            f'<!doctype html><html><body><a href="{filename}">{filename}</a></body></html>'
        )
    log = tmp / "requests.log"
    with internet(tmp) as world:
        if rate is not None:  # the namespace's own link, which only this test uses
            # tbf: netem is not built for these kernels
            subprocess.run(["ip", "netns", "exec", world.netns, "tc", "qdisc", "add", "dev",
                            "eth0", "root", "tbf", "rate", rate, "burst", "64kb",
                            "latency", "400ms"], check=True)  # fmt: skip
        server = subprocess.Popen(
            ["ip", "netns", "exec", world.netns, sys.executable, "-c", _SERVER, str(root),
             str(log), str(PORT)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_for(_listening, 30, f"the package index on {UPSTREAM_A}:{PORT}")
            yield Index(root, log, packages)
        finally:
            server.kill()
            server.wait()
