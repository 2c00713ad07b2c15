"""Credentials the egress proxy injects: which header, for which host, from which secret.

A sandbox is granted a credential *by name*: its spec holds the domain, the header, the
format and the name of an environment variable. The value lives only in the environment
of the egress daemon (inherited from whoever started it: the gateway in production) and
is read when a request is forwarded; it never enters the sandbox.

Everything here is validated strictly, because the result is written into HTTP heads:
the header name must be an HTTP token and not one that frames or routes the message, the
format must hold ``{secret}`` exactly once and nothing that could end a header line, the
domain is one normalised host name (no wildcard: a secret goes to exactly one host).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from agentbox.errors import InvalidRequest
from agentbox.network.httphead import HOP_BY_HOP
from agentbox.network.names import normalize_host, parse_ip_literal

PLACEHOLDER = "{secret}"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,100}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
# Header values: visible ASCII, space, tab and obs-text; never CR, LF or NUL.
_VALUE = re.compile(r"[\t\x20-\x7e\x80-\xff]*")
# Headers the proxy owns (routing, framing, hop-by-hop): never set from a credential.
_RESERVED = HOP_BY_HOP | {"host", "content-length", "transfer-encoding", "accept-encoding"}


def check_domain(raw: str) -> str:
    """The canonical host name a credential is for."""
    if not isinstance(raw, str) or not raw:
        raise InvalidRequest("credential domain must be a host name such as api.example.com")
    if "*" in raw:
        raise InvalidRequest(
            f"credential domain {raw[:100]!a}: wildcards are not allowed; a secret is sent "
            "to exactly one host name"
        )
    if parse_ip_literal(raw) is not None:
        raise InvalidRequest(f"credential domain {raw[:100]!a} is an IP address; name a host")
    return normalize_host(raw)


def check_header(name: str) -> str:
    if not isinstance(name, str) or not _TOKEN.fullmatch(name):
        raise InvalidRequest(
            f"credential header {str(name)[:100]!a} is not an HTTP header name "
            "(letters, digits and !#$%&'*+-.^_`|~)"
        )
    if name.lower() in _RESERVED:
        raise InvalidRequest(
            f"credential header {name!a} is managed by the egress proxy and cannot be set"
        )
    return name


def check_env(name: str) -> str:
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise InvalidRequest(
            f"credential secret_env {str(name)[:100]!a} is not an environment variable name "
            "([A-Za-z_][A-Za-z0-9_]*)"
        )
    return name


def check_format(text: str) -> str:
    if not isinstance(text, str) or text.count(PLACEHOLDER) != 1:
        raise InvalidRequest(
            f"credential format must contain {PLACEHOLDER} exactly once (e.g. 'Bearer {{secret}}')"
        )
    if not _VALUE.fullmatch(text) or len(text) > 1000:
        raise InvalidRequest(
            "credential format may hold only printable characters and tabs (no CR, LF or NUL)"
        )
    return text


@dataclass(frozen=True)
class Credential:
    """Set ``header: format(secret)`` on requests to ``domain``; the secret is the value
    of the environment variable ``secret_env`` of the egress daemon."""

    domain: str
    secret_env: str
    header: str = "Authorization"
    format: str = "Bearer {secret}"

    def __post_init__(self) -> None:
        object.__setattr__(self, "domain", check_domain(self.domain))
        check_header(self.header)
        check_env(self.secret_env)
        check_format(self.format)


class _Granted(Protocol):
    @property
    def domain(self) -> str: ...
    @property
    def header(self) -> str: ...


def check_unique(credentials: Iterable[_Granted]) -> None:
    seen: set[tuple[str, str]] = set()
    for c in credentials:
        key = (c.domain, c.header.lower())
        if key in seen:
            raise InvalidRequest(f"two credentials set header {c.header} for {c.domain}")
        seen.add(key)


@dataclass(frozen=True)
class Injection:
    """One header to set on a forwarded request, and the secret to keep out of responses.
    ``repr`` never shows either."""

    header: str
    value: str
    secret: bytes

    def __repr__(self) -> str:
        return f"Injection(header={self.header!r}, value=<hidden>)"


class MissingCredential(Exception):
    """A credential cannot be injected; the message names only its variable."""


def injections(credentials: Iterable[Credential], environ: Mapping[str, str]) -> list[Injection]:
    """The headers for ``credentials``, with their values read from ``environ`` now."""
    out = []
    for c in credentials:
        secret = environ.get(c.secret_env)
        if not secret:
            raise MissingCredential(
                f"credential {c.secret_env} is not available to the egress daemon"
            )
        value = c.format.replace(PLACEHOLDER, secret)
        if not _VALUE.fullmatch(value):
            raise MissingCredential(
                f"credential {c.secret_env} holds characters that cannot be sent in a header"
            )
        try:
            raw = secret.encode("latin-1")
        except UnicodeEncodeError:
            raise MissingCredential(
                f"credential {c.secret_env} holds characters that cannot be sent in a header"
            ) from None
        out.append(Injection(c.header, value, raw))
    return out


class Scrubber:
    """Masks every occurrence of the secrets in a byte stream (same length, so framing
    stays valid), holding back just enough bytes to catch one split across reads."""

    MASK = b"*"

    def __init__(self, secrets: Iterable[bytes]) -> None:
        self.needles = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.keep = max((len(n) for n in self.needles), default=1) - 1
        self.held = b""

    def whole(self, data: bytes) -> bytes:
        """``data`` masked, for a complete unit (a head)."""
        for needle in self.needles:
            data = data.replace(needle, self.MASK * len(needle))
        return data

    def feed(self, data: bytes) -> bytes:
        """What of the stream so far can be sent (masked); the rest is held back."""
        buf = self.whole(self.held + data)
        cut = max(0, len(buf) - self.keep)
        self.held = buf[cut:]
        return buf[:cut]

    def flush(self) -> bytes:
        """The held-back tail at the end of the stream."""
        out, self.held = self.held, b""
        return out
