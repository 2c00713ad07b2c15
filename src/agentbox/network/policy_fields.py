"""The fields of a network policy, checked and put in canonical form in one place.

Every shape a network spec takes runs these: ``specs.NetworkSpec`` (the SDK's argument,
the REST body, the gateway config's default, what a record stores) and
``decision.EgressPolicy`` (what the egress daemon applies). So a spec accepted at create
is one the daemon can apply: it never meets a name it cannot parse.

Each error is an :class:`InvalidRequest` whose details name the ``field`` (a path inside
the network spec: ``allow.1``, ``hosts.a.test``, ``ports.0``) and the ``value`` refused.

Egress modes are declared in :mod:`agentbox.network.modes`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, cast

from agentbox.errors import InvalidRequest
from agentbox.network.modes import EGRESS_MODES, EgressMode
from agentbox.network.names import normalize_host, normalize_pattern, parse_ip_literal

DEFAULT_PORTS = (80, 443)


def _refused(e: InvalidRequest, field: str, value: object) -> InvalidRequest:
    return InvalidRequest(f"{field}: {e.reason}", field=field, value=value)


def mode(value: object) -> EgressMode:
    if not isinstance(value, str) or value not in EGRESS_MODES:
        raise InvalidRequest(
            f"mode: egress mode must be one of {', '.join(EGRESS_MODES)}, not {value!r}",
            field="mode",
            value=value,
        )
    return cast(EgressMode, value)


def patterns(values: Iterable[object], field: str) -> tuple[str, ...]:
    """Domain patterns (``allow``, ``deny``): host names or ``*.`` + a host name."""
    out = []
    for i, value in enumerate(_sequence(values, field)):
        try:
            out.append(normalize_pattern(value))  # type: ignore[arg-type]  # checked there
        except InvalidRequest as e:
            raise _refused(e, f"{field}.{i}", value) from None
    return tuple(out)


def ports(values: Iterable[object]) -> tuple[int, ...]:
    """TCP ports 1-65535, as integers (not bools, not strings)."""
    out = []
    for i, port in enumerate(_sequence(values, "ports")):
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise InvalidRequest(
                f"ports.{i}: egress port {port!r} is not a TCP port (an integer 1-65535)",
                field=f"ports.{i}",
                value=port,
            )
        out.append(port)
    return tuple(out)


def host_map(values: object) -> dict[str, str]:
    """``hosts``: host name -> the IP address the proxy uses instead of DNS. Names are
    normalised (no wildcard, no IP literal; two spellings of one name are refused), an
    address is a plain IPv4 or IPv6 address without a zone. An address in a denied range
    is accepted here and refused on every connection (the proxy checks every address)."""
    if not isinstance(values, Mapping):
        raise InvalidRequest(
            "hosts: expected an object mapping host names to IP addresses",
            field="hosts",
            value=shown(values),
        )
    out: dict[str, str] = {}
    for name, address in values.items():
        field = f"hosts.{name}"
        if isinstance(name, str) and parse_ip_literal(name) is not None:
            raise InvalidRequest(
                f"{field}: {name!r} is an IP address; the hosts map names host names",
                field=field,
                value=name,
            )
        try:
            host = normalize_host(name)
        except InvalidRequest as e:
            raise _refused(e, field, name) from None
        if host in out:
            raise InvalidRequest(
                f"{field}: {host} is in the hosts map twice (names are compared normalised)",
                field=field,
                value=name,
            )
        out[host] = _address(address, field)
    return out


def _address(value: object, field: str) -> str:
    try:
        address = ipaddress.ip_address(value)  # type: ignore[arg-type]  # refused below
        if not isinstance(value, str):
            raise ValueError
    except ValueError:
        raise InvalidRequest(
            f"{field}: {shown(value)!r} is not an IP address (e.g. 203.0.113.10 or 2001:db8::1)",
            field=field,
            value=shown(value),
        ) from None
    if isinstance(address, ipaddress.IPv6Address) and address.scope_id:
        raise InvalidRequest(
            f"{field}: {value!r} has a zone (%{address.scope_id}); give the address alone",
            field=field,
            value=value,
        )
    return str(address)


def _sequence(values: Iterable[object], field: str) -> list[object]:
    if isinstance(values, str | bytes | Mapping) or not isinstance(values, Iterable):
        raise InvalidRequest(
            f"{field}: expected a list, not {type(values).__name__}",
            field=field,
            value=shown(values),
        )
    return list(values)


def shown(value: Any) -> Any:
    """``value`` as JSON can carry it in an error's details."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return ascii(value)[:200]
