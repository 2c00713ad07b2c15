"""Credential injection and deny lists, end to end: real sandboxes, the egress daemon,
real nftables, and upstream servers (HTTP and HTTPS) in a namespace this test creates.

The module runs on its own AGENTBOX_HOME: the egress daemon is per home and inherits
the environment of whoever starts it, so this module's daemon must be started by this
process after the secret and the upstream test CA are in its environment. Every name
resolves through the sandbox's static host map; no packet leaves the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agentbox import Sandbox
from agentbox.audit.log import read_records, verify
from agentbox.egressd import daemon as egressd
from agentbox.network import egressca, plane
from agentbox.runtime import template_tiers
from agentbox.runtime.host import release_home_mounts
from agentbox.runtime.runtime import Runtime
from nettopo import UPSTREAM_A, UPSTREAM_B, Internet, internet
from testpki import Pki, make_pki
from tierkit import not_on_gvisor

SECRET_ENV = "AGENTBOX_TEST_EGRESS_TOKEN"
MISSING_ENV = "AGENTBOX_TEST_EGRESS_ABSENT_" + secrets.token_hex(4).upper()
PLAIN_PORT = 8081  # our logging HTTP server (nettopo's own servers hold 80 and 8080)
HOSTS = {
    "api.allowed.test": UPSTREAM_A,
    "www.allowed.test": UPSTREAM_A,
    "evil.allowed.test": UPSTREAM_A,
    "nokey.test": UPSTREAM_B,
    "other.test": UPSTREAM_B,
    "blocked.test": UPSTREAM_B,
    "cdn.ads.test": UPSTREAM_B,
}
TLS_NAMES = ["api.allowed.test", "www.allowed.test", "nokey.test", "other.test"]
CREDENTIALS = [
    {"domain": "api.allowed.test", "secret_env": SECRET_ENV},
    {
        "domain": "nokey.test",
        "header": "X-Api-Key",
        "secret_env": MISSING_ENV,
        "format": "{secret}",
    },
]

# Runs inside the test namespace: HTTPS on 443 and plain HTTP on PLAIN_PORT, both echoing
# the request's headers, and logging (as JSON lines) what each request carried.
_SERVERS = r"""
import json, socketserver, ssl, sys, threading, http.server
log_path, cert, key, plain_port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
lock = threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_GET(self):
        scheme = "https" if self.server.tls else "http"
        entry = {"scheme": scheme, "host": self.headers.get("Host"), "path": self.path,
                 "authorization": self.headers.get_all("Authorization") or [],
                 "x_api_key": self.headers.get_all("X-Api-Key") or [],
                 "accept_encoding": self.headers.get("Accept-Encoding")}
        with lock, open(log_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        body = ("hello %s from %s\n%s\n" % (scheme, self.headers.get("Host"),
                json.dumps(dict(self.headers)))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    tls = False
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)  # no reverse DNS lookup of the address
        self.server_name, self.server_port = self.server_address[:2]

class TLSServer(Server):
    tls = True
    def __init__(self, addr):
        super().__init__(addr, Handler)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
    def finish_request(self, request, client_address):
        request.settimeout(10)
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except OSError:
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()

for server in (TLSServer(("0.0.0.0", 443)), Server(("0.0.0.0", plain_port), Handler)):
    threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"""


@dataclass
class World:
    internet: Internet
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


def _make_pki(out: Path) -> Pki:
    return make_pki(out, "agentbox credential test upstream CA", list(TLS_NAMES), "upstream-")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return _make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("credinet")
    with internet(tmp) as net:
        log = tmp / "upstream.jsonl"
        server = subprocess.Popen(
            ["ip", "netns", "exec", net.netns, sys.executable, "-c", _SERVERS, str(log),
             str(pki.cert), str(pki.key), str(PLAIN_PORT)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            line = server.stdout.readline().strip()
            assert line == "ready", f"the HTTPS servers in {net.netns} did not start"
            yield World(net, log)
        finally:
            server.kill()
            server.wait()
            for stream in (server.stdin, server.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture(scope="module")
def secret() -> Iterator[str]:
    """The secret, in this process's environment (so in the egress daemon's, which this
    process starts), with the upstream test CA the daemon must trust."""
    value = "agtok-" + secrets.token_hex(20)
    assert MISSING_ENV not in os.environ
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SECRET_ENV, value)
        yield value


@pytest.fixture(scope="module", params=template_tiers.TIERS)
def home(request: pytest.FixtureRequest, host_ready: None, pki: Pki, secret: str) -> Iterator[Path]:
    """A fresh AGENTBOX_HOME whose egress daemon is started by this process, with the
    secret and AGENTBOX_EGRESS_UPSTREAM_CA in its environment; once per isolation tier
    (its default template's: every sandbox here is made on it)."""
    path = Path(tempfile.mkdtemp(prefix="agentbox-cred-", dir="/var/tmp"))
    path.chmod(0o755)
    template_tiers.set_default_tier(path, "default", request.param)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(egressd.UPSTREAM_CA_ENV, str(pki.ca))
        try:
            yield path
        finally:
            _stop_daemon(path)
            release_home_mounts(path)
            shutil.rmtree(path, ignore_errors=True)


def _stop_daemon(home: Path) -> None:
    """Stop this home's egress daemon (started by this process)."""
    with contextlib.suppress(OSError, ValueError):
        pid = int((home / egressd.PID_FILE).read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
            time.sleep(0.05)


@pytest.fixture(scope="module")
def runtime_c(home: Path) -> Runtime:
    return Runtime(home)


def _create(home: Path, mode: str = "allowlist", **network: Any) -> Sandbox:
    spec = {"mode": mode, "hosts": HOSTS, "ports": [80, 443, PLAIN_PORT], **network}
    return Sandbox.create(memory="256MiB", disk="64MiB", network=spec, home=home)


@pytest.fixture(scope="module")
def box(world: World, home: Path, runtime_c: Runtime) -> Iterator[Sandbox]:
    network: dict[str, Any] = {
        "allow": ["*.allowed.test", "nokey.test", "other.test"],
        "deny": ["evil.allowed.test"],
        "credentials": CREDENTIALS,
    }
    sb = _create(home, **network)
    try:
        yield sb
    finally:
        sb.kill()


@pytest.fixture(scope="module")
def test_ca_in_box(box: Sandbox, pki: Pki) -> str:
    """The upstream test CA, as a file inside the sandbox (it is no secret)."""
    box.files.write("/workspace/upstream-ca.pem", pki.ca.read_bytes())
    return "/workspace/upstream-ca.pem"


def _curl(sb: Sandbox, *args: str, output: str = "-") -> tuple[int, str, str]:
    """(exit code, body, the `-w` line and stderr) of curl inside the sandbox."""
    r = sb.commands.run(
        ["curl", "-sS", "--max-time", "10", "-o", output, "-w",
         "\n@@%{http_code} %{http_connect}", *args]
    )  # fmt: skip
    body, _, tail = r.stdout.rpartition("\n@@")
    return r.exit_code, body, tail.strip() + " " + r.stderr


def _egress(
    home: Path, sandbox: str, until: Callable[[dict[str, Any]], bool] | None = None
) -> list[dict[str, Any]]:
    """The sandbox's egress records; with ``until``, waits (bounded) for one that matches:
    an allowed connection is recorded when it ends, which may be just after the client
    has its answer."""
    deadline = time.monotonic() + 10
    while True:
        records = [
            r for r in read_records(egressd.audit_path(home), limit=None)
            if r["sandbox"] == sandbox
        ]  # fmt: skip
        if until is None or any(until(r) for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.05)


def _new_requests(world: World, before: int) -> list[dict[str, Any]]:
    return world.requests()[before:]


# -- injection --------------------------------------------------------------------------


def test_https_request_gets_the_header_and_the_sandbox_never_sees_it(
    box: Sandbox, world: World, secret: str, home: Path
) -> None:
    before = len(world.requests())
    code, _, info = _curl(box, "https://api.allowed.test/v1", output="/workspace/https-body.txt")
    assert code == 0, info
    seen = _new_requests(world, before)
    assert [r["authorization"] for r in seen] == [[f"Bearer {secret}"]], seen
    assert seen[0]["scheme"] == "https" and seen[0]["host"] == "api.allowed.test"
    assert seen[0]["accept_encoding"] == "identity"
    saved = box.commands.run("cat /workspace/https-body.txt").stdout
    assert saved.startswith("hello https from api.allowed.test"), saved
    # The upstream echoes the request's headers: the proxy masked the secret.
    assert secret not in saved and "Bearer " + "*" * len(secret) in saved
    injected = lambda r: "injected Authorization" in r["reason"]  # noqa: E731
    decisions = [r for r in _egress(home, box.id, injected) if r["host"] == "api.allowed.test"]
    assert decisions and "injected Authorization" in decisions[-1]["reason"]
    assert decisions[-1]["decision"] == "egress_allowed"


def test_plain_http_request_gets_the_header(box: Sandbox, world: World, secret: str) -> None:
    before = len(world.requests())
    code, body, info = _curl(box, f"http://api.allowed.test:{PLAIN_PORT}/plain")
    assert code == 0 and body.startswith("hello http from api.allowed.test"), (body, info)
    assert secret not in body
    seen = _new_requests(world, before)
    assert [r["authorization"] for r in seen] == [[f"Bearer {secret}"]], seen


def test_the_sandbox_authorization_header_is_replaced(
    box: Sandbox, world: World, secret: str
) -> None:
    before = len(world.requests())
    for url in ("https://api.allowed.test/own", f"http://api.allowed.test:{PLAIN_PORT}/own"):
        code, _, info = _curl(box, "-H", "Authorization: Bearer from-the-sandbox",
                              "-H", "authorization: Basic Zm9vOmJhcg==", url)  # fmt: skip
        assert code == 0, info
    seen = _new_requests(world, before)
    assert [r["authorization"] for r in seen] == [[f"Bearer {secret}"]] * 2, seen


def test_programs_ignoring_the_proxy_get_the_header_too(
    box: Sandbox, world: World, secret: str
) -> None:
    """Transparent interception: by SNI for HTTPS, by Host for HTTP (each request)."""
    before = len(world.requests())
    code, body, info = _curl(box, "--noproxy", "*", "--resolve",
                             f"api.allowed.test:443:{UPSTREAM_A}", "https://api.allowed.test/t")  # fmt: skip
    assert code == 0 and body.startswith("hello https from api.allowed.test"), (body, info)
    # Two requests on one connection: each is checked and injected (or not sent at all).
    r = box.commands.run(
        f"exec 3<>/dev/tcp/{UPSTREAM_A}/{PLAIN_PORT}; "
        r"printf 'GET /one HTTP/1.1\r\nHost: api.allowed.test\r\nAuthorization: mine\r\n\r\n"
        r"GET /two HTTP/1.1\r\nHost: www.allowed.test\r\n\r\n' >&3; timeout 5 cat <&3"
    )
    assert "hello http from api.allowed.test" in r.stdout, r.stdout + r.stderr
    assert secret not in r.stdout
    seen = _new_requests(world, before)
    assert [(r["scheme"], r["path"], r["authorization"]) for r in seen] == [
        ("https", "/t", [f"Bearer {secret}"]),
        ("http", "/one", [f"Bearer {secret}"]),
    ], seen


def test_a_missing_secret_denies_the_request(box: Sandbox, world: World, home: Path) -> None:
    before = len(world.requests())
    code, _, info = _curl(box, "https://nokey.test/")
    assert code != 0 and "403" in info, info
    code, body, info = _curl(box, f"http://nokey.test:{PLAIN_PORT}/")
    assert info.startswith("403"), (body, info)
    assert f"credential {MISSING_ENV} is not available to the egress daemon" in body
    assert _new_requests(world, before) == [], "a request without its credential was sent"
    denied = [
        r for r in _egress(home, box.id)
        if r["host"] == "nokey.test" and r["decision"] == "egress_denied"
    ]  # fmt: skip
    assert len(denied) >= 2
    for record in denied:
        assert record["reason"] == f"credential {MISSING_ENV} is not available to the egress daemon"
        assert SECRET_ENV not in json.dumps(record)


def test_other_https_hosts_are_not_intercepted(
    box: Sandbox, world: World, test_ca_in_box: str, home: Path
) -> None:
    # Only the upstream's own CA: works for a host without credentials (its real
    # certificate, end to end), fails for the credential host (the proxy's certificate).
    code, body, info = _curl(box, "--cacert", test_ca_in_box, "https://other.test/")
    assert code == 0 and body.startswith("hello https from other.test"), (body, info)
    code, _, info = _curl(box, "--cacert", test_ca_in_box, "https://api.allowed.test/")
    assert code == 60, info  # curl: peer certificate cannot be authenticated
    # The egress CA is in the chain for the credential host only.
    proxy = f"{plane.home_net(home).proxy_address}:{plane.EXPLICIT_PORT}"
    chain = box.commands.run(
        f"openssl s_client -proxy {proxy} -connect api.allowed.test:443 "
        "-servername api.allowed.test -showcerts </dev/null 2>/dev/null; "
        f"echo ===; openssl s_client -proxy {proxy} -connect other.test:443 "
        "-servername other.test -showcerts </dev/null 2>/dev/null"
    ).stdout
    intercepted, _, plain = chain.partition("===")
    assert "agentbox egress CA" in intercepted, intercepted[-2000:]
    assert "agentbox egress CA" not in plain and "credential test upstream CA" in plain, plain

    def relayed(r: dict[str, Any]) -> bool:
        return r["host"] == "other.test" and r["kind"] == "connect"

    ok = [r for r in _egress(home, box.id, relayed) if relayed(r)]
    assert ok and all("injected" not in r["reason"] for r in ok)


def test_no_trace_of_the_secret_in_the_sandbox(
    box: Sandbox, secret: str, home: Path, runtime_c: Runtime
) -> None:
    code, _, info = _curl(box, "-D", "/home/user/headers.txt", "https://api.allowed.test/again",
                          output="/tmp/again.txt")  # fmt: skip
    assert code == 0, info
    files = box.commands.run(
        "find /workspace /tmp /etc /home -xdev -type f -readable -print0 2>/dev/null"
        " | xargs -0 cat 2>/dev/null",
        max_output_bytes=64 << 20,
    ).stdout
    assert "hello https from api.allowed.test" in files  # the responses were searched
    assert "BEGIN CERTIFICATE" in files  # so was /etc/agentbox
    assert secret not in files
    # A live process with the usual env, in the same command: on gvisor each command has
    # a PID namespace of its own, and another command's processes are not in its /proc.
    procs = box.commands.run(
        "sleep 30 >/dev/null 2>&1 & "
        "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do cat $f 2>/dev/null; echo; done",
        max_output_bytes=64 << 20,
    ).stdout
    assert "HTTPS_PROXY" in procs and "sleep" in procs  # what is readable was read
    assert secret not in procs and SECRET_ENV not in procs
    env = box.commands.run("env").stdout
    assert f"SSL_CERT_FILE={plane.SANDBOX_CA_BUNDLE}" in env and secret not in env
    # Host side: only the variable's name is stored, and the audit trail never has the value.
    record = runtime_c.get(box.id)
    assert SECRET_ENV in record.stored and secret not in record.stored
    audit = egressd.audit_path(home).read_text()
    assert "injected Authorization" in audit and secret not in audit
    assert verify(egressd.audit_path(home)).ok


def test_the_ca_key_stays_on_the_host(box: Sandbox, home: Path) -> None:
    directory = egressca.ca_dir(home)
    assert (directory.stat().st_mode & 0o777) == 0o700 and directory.stat().st_uid == 0
    assert ((directory / egressca.KEY_FILE).stat().st_mode & 0o777) == 0o600
    key = (directory / egressca.KEY_FILE).read_text()
    r = box.commands.run("cat /etc/agentbox/egress-ca.pem; ls -la /etc/agentbox")
    assert r.stdout.startswith("-----BEGIN CERTIFICATE-----")
    assert (directory / egressca.CERT_FILE).read_text() in r.stdout
    assert "PRIVATE KEY" not in r.stdout and key.splitlines()[1] not in r.stdout


def test_sandboxes_without_credentials_do_not_trust_the_egress_ca(
    box: Sandbox, home: Path, world: World
) -> None:
    other = _create(home, allow=["*.allowed.test"])
    try:
        r = other.commands.run("env; cat /etc/agentbox 2>&1")  # ls: statx fails on gvisor
        assert "SSL_CERT_FILE" not in r.stdout and "No such file" in r.stdout
        # Without the CA it cannot talk to the intercepting side at all; and the
        # credential of `box` is not injected for it (not its credential).
        code, body, info = _curl(other, "-k", "https://api.allowed.test/")
        assert code == 0 and "Bearer" not in body, (body, info)
    finally:
        other.kill()


# -- deny list --------------------------------------------------------------------------


def test_deny_wins_over_the_allowlist(box: Sandbox, world: World, home: Path) -> None:
    before = world.internet.seen()
    _, body, info = _curl(box, "http://evil.allowed.test/")
    assert info.startswith("403") and "deny pattern evil.allowed.test" in body, (body, info)
    assert world.internet.seen() == before


def test_deny_list_in_open_mode(world: World, home: Path) -> None:
    sb = _create(home, mode="open", deny=["blocked.test", "*.ads.test"])
    try:
        before = world.internet.seen()
        code, body, info = _curl(sb, "http://other.test/")
        assert info.startswith("200") and body.startswith("hello from other.test")
        code, body, info = _curl(sb, "http://blocked.test/")
        assert info.startswith("403") and "deny pattern blocked.test" in body, (body, info)
        # A page and its subresource in one client run: the second is refused.
        r = sb.commands.run(
            "curl -sS --max-time 10 -w '\\n@@%{http_code}\\n' http://other.test/page "
            "http://cdn.ads.test/lib.js"
        )
        assert r.stdout.count("@@200") == 1 and r.stdout.count("@@403") == 1, r.stdout
        assert "deny pattern *.ads.test" in r.stdout
        # The same second request pipelined on one connection that ignores the proxy.
        r = sb.commands.run(
            f"exec 3<>/dev/tcp/{UPSTREAM_B}/80; "
            r"printf 'GET /page HTTP/1.1\r\nHost: other.test\r\n\r\n"
            r"GET /lib.js HTTP/1.1\r\nHost: cdn.ads.test\r\n\r\n' >&3; timeout 5 cat <&3"
        )
        assert "hello from other.test" in r.stdout and "cdn.ads.test" not in r.stdout, r.stdout
        # TLS by SNI, through the proxy and around it.
        code, _, info = _curl(sb, "-k", "https://blocked.test/")
        assert code != 0 and "403" in info, info
        code, _, info = _curl(sb, "-k", "--noproxy", "*", "--resolve",
                              f"blocked.test:443:{UPSTREAM_B}", "https://blocked.test/")  # fmt: skip
        assert code != 0, info
        seen = world.internet.seen()[len(before) :]
        assert "blocked.test" not in seen and "ads.test" not in seen, seen
        assert [r for r in world.requests() if r["host"] in ("blocked.test", "cdn.ads.test")] == []
        reasons = [r["reason"] for r in _egress(home, sb.id) if r["decision"] == "egress_denied"]
        assert sum("deny pattern blocked.test" in x for x in reasons) >= 3, reasons
        assert any("deny pattern *.ads.test" in x for x in reasons), reasons
    finally:
        sb.kill()


def test_the_browser_reaches_a_credential_host_over_https(
    box: Sandbox, world: World, secret: str, runtime_c: Runtime
) -> None:
    """Chromium reads no SSL_CERT_FILE: it is told to trust the egress CA's key, which
    only chains the proxy presents contain; the upstream gets the header, the page shows
    it masked."""
    not_on_gvisor(box.info().isolation, "the browser on gvisor needs pids >= 2048, more "
                  "than this module's shared box has; the browser's egress on gvisor: "
                  "tests/security/test_browser_gvisor.py")  # fmt: skip
    from agentbox.browser.manager import BrowserConfig, BrowserManager
    from browserkit import require_browser

    require_browser()
    before = len(world.requests())
    manager = BrowserManager(runtime_c, BrowserConfig())
    try:
        opened = manager.open(box.id, "https://api.allowed.test/page", None, 60, 5000)
    finally:
        manager.close_all()
    assert opened["status"] == 200, opened
    assert opened["text"].startswith("hello https from api.allowed.test"), opened["text"][:500]
    assert secret not in opened["text"] and "*" * len(secret) in opened["text"]
    seen = _new_requests(world, before)
    assert [f"Bearer {secret}"] in [r["authorization"] for r in seen], seen
