"""The egress proxy against a little internet that lives in a network namespace.

The namespace (created here, removed afterwards) holds the "public" hosts 203.0.113.10
and 198.51.100.10 (documentation addresses) on one end of a veth pair whose host end
has 198.51.100.1/32, with /32 routes to exactly the two upstream addresses (no subnet
route, no default route anywhere). HTTP and HTTPS servers run inside it and log every connection
they accept, so a test can prove that a denied request never reached them. The proxy
runs in this process, on 127.0.0.1, on a uvloop loop in a thread (as the daemon does).

No name is ever looked up for real: every name that gets as far as resolution is in the
policy's static host map, and the system resolver is replaced by a recorder that fails
the test if it is ever called unexpectedly.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import hashlib
import os
import queue
import random
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvloop

from agentbox.network.proxy import EgressDecision, EgressPolicy, EgressProxy
from nettopo import HOST_END, INTERNET_LOCK
from testpki import Pki, make_pki

A = "203.0.113.10"  # allowed.test
B = "198.51.100.10"  # other.test
BIG_SIZE = 50 * 1024 * 1024
BIG_SEED = 20240601
NAMES = ["allowed.test", "other.test", "www.wild.test", "xn--bcher-kva.wild.test"]
IO_TIMEOUT = 10.0

# Runs inside the namespace: HTTP on :80 and :8080, HTTPS on :443, on both addresses.
_SERVERS = r"""
import hashlib, http.server, random, socketserver, ssl, sys, threading
log_path, cert, key, big_size, big_seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
BIG = random.Random(big_seed).randbytes(big_size)
lock = threading.Lock()
def log(line):
    with lock, open(log_path, "a") as f:
        f.write(line + "\n")

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def reply(self, body, ctype="text/plain"):
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def note(self, extra=""):
        names = ",".join(sorted(k.lower() for k in self.headers.keys()))
        log("request %s %s %s host=%s headers=%s%s" % (
            self.server.label, self.command, self.path, self.headers.get("Host"), names, extra))
    def do_GET(self):
        self.note()
        if self.path == "/big":
            self.reply(BIG, "application/octet-stream")
        else:
            self.reply(("hello from %s path=%s host=%s\n" % (
                self.server.label, self.path, self.headers.get("Host"))).encode())
    def do_POST(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    break
                body += self.rfile.read(size)
                self.rfile.readline()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.note(" body=%d" % len(body))
        self.reply(b"echo:" + body)

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    def __init__(self, addr, label):
        self.label = label
        super().__init__(addr, Handler)
    def server_bind(self):
        # Not HTTPServer.server_bind: it does a reverse DNS lookup of the address.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]
    def get_request(self):
        sock, peer = super().get_request()
        log("accept %s %s" % (self.label, peer[0]))
        return sock, peer

class TLSServer(Server):
    def __init__(self, addr, label):
        super().__init__(addr, label)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.ctx.sni_callback = lambda obj, name, ctx: log("sni %s %s" % (self.label, name))
    def finish_request(self, request, client_address):
        request.settimeout(10)
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except OSError as e:
            log("tls-fail %s %s" % (self.label, type(e).__name__))
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()

class Sink(socketserver.BaseRequestHandler):
    # Answers only after the client's EOF: proves a half-close crossed the proxy.
    def handle(self):
        digest, size = hashlib.sha256(), 0
        while data := self.request.recv(1 << 16):
            digest.update(data)
            size += len(data)
        log("sink %d" % size)
        self.request.sendall(("%d %s\n" % (size, digest.hexdigest())).encode())

class SinkServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

threading.Thread(target=SinkServer((sys.argv[6], 9), Sink).serve_forever, daemon=True).start()
for ip, name in ((sys.argv[6], "a"), (sys.argv[7], "b")):
    for port, cls in ((80, Server), (8080, Server), (443, TLSServer)):
        server = cls((ip, port), "%s-%d" % (name, port))
        threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


# -- the little internet ------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A test CA and a server certificate for every test name."""
    return make_pki(tmp_path_factory.mktemp("pki"), "agentbox egress test CA", list(NAMES))


@dataclass
class Internet:
    netns: str
    log: Path

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise AssertionError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def _exclusive(path: Path, timeout: float = 120.0) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run has held {path} for {timeout:g} s")
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def internet(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Internet]:
    if shutil.which("ip") is None:
        pytest.fail("the egress proxy tests need iproute2's `ip` (apt-get install -y iproute2)")
    with _exclusive(INTERNET_LOCK):
        yield from _internet(tmp_path_factory, pki)


def _internet(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Internet]:
    tag = secrets.token_hex(3)
    netns, host_if, ns_if = f"agentbox-t-{tag}", f"abe{tag}h", f"abe{tag}n"
    log = tmp_path_factory.mktemp("internet") / "servers.log"
    server: subprocess.Popen[str] | None = None
    try:
        _ip("netns", "add", netns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", netns)
        # /32 routes only: these hosts reach their package mirrors through another
        # address of 203.0.113.0/24, which a /24 here would capture.
        _ip("addr", "add", f"{HOST_END}/32", "dev", host_if)
        _ip("link", "set", host_if, "up")
        for upstream in (A, B):
            _ip("route", "add", f"{upstream}/32", "dev", host_if, "src", HOST_END)
            _ip("-n", netns, "addr", "add", f"{upstream}/32", "dev", ns_if)
        _ip("-n", netns, "link", "set", ns_if, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        _ip("-n", netns, "route", "add", f"{HOST_END}/32", "dev", ns_if)
        # Before any packet: both "public" hosts must be reached through our veth, never
        # through the host's uplink (another test owning these prefixes would show here).
        for address in (A, B):
            route = _ip("route", "get", address)
            assert f"dev {host_if} " in route, f"{address} is not routed via {host_if}: {route}"
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-c", _SERVERS, str(log),
             str(pki.cert), str(pki.key), str(BIG_SIZE), str(BIG_SEED), A, B],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert server.stdout is not None
        ready = concurrent.futures.ThreadPoolExecutor(1)
        try:
            line = ready.submit(server.stdout.readline).result(timeout=30)
        finally:
            ready.shutdown(wait=False)
        assert line.strip() == "ready", f"the servers in {netns} did not start"
        yield Internet(netns, log)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            for stream in (server.stdin, server.stdout):
                if stream is not None:
                    stream.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        assert (
            netns
            not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        )


# -- the proxy under test -----------------------------------------------------------


@dataclass
class Harness:
    """The proxy on a uvloop loop in a thread, and what it did."""

    loop: asyncio.AbstractEventLoop
    proxy: EgressProxy
    explicit: int = 0
    transparent: int = 0
    trap_port: int = 0  # a loopback listener that must never be connected to
    decisions: queue.Queue[EgressDecision] = field(default_factory=queue.Queue)
    connects: list[tuple[str, int]] = field(default_factory=list)
    lookups: list[str] = field(default_factory=list)
    dns: dict[str, list[str]] = field(default_factory=dict)
    original_dst: tuple[str, int] = ("0.0.0.0", 0)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def stop(self, server: asyncio.Server) -> None:
        """Close ``server`` on its own loop (asyncio objects are not thread-safe)."""

        async def stop() -> None:
            server.close()
            await server.wait_closed()

        self.run(stop())

    def reset(self) -> None:
        while not self.decisions.empty():
            self.decisions.get_nowait()
        self.connects.clear()
        self.lookups.clear()

    def decision(self) -> EgressDecision:
        """The next decision, and proof that it was the only one for this connection."""
        decision = self.decisions.get(timeout=IO_TIMEOUT)
        time.sleep(0.05)
        assert self.decisions.empty(), "more than one decision for one connection"
        return decision


def _policy(sandbox_id: str, trap_port: int) -> EgressPolicy:
    return EgressPolicy(
        sandbox_id=sandbox_id,
        mode="allowlist",
        allow=("allowed.test", "*.wild.test", "rebind.test", "meta.test", "private.test"),
        ports=(80, 443, 9, trap_port),
        hosts={
            "allowed.test": A,
            "other.test": B,
            "rebind.test": "127.0.0.1",
            "meta.test": "169.254.169.254",
            "private.test": "10.1.2.3",
            "www.wild.test": A,
            "bücher.wild.test": A,
        },
    )


@pytest.fixture(scope="module")
def trap() -> Iterator[socket.socket]:
    """A loopback listener where rebind.test points: nothing may ever connect to it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock


def _assert_untouched(trap: socket.socket) -> None:
    with pytest.raises(BlockingIOError):
        conn, _ = trap.accept()
        conn.close()


@pytest.fixture(scope="module", params=["uvloop-splice", "asyncio-streams"])
def harness(
    request: pytest.FixtureRequest, internet: Internet, trap: socket.socket
) -> Iterator[Harness]:
    """The daemon's setup (uvloop, zero-copy relays), then the plain asyncio loop with
    relays copied through the streams: both engines must behave the same."""
    loop = uvloop.new_event_loop() if request.param == "uvloop-splice" else asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="egress-proxy", daemon=True)
    thread.start()
    trap_port = trap.getsockname()[1]
    policy = _policy("sb-test", trap_port)
    holder: list[Harness] = []

    def policy_for(peer: str) -> EgressPolicy | None:
        return policy if peer == "127.0.0.1" else None

    def on_decision(decision: EgressDecision) -> None:
        holder[0].decisions.put(decision)

    proxy = EgressProxy(
        policy_for,
        on_decision,
        extra_denied=["192.0.2.0/24"],
        connect_timeout=3.0,
        original_dst=lambda sock: holder[0].original_dst,
        head_timeout=3.0,
        zero_copy=request.param.endswith("splice"),
    )
    h = Harness(loop, proxy, trap_port=trap_port)
    holder.append(h)
    real_connect = proxy._connect

    async def spy_connect(address: Any, port: int) -> Any:
        h.connects.append((str(address), port))
        return await real_connect(address, port)

    async def fake_getaddrinfo(name: str, port: int) -> list[Any]:
        h.lookups.append(name)
        if name not in h.dns:
            raise socket.gaierror(socket.EAI_NONAME, "not in the test's fake DNS")
        return [
            (socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in h.dns[name]
        ]

    proxy._connect = spy_connect  # type: ignore[method-assign]
    proxy._getaddrinfo = fake_getaddrinfo  # type: ignore[method-assign]

    async def start() -> list[asyncio.Server]:
        return [
            await proxy.serve_explicit("127.0.0.1", 0),
            await proxy.serve_transparent("127.0.0.1", 0),
        ]

    servers = h.run(start())
    h.explicit = servers[0].sockets[0].getsockname()[1]
    h.transparent = servers[1].sockets[0].getsockname()[1]
    try:
        yield h
    finally:

        async def stop() -> None:
            for server in servers:
                server.close()
                await server.wait_closed()
            await proxy.aclose()

        h.run(stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture
def h(harness: Harness, trap: socket.socket) -> Iterator[Harness]:
    harness.reset()
    yield harness
    _assert_untouched(trap)
    assert not harness.lookups, f"the system resolver was asked for {harness.lookups}"


# -- client helpers -----------------------------------------------------------------


def _short_id(value: object) -> str | None:
    """Readable test ids for long byte strings."""
    if isinstance(value, bytes):
        shown = repr(value)[2:-1]
        return shown if len(shown) <= 50 else f"{shown[:40]}...({len(value)} bytes)"
    return None


def _recv_all(sock: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            data = sock.recv(1 << 20)
        except (ConnectionResetError, ssl.SSLEOFError):
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks)


def exchange(port: int, *parts: bytes, source: str = "127.0.0.1") -> bytes:
    """Send ``parts`` to the proxy (a moment apart, so they arrive as separate reads) and
    return everything it answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), IO_TIMEOUT, (source, 0)) as sock:
        for i, part in enumerate(parts):
            if i:
                time.sleep(0.1)
            sock.sendall(part)
        return _recv_all(sock)


