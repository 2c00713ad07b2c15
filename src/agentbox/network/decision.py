"""Egress policy and decisions: what a sandbox may reach, and how one target is judged.

The decision is made on the *name*, never on an address the client supplies: IP literals
in any spelling are refused, the name is normalised (:mod:`names`) and matched against the
policy, resolved by the proxy, and *every* resolved address is checked against the denied
ranges (:mod:`addresses`) - an allowed name that resolves to loopback or the metadata
service is refused before anything connects (DNS rebinding).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, Protocol

from agentbox.errors import InvalidRequest
from agentbox.network import policy_fields as fields
from agentbox.network.addresses import IPAddress, IPNetwork, denied_reason
from agentbox.network.credentials import Credential, check_unique
from agentbox.network.modes import EgressMode
from agentbox.network.names import domain_matches, normalize_host, parse_ip_literal

Mode = EgressMode  # declared in network/modes.py
Kind = Literal["connect", "http", "transparent"]
# (name, port) -> every address the name resolves to; raises Denied when it cannot.
Resolver = Callable[[str, int], Awaitable[tuple[IPAddress, ...]]]
# Mode ask, a name on neither list: (policy, name, port, conn) -> why it is allowed, once a
# person said so; raises Denied otherwise (see agentbox.egressd.ask).
Asker = Callable[["EgressPolicy", str, int, "Conn"], Awaitable[str]]


class _Granted(Protocol):
    @property
    def domain(self) -> str: ...
    @property
    def secret_env(self) -> str: ...
    @property
    def header(self) -> str: ...
    @property
    def format(self) -> str: ...


class NetworkFields(Protocol):
    """What :meth:`EgressPolicy.from_spec` reads: ``specs.NetworkSpec`` (not imported:
    this library stays free of pydantic)."""

    @property
    def mode(self) -> EgressMode: ...
    @property
    def allow(self) -> Sequence[str]: ...
    @property
    def ports(self) -> Sequence[int]: ...
    @property
    def hosts(self) -> Mapping[str, str]: ...
    @property
    def deny(self) -> Sequence[str]: ...
    @property
    def ask_timeout(self) -> float: ...
    @property
    def credentials(self) -> Sequence[_Granted]: ...


@dataclass(frozen=True)
class EgressPolicy:
    """What one sandbox may reach. Patterns and host-map names are normalised here, so a
    policy that exists is a valid one (:class:`InvalidRequest` otherwise)."""

    sandbox_id: str
    mode: Mode
    allow: tuple[str, ...] = ()
    ports: tuple[int, ...] = (80, 443)
    # name -> IP literal, used instead of DNS; accepts any mapping, stored read-only.
    hosts: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    # Refused in every mode, checked before the allow list.
    deny: tuple[str, ...] = ()
    # Headers the proxy sets on requests to one host (values from its own environment).
    credentials: tuple[Credential, ...] = ()
    # Mode ask: the longest a connection is held for a person's decision, in seconds.
    ask_timeout: float = 60.0
    # The sandbox's project (mode ask: whose persistent allowlist applies).
    project: str = "default"

    def __post_init__(self) -> None:
        # The same checks as specs.NetworkSpec (policy_fields): one checker for both.
        credentials = tuple(self.credentials)
        for c in credentials:
            if not isinstance(c, Credential):
                raise InvalidRequest(f"egress credential {c!r} is not a Credential")
        check_unique(credentials)
        object.__setattr__(self, "mode", fields.mode(self.mode))
        object.__setattr__(self, "allow", fields.patterns(self.allow, "allow"))
        object.__setattr__(self, "deny", fields.patterns(self.deny, "deny"))
        object.__setattr__(self, "credentials", credentials)
        object.__setattr__(self, "ports", fields.ports(self.ports))
        object.__setattr__(self, "hosts", MappingProxyType(fields.host_map(self.hosts)))

    @classmethod
    def from_spec(cls, sandbox_id: str, spec: NetworkFields) -> EgressPolicy:
        """The policy of a validated network spec (``specs.NetworkSpec``)."""
        return cls(
            sandbox_id=sandbox_id,
            mode=spec.mode,
            allow=tuple(spec.allow),
            ports=tuple(spec.ports),
            hosts=dict(spec.hosts),
            deny=tuple(spec.deny),
            ask_timeout=spec.ask_timeout,
            credentials=tuple(
                Credential(
                    domain=c.domain, secret_env=c.secret_env, header=c.header, format=c.format
                )
                for c in spec.credentials
            ),
        )

    def credentials_for(self, name: str) -> tuple[Credential, ...]:
        """The credentials to inject on requests to the normalised host ``name``."""
        return tuple(c for c in self.credentials if c.domain == name)


@dataclass(frozen=True)
class EgressDecision:
    """One connection's (or one proxied request's) outcome, for the audit trail."""

    sandbox_id: str | None
    allowed: bool
    host: str
    port: int
    address: str | None
    reason: str
    kind: Kind
    bytes_up: int = 0
    bytes_down: int = 0
    duration_ms: float = 0.0


class Denied(Exception):
    """Refuse the connection; ``status`` is the HTTP answer when one can be given (0: none)."""

    def __init__(self, reason: str, status: int = 403) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass
class Conn:
    """What is known so far about one client connection (becomes its decision)."""

    kind: Kind
    started: float
    can_respond: bool  # an HTTP error answer may still be written to the client
    sandbox_id: str | None = None
    host: str = ""
    port: int = 0
    address: str | None = None
    note: str = ""  # forensics appended to the reason
    done: bool = False
    broken: bool = False  # ended on an error: abort, do not flush


@dataclass(frozen=True)
class Target:
    """An allowed destination: its name, port, the checked addresses, and why."""

    name: str
    port: int
    addresses: tuple[IPAddress, ...]
    why: str
    credentials: tuple[Credential, ...] = ()  # to inject: the proxy terminates and rewrites


def printable(text: str, limit: int = 300) -> str:
    """``text`` with anything but printable ASCII escaped: reasons echo client input."""
    out = "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text[:limit])
    return out if len(text) <= limit else out + "..."


async def decide(
    policy: EgressPolicy,
    raw: str,
    port: int,
    conn: Conn,
    resolve: Resolver,
    extra_denied: Iterable[IPNetwork] = (),
    ask: Asker | None = None,
) -> Target:
    """The target ``raw:port`` if ``policy`` allows it, else :class:`Denied`.

    Records the normalised name (and a refused address) on ``conn`` as it goes. In mode
    ``ask`` a name on neither list goes to ``ask`` (no asker: denied) after the port is
    checked and before it is resolved: a name nobody approved is never looked up.
    """
    conn.host, conn.port = printable(raw, 255), port
    literal = parse_ip_literal(raw)
    if literal is not None:
        conn.address = str(literal)
        raise Denied("IP literal; name a host")
    try:
        name = normalize_host(raw)
    except InvalidRequest as e:
        raise Denied(f"invalid host name: {e.message}") from None
    conn.host = name
    blocked = next((p for p in policy.deny if domain_matches(name, p)), None)
    if blocked is not None:
        raise Denied(f"{name} matches the deny pattern {blocked}")
    if policy.mode == "none":
        raise Denied("egress is disabled for this sandbox (mode none)")
    pattern = None
    if policy.mode != "open":
        pattern = next((p for p in policy.allow if domain_matches(name, p)), None)
    if policy.mode == "allowlist" and pattern is None:
        raise Denied(f"{name} is not on this sandbox's allowlist")
    if port not in policy.ports:
        allowed = ", ".join(str(p) for p in policy.ports) or "none"
        raise Denied(f"port {port} is not allowed (allowed ports: {allowed})")
    if policy.mode == "open":
        why = "open mode"
    elif pattern is not None:
        why = f"{name} matches {pattern}"
    elif ask is None:
        raise Denied(f"{name} is not on this sandbox's allowlist and nobody can be asked")
    else:
        why = await ask(policy, name, port, conn)
    mapped = policy.hosts.get(name)
    addresses = (ipaddress.ip_address(mapped),) if mapped else await resolve(name, port)
    for address in addresses:
        reason = denied_reason(address, extra_denied)
        if reason is not None:
            conn.address = str(address)
            raise Denied(f"{name} resolves to {address}, in {reason}")
    return Target(name, port, addresses, why, policy.credentials_for(name))
