"""Credential specs, injection values, response scrubbing, the egress CA and its leaves,
the proxy-side TLS server, and the deny list of the egress decision. Loopback only."""

from __future__ import annotations

import asyncio
import datetime
import socket
import ssl
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import uvloop
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from agentbox.config.specs import NetworkSpec
from agentbox.errors import InvalidRequest
from agentbox.network import credentials, egressca, httphead, tlsserver
from agentbox.network.decision import Conn, Denied, EgressPolicy, decide

# -- CredentialSpec / Credential -----------------------------------------------------------


def test_credential_spec_defaults_and_normalisation() -> None:
    spec = NetworkSpec.model_validate(
        {"credentials": [{"domain": "API.GitHub.com.", "secret_env": "GITHUB_TOKEN"}]}
    )
    (c,) = spec.credentials
    assert (c.domain, c.header, c.secret_env, c.format) == (
        "api.github.com",
        "Authorization",
        "GITHUB_TOKEN",
        "Bearer {secret}",
    )
    assert "secret" not in spec.model_dump_json().replace("secret_env", "").replace("{secret}", "")


@pytest.mark.parametrize(
    ("credential", "words"),
    [
        ({"domain": "*.github.com", "secret_env": "T"}, "wildcard"),
        ({"domain": "github.*", "secret_env": "T"}, "wildcard"),
        ({"domain": "203.0.113.10", "secret_env": "T"}, "IP address"),
        ({"domain": "a..b", "secret_env": "T"}, "empty label"),
        ({"domain": "evil.test\x00.ok", "secret_env": "T"}, "control"),
        ({"domain": "x.test", "secret_env": "T", "header": "X Token"}, "not an HTTP header"),
        ({"domain": "x.test", "secret_env": "T", "header": "X:Y"}, "not an HTTP header"),
        ({"domain": "x.test", "secret_env": "T", "header": ""}, "not an HTTP header"),
        ({"domain": "x.test", "secret_env": "T", "header": "X-Token\n"}, "not an HTTP header"),
        ({"domain": "x.test", "secret_env": "T", "header": "Host"}, "managed by the egress"),
        ({"domain": "x.test", "secret_env": "T", "header": "content-length"}, "managed"),
        ({"domain": "x.test", "secret_env": "T", "header": "Connection"}, "managed"),
        ({"domain": "x.test", "secret_env": "T", "header": "Proxy-Authorization"}, "managed"),
        ({"domain": "x.test", "secret_env": "T", "format": "Bearer"}, "exactly once"),
        ({"domain": "x.test", "secret_env": "T", "format": "{secret}{secret}"}, "exactly once"),
        ({"domain": "x.test", "secret_env": "T", "format": "{secret}\r\nX-A: b"}, "no CR, LF"),
        ({"domain": "x.test", "secret_env": "T", "format": "{secret}\n"}, "no CR, LF"),
        ({"domain": "x.test", "secret_env": "T", "format": "\x00{secret}"}, "no CR, LF"),
        ({"domain": "x.test", "secret_env": "1TOKEN"}, "not an environment variable"),
        ({"domain": "x.test", "secret_env": "A=B"}, "not an environment variable"),
        ({"domain": "x.test", "secret_env": ""}, "not an environment variable"),
        ({"domain": "x.test", "secret_env": "TOKEN\n"}, "not an environment variable"),
        ({"domain": "x.test"}, "secret_env"),
        ({"domain": "x.test", "secret_env": "T", "value": "inline"}, "extra"),
    ],
)
def test_credential_spec_refuses(credential: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as info:
        NetworkSpec.model_validate({"credentials": [credential]})
    assert words.lower() in str(info.value).lower()


def test_two_credentials_for_one_header_and_host_are_refused() -> None:
    twice = [
        {"domain": "x.test", "secret_env": "A"},
        {"domain": "X.test.", "header": "authorization", "secret_env": "B"},
    ]
    with pytest.raises(ValidationError, match="two credentials"):
        NetworkSpec.model_validate({"credentials": twice})
    with pytest.raises(InvalidRequest, match="two credentials"):
        EgressPolicy(
            "sb",
            "allowlist",
            credentials=(
                credentials.Credential("x.test", "A"),
                credentials.Credential("x.test", "B", header="AUTHORIZATION"),
            ),
        )


def test_credential_dataclass_validates_too() -> None:
    assert credentials.Credential("Api.X.Test", "T").domain == "api.x.test"
    for bad in (
        {"domain": "*.x.test", "secret_env": "T"},
        {"domain": "x.test", "secret_env": "T", "format": "none"},
        {"domain": "x.test", "secret_env": "T", "header": "Host"},
        {"domain": "x.test", "secret_env": "T-1"},
    ):
        with pytest.raises(InvalidRequest):
            credentials.Credential(**bad)


def test_deny_patterns_are_validated_and_normalised() -> None:
    assert NetworkSpec.model_validate({"deny": ["*.Ads.Test.", "x.test"]}).deny == (
        "*.ads.test",
        "x.test",
    )
    for bad in ("ads.*", "a..b", "*"):
        with pytest.raises(ValidationError):
            NetworkSpec.model_validate({"deny": [bad]})


# -- injections and scrubbing -------------------------------------------------------------


def test_injections_read_the_value_now_and_never_show_it() -> None:
    creds = (
        credentials.Credential("x.test", "TOKEN_A"),
        credentials.Credential("x.test", "TOKEN_B", header="X-Key", format="k={secret};"),
    )
    env = {"TOKEN_A": "s3cr3t-a", "TOKEN_B": "s3cr3t-b", "OTHER": "nope"}
    out = credentials.injections(creds, env)
    assert [(i.header, i.value, i.secret) for i in out] == [
        ("Authorization", "Bearer s3cr3t-a", b"s3cr3t-a"),
        ("X-Key", "k=s3cr3t-b;", b"s3cr3t-b"),
    ]
    assert "s3cr3t" not in repr(out) and "s3cr3t" not in str(out)
    # A format with other braces is not a Python format string.
    (odd,) = credentials.injections(
        (credentials.Credential("x.test", "T", format="{x} {secret} {0}"),), {"T": "v"}
    )
    assert odd.value == "{x} v {0}"


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_secret_names_only_its_variable(value: str | None) -> None:
    creds = (
        credentials.Credential("x.test", "TOKEN_A"),
        credentials.Credential("x.test", "B", header="X-B"),
    )
    env = {"B": "other-secret", "UNRELATED": "zzz"}
    if value is not None:
        env["TOKEN_A"] = value
    with pytest.raises(credentials.MissingCredential) as info:
        credentials.injections(creds, env)
    assert str(info.value) == "credential TOKEN_A is not available to the egress daemon"


@pytest.mark.parametrize("value", ["a\r\nX-Evil: 1", "a\nb", "a\x00b", "snow☃", "end\n", "end\r"])
def test_a_secret_that_would_break_the_head_is_refused(value: str) -> None:
    with pytest.raises(credentials.MissingCredential) as info:
        credentials.injections((credentials.Credential("x.test", "T"),), {"T": value})
    assert "cannot be sent in a header" in str(info.value) and value not in str(info.value)


def test_scrubber_masks_secrets_split_across_reads() -> None:
    secret = b"TOPSECRET"
    stream = b"head " + secret + b" middle " + secret + b" end " + secret[:4]
    for size in (1, 2, 3, 5, 8, 9, 10, 64):
        scrub = credentials.Scrubber([secret, b"SECRET"])
        out = b"".join(scrub.feed(stream[i : i + size]) for i in range(0, len(stream), size))
        out += scrub.flush()
        assert len(out) == len(stream)
        assert secret not in out and b"SECRET" not in out
        assert out.count(b"*" * len(secret)) == 2 and out.endswith(b" end TOPS")
    assert credentials.Scrubber([b"k"]).whole(b"keep kk") == b"*eep **"


def test_rewrite_request_replaces_every_spelling_of_the_header() -> None:
    head = httphead.parse_request(
        b"GET /x HTTP/1.1\r\nHost: x.test\r\nauthorization: mine\r\nAUTHORIZATION: two\r\n"
        b"Accept-Encoding: gzip\r\nX-Keep: 1\r\n\r\n"
    )
    out = httphead.rewrite_request(
        head, "/x", "x.test", [("Authorization", "Bearer s"), ("Accept-Encoding", "identity")]
    )
    assert out == (
        b"GET /x HTTP/1.1\r\nHost: x.test\r\nX-Keep: 1\r\nAuthorization: Bearer s\r\n"
        b"Accept-Encoding: identity\r\nConnection: close\r\n\r\n"
    )


# -- the deny list in decisions -----------------------------------------------------------


async def _no_dns(name: str, port: int) -> Any:
    raise AssertionError(f"resolved {name}")


def _decide(policy: EgressPolicy, name: str) -> str:
    conn = Conn(kind="http", started=0.0, can_respond=True)
    try:
        target = asyncio.run(decide(policy, name, 80, conn, _no_dns))
    except Denied as e:
        return "denied: " + e.reason
    return "allowed: " + target.why


def test_deny_is_checked_before_allow_and_in_open_mode() -> None:
    hosts = {"a.ads.test": "203.0.113.10", "ok.test": "203.0.113.10"}
    open_policy = EgressPolicy("sb", "open", deny=("*.ads.test", "Blocked.Test"), hosts=hosts)
    assert _decide(open_policy, "a.ads.test") == (
        "denied: a.ads.test matches the deny pattern *.ads.test"
    )
    assert _decide(open_policy, "BLOCKED.test.") == (
        "denied: blocked.test matches the deny pattern blocked.test"
    )
    assert _decide(open_policy, "ok.test") == "allowed: open mode"
    allow = EgressPolicy(
        "sb", "allowlist", allow=("*.ads.test",), deny=("a.ads.test",), hosts=hosts
    )
    assert _decide(allow, "a.ads.test").startswith("denied: a.ads.test matches the deny")
    # "*.ads.test" does not deny ads.test itself, nor names that only end alike.
    below = EgressPolicy(
        "sb",
        "open",
        deny=("*.ads.test",),
        hosts={"ads.test": "203.0.113.10", "badads.test": "203.0.113.10"},
    )
    assert _decide(below, "ads.test") == "allowed: open mode"
    assert _decide(below, "badads.test") == "allowed: open mode"


def test_targets_carry_their_credentials() -> None:
    cred = credentials.Credential("api.x.test", "T")
    policy = EgressPolicy(
        "sb",
        "allowlist",
        allow=("*.x.test",),
        hosts={"api.x.test": "203.0.113.10", "www.x.test": "203.0.113.10"},
        credentials=(cred,),
    )
    conn = Conn(kind="http", started=0.0, can_respond=True)
    assert asyncio.run(decide(policy, "API.x.test", 80, conn, _no_dns)).credentials == (cred,)
    assert asyncio.run(decide(policy, "www.x.test", 80, conn, _no_dns)).credentials == ()


# -- the egress CA ---------------------------------------------------------------------------


@pytest.fixture
def ca(tmp_path: Path) -> egressca.EgressCA:
    return egressca.EgressCA.load_or_create(tmp_path / "egress-ca")


def test_ca_is_created_once_with_private_files(tmp_path: Path, ca: egressca.EgressCA) -> None:
    directory = tmp_path / "egress-ca"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / "ca.key").stat().st_mode) == 0o600
    assert (directory / "ca.pem").read_bytes() == ca.cert_pem()
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "ca.key", "ca.pem"]
    again = egressca.EgressCA.load_or_create(directory)
    assert again.cert == ca.cert
    key = ca.cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    assert b"PRIVATE KEY" not in ca.cert_pem()