def status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.") else 0


@contextlib.contextmanager
def tunnel(port: int, authority: str) -> Iterator[tuple[socket.socket, bytes]]:
    """A CONNECT tunnel through the proxy, and the proxy's answer head."""
    sock = socket.create_connection(("127.0.0.1", port), IO_TIMEOUT)
    with sock:
        sock.sendall(f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(1)
            if not data:
                break
            head += data
        yield sock, head


def tls_get(sock: socket.socket, ctx: ssl.SSLContext, sni: str | None, path: str = "/hi") -> bytes:
    with ctx.wrap_socket(sock, server_hostname=sni, do_handshake_on_connect=True) as tls:
        tls.sendall(f"GET {path} HTTP/1.1\r\nHost: {sni}\r\nConnection: close\r\n\r\n".encode())
        return _recv_all(tls)


@pytest.fixture(scope="module")
def tls_ctx(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(pki.ca))


def client_hello(*names: bytes, duplicate_sni: bool = False) -> bytes:
    """A minimal, well-formed TLS 1.2 ClientHello naming ``names`` (raw bytes)."""

    def vec(data: bytes, n: int) -> bytes:
        return len(data).to_bytes(n, "big") + data

    entries = b"".join(b"\x00" + vec(name, 2) for name in names)
    sni = b"\x00\x00" + vec(vec(entries, 2), 2)
    extensions = (sni * (2 if duplicate_sni else 1)) if names else b""
    body = (
        b"\x03\x03" + bytes(32) + vec(b"", 1) + vec(b"\x13\x01\xc0\x2f", 2) + vec(b"\x00", 1)
        + vec(extensions, 2)
    )  # fmt: skip
    handshake = b"\x01" + vec(body, 3)
    return b"\x16\x03\x01" + vec(handshake, 2)


# -- explicit proxy: allowed ----------------------------------------------------------


def test_absolute_form_get_allowed(h: Harness, internet: Internet) -> None:
    before = len(internet.lines())
    with httpx2.Client(proxy=f"http://127.0.0.1:{h.explicit}", trust_env=False) as client:
        response = client.get(
            "http://allowed.test/hello?x=1",
            headers={"Proxy-Authorization": "Basic c2VjcmV0", "X-Keep": "1"},
        )
    assert response.status_code == 200
    assert response.text == "hello from a-80 path=/hello?x=1 host=allowed.test\n"
    assert response.headers["connection"] == "close"
    d = h.decision()
    assert (d.allowed, d.kind, d.host, d.port, d.address) == (True, "http", "allowed.test", 80, A)
    assert d.sandbox_id == "sb-test" and "allowed.test matches allowed.test" in d.reason
    assert d.bytes_up > 0 and d.bytes_down > len(response.content) and d.duration_ms > 0
    assert h.connects == [(A, 80)]
    request = [line for line in internet.lines()[before:] if line.startswith("request")]
    assert len(request) == 1
    # origin-form upstream, hop-by-hop headers gone, Connection: close added
    assert request[0].startswith("request a-80 GET /hello?x=1 host=allowed.test")
    headers = request[0].split("headers=")[1].split(",")
    assert "proxy-authorization" not in headers and "x-keep" in headers
    assert "connection" in headers


def test_connect_tls_allowed(h: Harness, tls_ctx: ssl.SSLContext, internet: Internet) -> None:
    with httpx2.Client(
        proxy=f"http://127.0.0.1:{h.explicit}", verify=tls_ctx, trust_env=False
    ) as client:
        response = client.get("https://allowed.test/secure")
    assert response.status_code == 200
    assert response.text == "hello from a-443 path=/secure host=allowed.test\n"
    d = h.decision()
    assert (d.allowed, d.kind, d.host, d.port, d.address) == (
        True,
        "connect",
        "allowed.test",
        443,
        A,
    )
    assert d.bytes_up > 200 and d.bytes_down > 500  # handshake both ways, and the answer
    assert "sni a-443 allowed.test" in internet.lines()


def test_connect_tls_with_http_client(h: Harness, tls_ctx: ssl.SSLContext) -> None:
    import http.client

    conn = http.client.HTTPSConnection("127.0.0.1", h.explicit, context=tls_ctx, timeout=10)
    conn.set_tunnel("www.wild.test", 443)
    try:
        conn.request("GET", "/w", headers={"Connection": "close"})
        body = conn.getresponse().read()
    finally:
        conn.close()
    assert body == b"hello from a-443 path=/w host=www.wild.test\n"
    d = h.decision()
    assert d.allowed and d.host == "www.wild.test" and "matches *.wild.test" in d.reason


def test_trailing_dot_and_case_are_normalised(h: Harness, internet: Internet) -> None:
    answer = exchange(
        h.explicit,
        b"GET http://ALLOWED.test./n HTTP/1.1\r\nHost: allowed.TEST\r\n\r\n",
    )
    assert status(answer) == 200 and answer.endswith(b"path=/n host=allowed.TEST\n")
    d = h.decision()
    assert d.allowed and d.host == "allowed.test" and d.address == A


def test_punycode_name_allowed_and_invalid_punycode_denied(h: Harness) -> None:
    with tunnel(h.explicit, "XN--BCHER-KVA.wild.test:443") as (_, head):
        assert status(head) == 200
    d = h.decision()
    assert d.allowed and d.host == "xn--bcher-kva.wild.test" and d.address == A
    h.reset()
    answer = exchange(h.explicit, b"CONNECT xn--abc.wild.test:443 HTTP/1.1\r\n\r\n")
    assert status(answer) == 403 and b"punycode" in answer
    d = h.decision()
    assert not d.allowed and "punycode" in d.reason and h.connects == []


def test_request_body_forwarded_exactly_once(h: Harness, internet: Internet) -> None:
    """Exactly the framed body goes up; a pipelined request after it never does (the
    byte count upstream is exact: the rewritten head plus the body)."""
    before = len(internet.lines())
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: other.test\r\n\r\n"
    answer = exchange(
        h.explicit,
        b"POST http://allowed.test/p HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\n\r\n",
        b"hello" + smuggled,
    )
    assert status(answer) == 200 and answer.endswith(b"echo:hello")
    head = (
        b"POST /p HTTP/1.1\r\nHost: allowed.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\n"
    )
    assert h.decision().bytes_up == len(head) + 5
    h.reset()
    body = b"3\r\nabc\r\n4;x=y\r\ndefg\r\n0\r\n\r\n"
    answer = exchange(
        h.explicit,
        b"POST http://allowed.test/c HTTP/1.1\r\nHost: allowed.test\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\na",
        body[4:] + smuggled,
    )
    assert status(answer) == 200 and answer.endswith(b"echo:abcdefg")
    head = (
        b"POST /c HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n"
        b"Connection: close\r\n\r\n"
    )
    d = h.decision()
    assert d.allowed and d.bytes_up == len(head) + len(body)
    requests = [line for line in internet.lines()[before:] if line.startswith("request")]
    assert len(requests) == 2 and not any("smuggled" in line for line in requests)


def test_big_download_is_intact(h: Harness) -> None:
    expected = hashlib.sha256(random.Random(BIG_SEED).randbytes(BIG_SIZE)).hexdigest()
    digest = hashlib.sha256()
    with (
        httpx2.Client(proxy=f"http://127.0.0.1:{h.explicit}", trust_env=False, timeout=30) as c,
        c.stream("GET", "http://allowed.test/big") as response,
    ):
        assert response.status_code == 200
        assert int(response.headers["content-length"]) == BIG_SIZE
        size = 0
        for chunk in response.iter_raw(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    assert size == BIG_SIZE and digest.hexdigest() == expected
    d = h.decision()
    assert d.allowed and BIG_SIZE < d.bytes_down < BIG_SIZE + 1024 and d.bytes_up < 1024


def test_half_close_crosses_the_tunnel(h: Harness) -> None:
    payload = b"x" + random.Random(7).randbytes(3 * 1024 * 1024)
    with tunnel(h.explicit, "allowed.test:9") as (sock, head):
        assert status(head) == 200
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)  # the sink answers only once it reads EOF
        answer = _recv_all(sock)
    assert answer == f"{len(payload)} {hashlib.sha256(payload).hexdigest()}\n".encode()
    d = h.decision()
    assert d.allowed and (d.bytes_up, d.bytes_down) == (len(payload), len(answer))


def test_relay_engine(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The zero-copy engine really carries the bytes when it is on (and only then)."""
    from agentbox.network import splice

    runs: list[int] = []
    real_run = splice.Splicer.run

    async def counting_run(self: splice.Splicer) -> None:
        runs.append(1)
        await real_run(self)

    monkeypatch.setattr(splice.Splicer, "run", counting_run)
    with tunnel(h.explicit, "allowed.test:9") as (sock, head):
        assert status(head) == 200
        sock.sendall(b"ping")
        sock.shutdown(socket.SHUT_WR)
        assert _recv_all(sock).startswith(b"4 ")
    assert h.decision().allowed
    assert len(runs) == (2 if h.proxy.zero_copy else 0)


# -- explicit proxy: denied -----------------------------------------------------------


def test_name_not_on_allowlist(h: Harness, internet: Internet) -> None:
    before = len(internet.lines())
    answer = exchange(h.explicit, b"GET http://other.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n")
    assert status(answer) == 403
    assert answer.endswith(
        b"\r\n\r\nagentbox egress: other.test is not on this sandbox's allowlist\n"
    )
    d = h.decision()
    assert (d.allowed, d.host, d.port, d.kind, d.address) == (False, "other.test", 80, "http", None)
    answer = exchange(h.explicit, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")
    assert status(answer) == 403 and h.decision().kind == "connect"
    assert h.connects == [] and internet.lines()[before:] == []


@pytest.mark.parametrize(
    "authority",
    [
        "203.0.113.10:443",
        "127.0.0.1:443",
        "2130706433:443",
        "0x7f.0.0.1:443",
        "0177.0.0.1:443",
        "127.1:443",
        "0x7f000001:443",
        "[::1]:443",
        "[::ffff:127.0.0.1]:443",
        "[::ffff:203.0.113.10]:443",
        "169.254.169.254.:443",
    ],
)
def test_ip_literal_denied(h: Harness, authority: str) -> None:
    answer = exchange(h.explicit, f"CONNECT {authority} HTTP/1.1\r\n\r\n".encode())
    assert status(answer) == 403 and b"IP literal; name a host" in answer
    d = h.decision()
    assert not d.allowed and d.reason == "IP literal; name a host" and h.connects == []


def test_ip_literal_denied_in_absolute_url(h: Harness) -> None:
    answer = exchange(h.explicit, f"GET http://{A}/ HTTP/1.1\r\nHost: {A}\r\n\r\n".encode())
    assert status(answer) == 403 and b"IP literal" in answer
    assert h.decision().address == A and h.connects == []


def test_port_not_allowed(h: Harness, internet: Internet) -> None:
    before = len(internet.lines())
    answer = exchange(h.explicit, b"CONNECT allowed.test:8080 HTTP/1.1\r\n\r\n")
    assert status(answer) == 403 and b"port 8080 is not allowed" in answer
    answer = exchange(
        h.explicit, b"GET http://allowed.test:8080/ HTTP/1.1\r\nHost: allowed.test:8080\r\n\r\n"
    )
    assert status(answer) == 403
    assert h.connects == [] and internet.lines()[before:] == []


@pytest.mark.parametrize(
    ("name", "range_"),
    [
        ("rebind.test", "127.0.0.0/8 (loopback)"),
        ("meta.test", "169.254.0.0/16 (link-local / cloud metadata)"),
        ("private.test", "10.0.0.0/8"),
    ],
)
def test_rebinding_names_denied_before_connect(
    h: Harness, trap: socket.socket, name: str, range_: str
) -> None:
    for request in (
        f"CONNECT {name}:{h.trap_port} HTTP/1.1\r\n\r\n",
        f"GET http://{name}:{h.trap_port}/ HTTP/1.1\r\nHost: {name}:{h.trap_port}\r\n\r\n",
    ):
        answer = exchange(h.explicit, request.encode())
        assert status(answer) == 403 and range_.encode() in answer
        d = h.decision()
        assert not d.allowed and d.host == name and range_ in d.reason
        h.reset()
    assert h.connects == []
    _assert_untouched(trap)


def test_resolver_answers_are_checked_too(h: Harness) -> None:
    """Open mode, a name not in the host map: the system resolver's answer is checked,
    every address of it (one bad address is enough to refuse)."""
    open_policy = EgressPolicy("sb-open", "open", ports=(443,))
    proxy = EgressProxy(lambda peer: open_policy, h.decisions.put)
    proxy._getaddrinfo = h.proxy._getaddrinfo  # type: ignore[method-assign]
    proxy._connect = h.proxy._connect  # type: ignore[method-assign]
    h.dns.update({"sneaky.example": ["203.0.113.10", "169.254.169.254"]})
    server = h.run(proxy.serve_explicit("127.0.0.1", 0))
    try:
        port = server.sockets[0].getsockname()[1]
        answer = exchange(port, b"CONNECT Sneaky.Example.:443 HTTP/1.1\r\n\r\n")
        assert status(answer) == 403 and b"169.254.169.254" in answer
        assert h.lookups == ["sneaky.example"] and h.connects == []
        assert not h.decision().allowed
        h.lookups.clear()
        answer = exchange(port, b"CONNECT nowhere.example:443 HTTP/1.1\r\n\r\n")
        assert status(answer) == 502 and b"cannot resolve nowhere.example" in answer
        assert not h.decision().allowed
    finally:
        h.stop(server)
        h.lookups.clear()
        h.dns.clear()


@pytest.mark.parametrize(
    ("request_", "code", "words"),
    [
        (b"CONNECT evil.test\x00.allowed.test:443 HTTP/1.1\r\n\r\n", 400, b"NUL"),
        (b"CONNECT allowed.test.evil.test:443 HTTP/1.1\r\n\r\n", 403, b"not on this"),
        (b"CONNECT evilallowed.test:443 HTTP/1.1\r\n\r\n", 403, b"not on this"),
        (b"CONNECT wild.test:443 HTTP/1.1\r\n\r\n", 403, b"not on this"),
        (b"CONNECT allowed.test..:443 HTTP/1.1\r\n\r\n", 403, b"empty label"),
        (b"CONNECT allowed.test%00:443 HTTP/1.1\r\n\r\n", 403, b"invalid host name"),
        (b"CONNECT allowed.test HTTP/1.1\r\n\r\n", 400, b"no port"),
        (b"GET http://allowed.test/ HTTP/1.1\r\nHost: other.test\r\n\r\n", 403, b"does not match"),
        (
            b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test:81\r\n\r\n",
            403,
            b"does not match",
        ),
        (
            b"GET http://allowed.test/ HTTP/1.1\r\nHost: a\r\nHost: allowed.test\r\n\r\n",
            400,
            b"more than one Host",
        ),
        (b"GET http://x@allowed.test/ HTTP/1.1\r\n\r\n", 400, b"user info"),
        (b"GET https://allowed.test/ HTTP/1.1\r\n\r\n", 400, b"CONNECT"),
        (b"GET /relative HTTP/1.1\r\nHost: allowed.test\r\n\r\n", 400, b"absolute"),
        (b"GET http://allowed.test/ HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, b"NUL"),
        (b"GET http://allowed.test/ HTTP/1.1\nHost: allowed.test\r\n\r\n", 400, b"bare CR or LF"),
        (b"GET http://allowed.test/ HTTP/1.1\r\n folded\r\n\r\n", 400, b"malformed header"),
        (b"GET  http://allowed.test/ HTTP/1.1\r\n\r\n", 400, b"malformed request line"),
        (b"GET http://allowed.test/ HTTP/2.0\r\n\r\n", 400, b"malformed request line"),
        (
            b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
            b"both",
        ),
        (
            b"POST http://allowed.test/ HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            400,
            b"Content-Length",
        ),
        (b"GET http://allowed.test/ HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", 400, b"64 KiB"),
        (b"GET http://allowed.test/ HTTP/1.1\r\nX: " + b"a" * 70000, 400, b"64 KiB"),
    ],
    ids=_short_id,
)
def test_tricky_requests_denied(
    h: Harness, internet: Internet, request_: bytes, code: int, words: bytes
) -> None:
    before = len(internet.lines())
    answer = exchange(h.explicit, request_)
    assert status(answer) == code, answer[:300]
    assert words in answer, answer[:300]
    assert b"\x00" not in answer  # client input is escaped in the answer
    d = h.decision()
    assert not d.allowed and "\x00" not in d.reason and "\x00" not in d.host
    assert h.connects == [] and internet.lines()[before:] == []


def test_sni_must_match_connect_host(
    h: Harness, tls_ctx: ssl.SSLContext, internet: Internet
) -> None:
    before = len(internet.lines())
    with tunnel(h.explicit, "allowed.test:443") as (sock, head):
        assert status(head) == 200
        with pytest.raises((ssl.SSLError, OSError)):
            tls_get(sock, tls_ctx, "other.test")
    d = h.decision()
    assert not d.allowed and d.kind == "connect"
    assert d.reason == "SNI other.test does not match CONNECT allowed.test"
    assert not any(line.startswith(("sni", "request")) for line in internet.lines()[before:])


def test_sni_case_and_dot_differences_are_fine(h: Harness, tls_ctx: ssl.SSLContext) -> None:
    with tunnel(h.explicit, "allowed.test:443") as (sock, head):
        assert status(head) == 200
        sock.sendall(client_hello(b"ALLOWED.Test."))
        sock.shutdown(socket.SHUT_WR)
        _recv_all(sock)  # the server rejects our fake hello; the proxy let it through
    d = h.decision()
    assert d.allowed and d.bytes_up == len(client_hello(b"ALLOWED.Test."))


@pytest.mark.parametrize(
    ("hello", "words"),
    [
        (client_hello(b"allowed.test", duplicate_sni=True), "duplicate TLS extension"),
        (client_hello(b"allowed.test", b"other.test"), "more than one host name"),
        (client_hello(b"evil.test\x00.allowed.test"), "invalid SNI"),
        (client_hello(b"127.0.0.1"), "IP literal"),
        (client_hello(b"allowed.test")[:-3], "closed inside the TLS ClientHello"),
        (b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00", "not a ClientHello"),
    ],
    ids=_short_id,
)
def test_bad_client_hellos_denied(h: Harness, hello: bytes, words: str) -> None:
    with tunnel(h.explicit, "allowed.test:443") as (sock, head):
        assert status(head) == 200
        sock.sendall(hello)
        sock.shutdown(socket.SHUT_WR)
        assert _recv_all(sock) == b""
    d = h.decision()
    assert not d.allowed and words in d.reason


def test_connect_without_sni_is_allowed(h: Harness, pki: Pki) -> None:
    ctx = ssl.create_default_context(cafile=str(pki.ca))
    ctx.check_hostname = False
    with tunnel(h.explicit, "allowed.test:443") as (sock, head):
        assert status(head) == 200
        answer = tls_get(sock, ctx, None)
    assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200")
    assert h.decision().allowed


def test_unknown_client_is_closed(h: Harness) -> None:
    answer = exchange(h.explicit, b"GET http://allowed.test/ HTTP/1.1\r\n\r\n", source="127.0.0.2")
    assert answer == b""
    d = h.decision()
    assert (d.allowed, d.sandbox_id, d.reason) == (False, None, "unknown client")


# -- transparent proxy ----------------------------------------------------------------


def test_transparent_tls_by_sni(h: Harness, tls_ctx: ssl.SSLContext, internet: Internet) -> None:
    h.original_dst = ("198.51.100.99", 443)  # where the client aimed; we go where we resolve
    with socket.create_connection(("127.0.0.1", h.transparent), IO_TIMEOUT) as sock:
        answer = tls_get(sock, tls_ctx, "allowed.test", "/t")
    assert answer.endswith(b"hello from a-443 path=/t host=allowed.test\n")
    d = h.decision()
    assert (d.allowed, d.kind, d.host, d.port, d.address) == (
        True,
        "transparent",
        "allowed.test",
        443,
        A,
    )
    assert "original destination 198.51.100.99:443" in d.reason
    assert h.connects == [(A, 443)]


def test_transparent_plain_http_by_host(h: Harness) -> None:
    h.original_dst = (B, 80)
    answer = exchange(
        h.transparent, b"GET /plain HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n"
    )
    assert answer.endswith(b"hello from a-80 path=/plain host=allowed.test\n")
    d = h.decision()
    assert d.allowed and d.address == A and f"original destination {B}:80" in d.reason


@pytest.mark.parametrize(
    ("data", "dst", "words", "answer_status"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", (A, 443), "not HTTP or TLS", 0),
        (b"\x00\x01\x02\x03", (A, 443), "not HTTP or TLS", 0),
        (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", (A, 80), "Host header", 400),
        (b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n", (A, 80), "not on this", 403),
        (b"GET / HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n", (A, 80), "IP literal", 403),
        (b"GET / HTTP/1.1\r\nHost: rebind.test\r\n\r\n", ("127.0.0.1", 0), "127.0.0.0/8", 403),
        (b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n", (A, 8080), "port 8080", 403),
        (client_hello(), (A, 443), "no SNI", 0),
        (client_hello(b"other.test"), (A, 443), "not on this", 0),
        (client_hello(b"evil.test\x00.allowed.test"), (A, 443), "invalid SNI", 0),
        (client_hello(b"allowed.test", duplicate_sni=True), (A, 443), "duplicate", 0),
    ],
    ids=_short_id,
)
def test_transparent_denied(
    h: Harness,
    internet: Internet,
    data: bytes,
    dst: tuple[str, int],
    words: str,
    answer_status: int,
) -> None:
    if dst[0] == "127.0.0.1":
        dst = ("127.0.0.1", h.trap_port)
    h.original_dst = dst
    before = len(internet.lines())
    answer = exchange(h.transparent, data)
    assert status(answer) == answer_status
    d = h.decision()
    assert not d.allowed and d.kind == "transparent" and words in d.reason
    assert f"original destination {dst[0]}:{dst[1]}" in d.reason
    assert h.connects == [] and internet.lines()[before:] == []


def test_transparent_real_original_dst_lookup(h: Harness) -> None:
    """Without an injected function the proxy asks the kernel (SO_ORIGINAL_DST) on the
    loop's own socket object. Not NATed here: conntrack reports the real destination (the
    proxy's port, not an allowed one), or has no entry; refused either way."""
    policy = _policy("sb-dst", h.trap_port)
    proxy = EgressProxy(lambda peer: policy, h.decisions.put, head_timeout=1.0)
    proxy._getaddrinfo = h.proxy._getaddrinfo  # type: ignore[method-assign]  # no real DNS

    async def start() -> asyncio.Server:
        return await proxy.serve_transparent("127.0.0.1", 0)

    server = h.run(start())
    try:
        port = server.sockets[0].getsockname()[1]
        answer = exchange(port, b"GET / HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        d = h.decisions.get(timeout=IO_TIMEOUT)
        assert not d.allowed and d.kind == "transparent"
        if "no original destination" not in d.reason:
            assert f"original destination 127.0.0.1:{port}" in d.reason
            assert f"port {port} is not allowed" in d.reason and status(answer) == 403
    finally:
        h.stop(server)
        h.run(proxy.aclose())


# -- limits and robustness --------------------------------------------------------------


@contextlib.contextmanager
def _extra_proxy(h: Harness, **kwargs: Any) -> Iterator[tuple[EgressProxy, int]]:
    policy = _policy("sb-extra", h.trap_port)
    on_decision: Callable[[EgressDecision], None] = kwargs.pop("on_decision", h.decisions.put)
    proxy = EgressProxy(lambda peer: policy, on_decision, **kwargs)
    proxy._getaddrinfo = h.proxy._getaddrinfo  # type: ignore[method-assign]  # no real DNS
    server = h.run(proxy.serve_explicit("127.0.0.1", 0))
    try:
        yield proxy, server.sockets[0].getsockname()[1]
    finally:
        h.stop(server)
        h.run(proxy.aclose())


def test_connection_limit_and_head_timeout(h: Harness) -> None:
    with _extra_proxy(h, max_connections=2, head_timeout=0.5) as (proxy, port):
        idle = [socket.create_connection(("127.0.0.1", port), IO_TIMEOUT) for _ in range(2)]
        try:
            for _ in range(200):
                if proxy.active_connections("sb-extra") == 2:
                    break
                time.sleep(0.01)
            answer = exchange(port, b"GET http://allowed.test/ HTTP/1.1\r\n\r\n")
            assert status(answer) == 429 and b"too many connections" in answer
            d = h.decisions.get(timeout=IO_TIMEOUT)
            assert not d.allowed and "too many" in d.reason
            for sock in idle:  # each idle client gets a 408 after the head timeout
                assert status(_recv_all(sock)) == 408
        finally:
            for sock in idle:
                sock.close()
        reasons = sorted(h.decisions.get(timeout=IO_TIMEOUT).reason for _ in range(2))
        assert all("no complete request head within 0.5 s" in r for r in reasons)
        assert proxy.active_connections("sb-extra") == 0


def test_on_decision_errors_do_not_break_the_proxy(h: Harness) -> None:
    def explode(decision: EgressDecision) -> None:
        raise RuntimeError("audit sink down")

    with _extra_proxy(h, on_decision=explode) as (_, port):
        for _ in range(2):
            answer = exchange(
                port, b"GET http://allowed.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
            )
            assert answer.endswith(b"path=/x host=allowed.test\n")
            assert status(exchange(port, b"CONNECT other.test:443 HTTP/1.1\r\n\r\n")) == 403


def test_idle_relay_is_closed(h: Harness) -> None:
    with (
        _extra_proxy(h, idle_timeout=0.5) as (_, port),
        tunnel(port, "allowed.test:80") as (sock, head),
    ):
        assert status(head) == 200
        sock.sendall(b"GET /i HTTP/1.1\r\nHost: allowed.test\r\n\r\n")  # keep-alive: stays open
        started = time.monotonic()
        answer = _recv_all(sock)
        assert answer.endswith(b"path=/i host=allowed.test\n")
        assert time.monotonic() - started < 5
    d = h.decisions.get(timeout=IO_TIMEOUT)
    assert d.allowed and "no data for 0.5 s" in d.reason and d.bytes_down > 0


def test_policy_validation() -> None:
    from agentbox.errors import InvalidRequest

    p = EgressPolicy(
        "s", "allowlist", allow=["*.Bücher.TEST."], ports=[443], hosts={"A.Test.": "::1"}
    )  # type: ignore[arg-type]
    assert p.allow == ("*.xn--bcher-kva.test",) and p.ports == (443,)
    assert dict(p.hosts) == {"a.test": "::1"}
    with pytest.raises(TypeError):
        p.hosts["b.test"] = "1.2.3.4"  # type: ignore[index]
    for bad in (
        {"mode": "sometimes"},
        {"allow": ("a*.test",)},
        {"ports": (0,)},
        {"ports": (True,)},
        {"hosts": {"a.test": "2130706433"}},
        {"hosts": {"127.0.0.1": "127.0.0.1"}},
    ):
        with pytest.raises(InvalidRequest):
            EgressPolicy(**{"sandbox_id": "s", "mode": "allowlist", **bad})  # type: ignore[arg-type]


def test_mode_none_denies_everything(h: Harness) -> None:
    none = EgressPolicy("sb-none", "none", allow=("allowed.test",), hosts={"allowed.test": A})
    proxy = EgressProxy(lambda peer: none, h.decisions.put)
    proxy._getaddrinfo = h.proxy._getaddrinfo  # type: ignore[method-assign]  # no real DNS
    server = h.run(proxy.serve_explicit("127.0.0.1", 0))
    try:
        port = server.sockets[0].getsockname()[1]
        answer = exchange(port, b"CONNECT allowed.test:443 HTTP/1.1\r\n\r\n")
        assert status(answer) == 403 and b"mode none" in answer
        assert not h.decision().allowed
    finally:
        h.stop(server)
