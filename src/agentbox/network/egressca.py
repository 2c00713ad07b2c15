"""The egress proxy's own certificate authority, for credential domains only.

To add a header to an HTTPS request the proxy must read it, so for a host that has a
credential (and only then) it terminates the sandbox's TLS with a certificate of its own.
That certificate is minted on demand, per host name, by a CA that exists once per
``AGENTBOX_HOME``:

    $AGENTBOX_HOME/egress-ca/        0700, root
        ca.key                       ECDSA P-256 private key, PKCS#8 PEM, 0600
        ca.pem                       the CA certificate (what sandboxes trust)

Only sandboxes that are granted a credential get ``ca.pem`` (never the key) in their
trust bundle; every other sandbox's TLS stays end to end. Leaves are short-lived (a day),
cached in memory by the daemon, and name exactly one host (SAN = that name).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import os
import ssl
import tempfile
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agentbox.errors import InvalidRequest
from agentbox.fsutil import atomic_file, locked
from agentbox.network.names import normalize_host

DIRECTORY = "egress-ca"
KEY_FILE = "ca.key"
CERT_FILE = "ca.pem"
HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=1)
LEAF_RENEW = datetime.timedelta(hours=12)  # re-minted when less than this is left
BACKDATE = datetime.timedelta(minutes=10)  # tolerate a little clock skew


def ca_dir(home: Path) -> Path:
    return home / DIRECTORY


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``path`` whole, atomically (temp file + rename), with ``mode``."""
    with atomic_file(path, mode) as f:
        f.write(data)


def _secure_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not os.path.isdir(directory) or os.path.islink(directory):
        raise OSError(f"{directory} is not a directory")
    if info.st_uid != os.geteuid():
        raise OSError(f"{directory} is owned by uid {info.st_uid}, not by this user")
    os.chmod(directory, 0o700)


class EgressCA:
    """The CA of one home: mints (and caches) one TLS server context per host name."""

    def __init__(
        self, directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> None:
        self.directory = directory
        self.cert = cert
        self._key = key
        self._leaves: dict[str, tuple[ssl.SSLContext, datetime.datetime]] = {}
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(cls, directory: Path) -> EgressCA:
        """The CA in ``directory``, created (key 0600, directory 0700) on first use."""
        _secure_dir(directory)
        with locked(directory / ".lock"):
            key_path, cert_path = directory / KEY_FILE, directory / CERT_FILE
            if key_path.exists() and cert_path.exists():
                os.chmod(key_path, 0o600)
                key = serialization.load_pem_private_key(key_path.read_bytes(), None)
                cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
                if not isinstance(key, ec.EllipticCurvePrivateKey) or (
                    key.public_key() != cert.public_key()
                ):
                    raise OSError(f"{directory}: ca.key does not belong to ca.pem")
                return cls(directory, cert, key)
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _ca_certificate(key)
            _write_new(
                key_path,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ),
                0o600,
            )
            _write_new(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
            return cls(directory, cert, key)

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def spki_sha256(self) -> str:
        """base64(sha256(SubjectPublicKeyInfo)): how Chromium names a key to trust
        (``--ignore-certificate-errors-spki-list``; it reads no ``SSL_CERT_FILE``)."""
        der = self.cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return base64.b64encode(hashlib.sha256(der).digest()).decode()

    def bundle(self, host_bundle: Path = HOST_BUNDLE) -> bytes:
        """The host's trust store followed by this CA: what a sandbox with credentials uses."""
        try:
            system = host_bundle.read_bytes()
        except FileNotFoundError:
            system = b""
        if system and not system.endswith(b"\n"):
            system += b"\n"
        return system + self.cert_pem()

    def leaf(self, name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        """A fresh certificate (and its key) for the host ``name``, signed by this CA."""
        host = normalize_host(name)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
        cert = (
            _builder(subject, self.cert.subject, key, LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage("digital_signature"), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )
        return cert, key

    def server_context(self, name: str) -> ssl.SSLContext:
        """A TLS server context presenting a leaf for ``name`` (cached until it nears its
        end). Its SNI callback refuses a handshake that names another host."""
        host = normalize_host(name)
        with self._lock:
            cached = self._leaves.get(host)
            if cached is not None and cached[1] > _now():
                return cached[0]
            cert, key = self.leaf(host)
            ctx = self._context(host, cert, key)
            self._leaves[host] = (ctx, cert.not_valid_after_utc - LEAF_RENEW)
            return ctx

    def _context(
        self, host: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
    ) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])  # the proxy reads and rewrites HTTP/1.1 only
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_pem()
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        # ssl loads keys from files only: a temp file in the root-only CA directory.
        fd, path = tempfile.mkstemp(dir=self.directory, prefix=".leaf-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(chain + key_pem)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)

        def check_sni(obj: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext) -> int | None:
            if server_name is None:
                return None  # no SNI: the Host header is checked on every request
            try:
                asked = normalize_host(server_name)
            except InvalidRequest:
                return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
            return None if asked == host else ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME

        ctx.sni_callback = check_sni
        return ctx


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agentbox"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"agentbox egress CA {os.urandom(4).hex()}"),
        ]
    )
    return (
        _builder(name, name, key, CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage("key_cert_sign", "crl_sign"), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    validity: datetime.timedelta,
) -> x509.CertificateBuilder:
    """A certificate for ``key``, valid from a little before now (clock skew) for ``validity``."""
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + validity)
    )


_KEY_USAGES = ("digital_signature", "content_commitment", "key_encipherment",
               "data_encipherment", "key_agreement", "key_cert_sign", "crl_sign",
               "encipher_only", "decipher_only")  # fmt: skip


def _key_usage(*allowed: str) -> x509.KeyUsage:
    """A KeyUsage extension that allows exactly ``allowed``."""
    return x509.KeyUsage(**{usage: usage in allowed for usage in _KEY_USAGES})