def test_ca_with_a_key_that_does_not_match_is_refused(tmp_path: Path) -> None:
    one = egressca.EgressCA.load_or_create(tmp_path / "one")
    egressca.EgressCA.load_or_create(tmp_path / "two")
    (tmp_path / "two" / "ca.pem").write_bytes(one.cert_pem())
    with pytest.raises(OSError, match="does not belong"):
        egressca.EgressCA.load_or_create(tmp_path / "two")


def test_leaf_names_exactly_one_host_and_is_short_lived(ca: egressca.EgressCA) -> None:
    cert, key = ca.leaf("API.Example.test.")
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["api.example.test"]
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca.cert)
    life = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert life <= datetime.timedelta(days=1, minutes=11)
    assert isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1"
    with pytest.raises(InvalidRequest):
        ca.leaf("*.example.test")


def test_server_contexts_are_cached_per_host(ca: egressca.EgressCA) -> None:
    assert ca.server_context("a.test") is ca.server_context("A.test.")
    assert ca.server_context("a.test") is not ca.server_context("b.test")
    leftovers = [p.name for p in ca.directory.iterdir() if p.name.startswith(".leaf")]
    assert leftovers == []  # the leaf key was only on disk while ssl loaded it


def test_bundle_is_the_host_store_plus_the_ca(tmp_path: Path, ca: egressca.EgressCA) -> None:
    host = tmp_path / "host.crt"
    host.write_bytes(b"-----BEGIN CERTIFICATE-----\nHOST\n-----END CERTIFICATE-----")
    assert ca.bundle(host) == host.read_bytes() + b"\n" + ca.cert_pem()
    assert ca.bundle(tmp_path / "missing") == ca.cert_pem()


