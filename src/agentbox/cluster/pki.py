"""The cluster CA (``agentbox cluster init``) and the certificates it signs, and the TLS
contexts both ends of the node API use.

Roles are kept apart by the certificates' extended key usage, which OpenSSL checks during
the handshake: a node's certificate says *serverAuth* only, so a node cannot present it to
call another node (the node API requires a *clientAuth* peer); a gateway's says
*clientAuth* only, so it cannot pose as a node to a gateway.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agentbox.errors import InvalidRequest

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
Role = Literal["node", "gateway"]
_YEARS = 10


def _name(common: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "agentbox cluster"),
            x509.NameAttribute(NameOID.COMMON_NAME, common),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def init_ca(directory: Path) -> Path:
    """A new CA in ``directory``: ``ca.pem`` and ``ca.key`` (0600). Refuses to replace one:
    every certificate it signed would stop working."""
    if (directory / CA_KEY).exists() or (directory / CA_CERT).exists():
        raise InvalidRequest(
            f"{directory} already holds a cluster CA; issue certificates from it "
            "(`agentbox cluster issue`) or choose an empty directory"
        )
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("agentbox cluster CA"))
        .issuer_name(_name("agentbox cluster CA"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365 * _YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(directory / CA_KEY, key)
    (directory / CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory / CA_CERT


def issue(directory: Path, name: str, role: Role, hosts: list[str]) -> tuple[Path, Path]:
    """``NAME.pem`` and ``NAME.key`` in ``directory``, signed by its CA: a node's valid
    for ``hosts`` (the addresses gateways dial), a gateway's for calling nodes."""
    if not name.replace("-", "").replace(".", "").isalnum():
        raise InvalidRequest(f"certificate name {name!r}: letters, digits, '-' and '.' only")
    if role == "node" and not hosts:
        raise InvalidRequest("a node certificate needs --host: the address gateways dial")
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    except FileNotFoundError:
        raise InvalidRequest(
            f"{directory} holds no cluster CA: run `agentbox cluster init {directory}` first"
        ) from None
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    if cert_path.exists() or key_path.exists():
        raise InvalidRequest(f"{cert_path} exists already: remove it to issue it again")
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if role == "node" else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{role}:{name}"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365 * _YEARS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_sans(hosts)), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def server_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A node's listening context: its certificate, and a clientAuth peer signed by ``ca``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.load_verify_locations(ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A gateway's dialing context: only nodes signed by ``ca``, named for the address."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context
