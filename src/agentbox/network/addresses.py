"""The address ranges a sandbox may never connect to, in any egress mode.

Checked on every address a name resolves to (after resolution, before connect), so an
allowed name that resolves to loopback, RFC 1918 or the metadata service is refused
(DNS rebinding). IPv6 forms that carry an IPv4 address are checked by that address
(``::ffff:10.0.0.1`` is 10.0.0.1); NAT64, 6to4 and Teredo prefixes are refused outright,
since the embedded address would be routed by a gateway we cannot see.

Deliberately *not* denied: the documentation ranges 192.0.2.0/24, 198.51.100.0/24,
203.0.113.0/24 and 2001:db8::/32. They are never routed on the internet, so allowing them
opens nothing internal, and the tests use them as "the internet" inside a network
namespace of their own.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# (range, why) - most specific first where ranges nest, so the reason names the narrower.
DENIED_RANGES: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("0.0.0.0/8", "'this' network"),
        ("10.0.0.0/8", "private network, RFC 1918"),
        ("100.64.0.0/10", "carrier-grade NAT"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local / cloud metadata"),
        ("172.16.0.0/12", "private network, RFC 1918"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.168.0.0/16", "private network, RFC 1918"),
        ("198.18.0.0/15", "benchmarking"),
        ("224.0.0.0/4", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("240.0.0.0/4", "reserved"),
        ("::/128", "unspecified"),
        ("::1/128", "loopback"),
        ("fd00:ec2::254/128", "cloud metadata"),
        ("fc00::/7", "unique local"),
        ("fe80::/10", "link-local"),
        ("ff00::/8", "multicast"),
        ("64:ff9b::/96", "NAT64, may embed an internal IPv4 address"),
        ("64:ff9b:1::/48", "local NAT64, may embed an internal IPv4 address"),
        ("2002::/16", "6to4, may embed an internal IPv4 address"),
        ("2001::/32", "Teredo, may embed an internal IPv4 address"),
        ("::ffff:0:0:0/96", "IPv4-translated, may embed an internal IPv4 address"),
    )
)

# The same ranges without the ones nested in another (for firewall sets, which reject
# overlapping intervals).
DENIED_NETWORKS: tuple[IPNetwork, ...] = tuple(
    net
    for net, _ in DENIED_RANGES
    if not any(
        other != net and other.version == net.version and net.subnet_of(other)  # type: ignore[arg-type]
        for other, _ in DENIED_RANGES
    )
)

_COMPAT_V4 = ipaddress.IPv6Network("::/96")


def embedded_ipv4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped (``::ffff:a.b.c.d``) or -compatible (``::a.b.c.d``)
    IPv6 address stands for; None otherwise (``::`` and ``::1`` are IPv6's own)."""
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    if addr in _COMPAT_V4 and int(addr) > 1:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def denied_reason(
    addr: IPAddress | str, extra: Iterable[IPNetwork | IPAddress | str] = ()
) -> str | None:
    """None when ``addr`` may be connected to, else a short reason naming the range.

    ``extra`` adds ranges of the caller's own (the host's addresses, the gateway's).
    Raises ValueError when ``addr`` is not an IP address.
    """
    ip = ipaddress.ip_address(addr) if isinstance(addr, str) else addr
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id:
        ip = ipaddress.IPv6Address(ip.packed)  # a zone does not change what it reaches
    candidates: list[IPAddress] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        v4 = embedded_ipv4(ip)
        if v4 is not None:
            candidates.append(v4)
    for candidate in candidates:
        version, value = candidate.version, int(candidate)
        for net_version, first, last, label in _ranges(tuple(extra)):
            if net_version == version and first <= value <= last:
                via = "" if candidate is ip else f" (embedded in {ip})"
                return f"{label}{via}"
    return None


@functools.lru_cache(maxsize=16)
def _ranges(
    extra: tuple[IPNetwork | IPAddress | str, ...],
) -> tuple[tuple[int, int, int, str], ...]:
    """The deny ranges plus ``extra`` as integer intervals: this runs for every address of
    every connection, and ``address in network`` costs microseconds each."""
    extras = [(ipaddress.ip_network(n), "host or gateway address") for n in extra]
    return tuple(
        (net.version, int(net.network_address), int(net.broadcast_address), f"{net} ({why})")
        for net, why in (*DENIED_RANGES, *extras)
    )