def _tls_exchange(
    ca: egressca.EgressCA, name: str, sni: str | None, loop_kind: str, early: bool
) -> bytes:
    """A client trusting only ``ca`` talks to a proxy-side TLS server for ``name`` whose
    handler read the client's first bytes before handing them to ``tlsserver.accept``."""
    context = ca.server_context(name)
    result: dict[str, bytes] = {}

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        initial = await reader.read(3) if early else b""
        try:
            r, w = await tlsserver.accept((reader, writer), context, initial, 5)
        except tlsserver.TLSHandshakeFailed as e:
            result["server"] = str(e).encode()
            writer.close()
            return
        line = await r.readline()
        w.write(b"echo " + line + b"x" * 300_000)
        await w.drain()
        w.close()
        await w.wait_closed()

    ready = threading.Event()
    port: list[int] = []
    stop: list[asyncio.Event] = []

    async def serve() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        stop.append(asyncio.Event())
        ready.set()
        await stop[0].wait()
        server.close()

    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(5)
        client = ssl.create_default_context(cadata=ca.cert_pem().decode())
        client.check_hostname = sni is not None
        with socket.create_connection(("127.0.0.1", port[0]), 5) as raw:
            try:
                with client.wrap_socket(raw, server_hostname=sni) as tls:
                    tls.sendall(b"hello\n")
                    data = b""
                    while chunk := tls.recv(65536):
                        data += chunk
                    return data
            except ssl.SSLError as e:
                return b"client error: " + str(e).encode() + result.get("server", b"")
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(5)
        loop.close()


