"""A little internet for network tests, entirely on this machine.

A network namespace created by the test holds the "public" hosts 203.0.113.10 and
198.51.100.10 (documentation addresses), joined to the host by a veth. Only /32 routes
to exactly those two addresses point into it: these hosts reach their package mirrors
through other documentation addresses (203.0.113.80 here), which a /24 would capture.
No default route is added on the host, and everything is removed afterwards. Servers inside: HTTP on 80 and
8080 (answers ``hello from <host>`` plus the request's headers as JSON), and a UDP
listener on 53 that records whatever reaches it (nothing should).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

UPSTREAM_A = "203.0.113.10"
UPSTREAM_B = "198.51.100.10"
HOST_END = "198.51.100.1"  # the host's address on the veth (a /32: no subnet route)
# Two topologies cannot both route these addresses: test runs take turns.
INTERNET_LOCK = Path("/run/lock/agentbox-test-internet.lock")

_SERVERS = r"""
import json, socket, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
log = open(sys.argv[1], "a", buffering=1)

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        size = int(self.path.rsplit("/bytes/", 1)[1]) if "/bytes/" in self.path else 0
        body = (b"x" * size) if size else (
            "hello from %s\n%s" % (self.headers.get("Host"), json.dumps(dict(self.headers)))
        ).encode()
        log.write("http %s %s\n" % (self.server.server_address[1], self.headers.get("Host")))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def address_string(self):
        return self.client_address[0]
    def log_message(self, *a):
        pass

for port in (80, 8080):
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("0.0.0.0", 53))
print("ready", flush=True)
while True:
    data, peer = udp.recvfrom(65535)
    log.write("udp %s %r\n" % (peer[0], data[:40]))
"""


@dataclass
class Internet:
    netns: str
    log: Path

    def seen(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def internet(tmp: Path) -> Iterator[Internet]:
    if shutil.which("ip") is None:
        raise AssertionError("network tests need iproute2's `ip`: apt-get install -y iproute2")
    lock = os.open(INTERNET_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the fd closes
        yield from _internet(tmp)
    finally:
        os.close(lock)


def _internet(tmp: Path) -> Iterator[Internet]:
    tag = secrets.token_hex(3)
    netns, host_if = f"abt-{tag}", f"abt{tag}"
    log = tmp / f"internet-{tag}.log"
    server: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("addr", "add", f"{HOST_END}/32", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for upstream in (UPSTREAM_A, UPSTREAM_B):
            _ip("route", "add", f"{upstream}/32", "dev", host_if, "src", HOST_END)
            _ip("-n", netns, "addr", "add", f"{upstream}/32", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "route", "add", f"{HOST_END}/32", "dev", "eth0")
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", _SERVERS, str(log)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        for _ in range(100):  # the host's neighbour entry and route are usable at once
            if (
                subprocess.run(["ip", "route", "get", UPSTREAM_A], capture_output=True).returncode
                == 0
            ):
                break
            time.sleep(0.01)
        yield Internet(netns, log)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