@pytest.mark.parametrize("loop_kind", ["uvloop", "asyncio"])
@pytest.mark.parametrize("early", [False, True])
def test_tls_server_on_already_read_bytes(
    ca: egressca.EgressCA, loop_kind: str, early: bool
) -> None:
    data = _tls_exchange(ca, "api.x.test", "api.x.test", loop_kind, early)
    assert data == b"echo hello\n" + b"x" * 300_000


def test_tls_server_refuses_another_sni(ca: egressca.EgressCA) -> None:
    data = _tls_exchange(ca, "api.x.test", "other.test", "asyncio", True)
    assert data.startswith(b"client error") and b"unrecognized name" in data.lower()


def test_tls_transport_hides_the_raw_socket(ca: egressca.EgressCA) -> None:
    async def main() -> Any:
        server_sock, client_sock = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=server_sock)
        client = ssl.create_default_context(cadata=ca.cert_pem().decode())
        client_sock.setblocking(False)
        loop = asyncio.get_running_loop()
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = client.wrap_bio(incoming, outgoing, server_hostname="api.x.test")

        async def client_side() -> None:
            while True:
                try:
                    tls.do_handshake()
                    await loop.sock_sendall(client_sock, outgoing.read())
                    return
                except ssl.SSLWantReadError:
                    await loop.sock_sendall(client_sock, outgoing.read())
                    incoming.write(await loop.sock_recv(client_sock, 65536))

        task = asyncio.ensure_future(client_side())
        _, w = await tlsserver.accept((reader, writer), ca.server_context("api.x.test"), b"", 5)
        await task
        info = (w.get_extra_info("socket"), w.get_extra_info("ssl_object") is not None)
        w.close()
        await w.wait_closed()
        writer.close()
        client_sock.close()
        return info

    assert asyncio.run(main()) == (None, True)
