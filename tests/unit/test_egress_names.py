"""Host-name normalisation, IP-literal detection, domain patterns and denied addresses."""

from __future__ import annotations

import ipaddress

import pytest

from agentbox.errors import InvalidRequest
from agentbox.network.addresses import DENIED_NETWORKS, denied_reason, embedded_ipv4
from agentbox.network.names import (
    domain_matches,
    normalize_host,
    normalize_pattern,
    parse_ip_literal,
)

# -- normalize_host -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("example.com", "example.com"),
        ("ExAmPlE.COM", "example.com"),
        ("example.com.", "example.com"),
        ("ALLOWED.test.", "allowed.test"),
        ("Bücher.example", "xn--bcher-kva.example"),
        ("BÜCHER.example", "xn--bcher-kva.example"),  # UTS-46 case mapping
        ("faß.de", "xn--fa-hia.de"),  # non-transitional: ß is kept
        ("\uff21\uff22\uff23.com", "abc.com"),  # full-width forms are mapped
        ("ex\u3002com", "ex.com"),  # ideographic full stop is a dot
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("xn--e1afmkfd.com", "xn--e1afmkfd.com"),
        ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
        ("r3---sn-abc.googlevideo.com", "r3---sn-abc.googlevideo.com"),
        ("a-b.c-d.e", "a-b.c-d.e"),
        ("localhost", "localhost"),
        ("a" * 63 + ".com", "a" * 63 + ".com"),
        (".".join(["a" * 63] * 3 + ["b" * 61]), ".".join(["a" * 63] * 3 + ["b" * 61])),
        ("1password.com", "1password.com"),
    ],
)
def test_normalize_host_accepts(raw: str, expected: str) -> None:
    assert normalize_host(raw) == expected


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ("", "empty"),
        (".", "empty label"),
        ("example.com..", "empty label"),
        ("..example.com", "empty label"),
        ("a..b", "empty label"),
        (".example.com", "empty label"),
        ("evil.test\x00.allowed.test", "control"),
        ("allowed.test\x00", "control"),
        ("exa mple.com", "space"),
        (" example.com", "space"),
        ("example.com\t", "control"),
        ("example.com\n", "control"),
        ("exa\u00admple.com", "format"),  # soft hyphen: invisible, refused not dropped
        ("exa\u200bmple.com", "format"),  # zero-width space
        ("exa\u3000mple.com", "space"),  # ideographic space
        ("a" * 64 + ".com", "longer than 63"),
        (".".join(["a" * 63] * 4), "longer than 253"),
        ("-example.com", "invalid label"),
        ("example-.com", "invalid label"),
        ("exa_mple.com", "invalid label"),
        ("exa*mple.com", "invalid label"),
        ("example.com:443", "invalid label"),
        ("user@example.com", "invalid label"),
        ("exam/ple.com", "invalid label"),
        ("exam\\ple.com", "invalid label"),
        ("xn--a.com", "punycode"),  # decodes to U+0080
        ("xn--abc.com", "punycode"),
        ("xn--ls8h.com", "punycode"),  # an emoji: not IDNA 2008
        ("xn--1ch.com", "punycode"),  # a symbol
        ("xn--abc-.com", "invalid label"),
        ("ab\u200d.com", "format"),
        ("\u0663\u0661a.com", "IDNA"),  # mixed Arabic-Indic digits and Latin: bidi rule
        ("127.0.0.1", "IP address"),
        ("2130706433", "IP address"),
        ("foo.0x7f", "IP address"),
        ("foo.123", "IP address"),
        ("::1", "invalid label"),
        ("[::1]", "invalid label"),
    ],
)
def test_normalize_host_rejects(raw: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        normalize_host(raw)
    assert words in err.value.message
    assert "\x00" not in err.value.message  # messages escape what they quote


def test_normalize_host_rejects_non_strings() -> None:
    with pytest.raises(InvalidRequest):
        normalize_host(b"example.com")  # type: ignore[arg-type]


# -- parse_ip_literal -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0X7F.0.0.1", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("10.1.515", "10.1.2.3"),  # last part fills 16 bits
        ("169.254.43518", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("0x", "0.0.0.0"),
        ("203.0.113.5", "203.0.113.5"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("::ffff:127.0.0.1", "::ffff:7f00:1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
        ("2001:db8::1", "2001:db8::1"),
    ],
)
def test_parse_ip_literal_forms(raw: str, expected: str) -> None:
    assert parse_ip_literal(raw) == ipaddress.ip_address(expected)


@pytest.mark.parametrize(
    "raw",
    [
        "example.com",
        "allowed.test",
        "1password.com",
        "256.0.0.1",  # out of range: not an address (and normalize_host refuses it)
        "08.0.0.1",  # 8 is not an octal digit
        "0x1g.0.0.1",
        "1.2.3.4.5",
        "4294967296",
        "127.0.0.1 ",
        "127.0.0.1\x00",
        "[::1",
        "[example.com]",
        ":::1",
        "",
        "١٢٧.0.0.1",  # non-ASCII digits are never an address
    ],
)
def test_parse_ip_literal_rejects_names(raw: str) -> None:
    assert parse_ip_literal(raw) is None


def test_every_numeric_form_is_refused_as_a_name() -> None:
    # Whatever inet_aton might accept ends in a number, and names never do.
    for raw in ("256.0.0.1", "08.0.0.1", "4294967296", "1.2.3.4.5"):
        with pytest.raises(InvalidRequest, match="IP address"):
            normalize_host(raw)


# -- domain_matches -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pattern", "expected"),
    [
        ("allowed.test", "allowed.test", True),
        ("ALLOWED.test.", "allowed.test", True),
        ("allowed.test", "ALLOWED.TEST.", True),
        ("www.allowed.test", "allowed.test", False),
        ("allowed.test.evil.test", "allowed.test", False),
        ("evilallowed.test", "allowed.test", False),
        ("a.wild.test", "*.wild.test", True),
        ("a.b.wild.test", "*.wild.test", True),
        ("A.WILD.TEST.", "*.wild.test", True),
        ("wild.test", "*.wild.test", False),
        ("evilwild.test", "*.wild.test", False),
        ("wild.test.evil.test", "*.wild.test", False),
        ("xn--bcher-kva.wild.test", "*.wild.test", True),
        ("bücher.wild.test", "*.wild.test", True),
        ("bücher.test", "xn--bcher-kva.test", True),
        ("xn--bcher-kva.test", "bücher.test", True),
    ],
)
def test_domain_matches(name: str, pattern: str, expected: bool) -> None:
    assert domain_matches(name, pattern) is expected


@pytest.mark.parametrize(
    ("name", "pattern"),
    [
        ("evil.test\x00.allowed.test", "allowed.test"),
        ("evil.test\x00.allowed.test", "*.allowed.test"),
        ("allowed.test", "*"),
        ("allowed.test", "a*.test"),
        ("allowed.test", "*.*.test"),
        ("allowed.test", "allowed.test.."),
    ],
)
def test_domain_matches_refuses_invalid_input(name: str, pattern: str) -> None:
    with pytest.raises(InvalidRequest):
        domain_matches(name, pattern)


def test_normalize_pattern() -> None:
    assert normalize_pattern("*.Bücher.TEST.") == "*.xn--bcher-kva.test"
    assert normalize_pattern("Allowed.Test") == "allowed.test"


# -- denied_reason --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "range_"),
    [
        ("0.0.0.0", "0.0.0.0/8"),
        ("0.1.2.3", "0.0.0.0/8"),
        ("10.0.0.1", "10.0.0.0/8"),
        ("10.255.255.255", "10.0.0.0/8"),
        ("100.64.0.1", "100.64.0.0/10"),
        ("100.127.255.254", "100.64.0.0/10"),
        ("127.0.0.1", "127.0.0.0/8"),
        ("127.255.0.9", "127.0.0.0/8"),
        ("169.254.169.254", "169.254.0.0/16 (link-local / cloud metadata)"),
        ("169.254.0.1", "169.254.0.0/16"),
        ("172.16.0.1", "172.16.0.0/12"),
        ("172.31.255.255", "172.16.0.0/12"),
        ("192.0.0.170", "192.0.0.0/24"),
        ("192.168.1.1", "192.168.0.0/16"),
        ("198.18.0.1", "198.18.0.0/15"),
        ("198.19.255.255", "198.18.0.0/15"),
        ("224.0.0.1", "224.0.0.0/4"),
        ("239.255.255.250", "224.0.0.0/4"),
        ("240.0.0.1", "240.0.0.0/4"),
        ("255.255.255.255", "255.255.255.255/32"),
        ("::", "::/128"),
        ("::1", "::1/128"),
        ("fc00::1", "fc00::/7"),
        ("fd12:3456::1", "fc00::/7"),
        ("fd00:ec2::254", "fd00:ec2::254/128 (cloud metadata)"),
        ("fe80::1", "fe80::/10"),
        ("fe80::1%eth0", "fe80::/10"),
        ("ff02::1", "ff00::/8"),
        ("64:ff9b::a00:1", "64:ff9b::/96"),
        ("64:ff9b::cb00:7105", "64:ff9b::/96"),  # even a public v4 behind NAT64
        ("64:ff9b:1::1", "64:ff9b:1::/48"),
        ("2002:a00:1::1", "2002::/16"),
        ("2002:cb00:7105::1", "2002::/16"),
        ("2001:0:4136:e378::1", "2001::/32"),
        ("::ffff:10.0.0.1", "10.0.0.0/8"),
        ("::ffff:127.0.0.1", "127.0.0.0/8"),
        ("::ffff:169.254.169.254", "169.254.0.0/16"),
        ("::10.0.0.1", "10.0.0.0/8"),  # IPv4-compatible
        ("::127.0.0.1", "127.0.0.0/8"),
        ("::ffff:0:10.0.0.1", "::ffff:0:0:0/96"),
    ],
)
def test_denied_reason_names_the_range(address: str, range_: str) -> None:
    reason = denied_reason(address)
    assert reason is not None and reason.startswith(range_)
    assert denied_reason(ipaddress.ip_address(address.split("%")[0])) is not None


@pytest.mark.parametrize(
    "address",
    [
        "203.0.113.5",  # TEST-NET-3: the tests' internet
        "198.51.100.10",  # TEST-NET-2
        "192.0.2.1",  # TEST-NET-1
        "8.8.8.8",
        "1.1.1.1",
        "100.63.255.255",  # just below CGNAT
        "100.128.0.0",  # just above
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.255",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
        "2606:4700:4700::1111",  # a public-looking v6
        "2a00:1450:4001::1",
        "2001:db8::1",  # documentation: allowed, like TEST-NET (see addresses.py)
        "::ffff:203.0.113.5",  # mapped public v4
        "::203.0.113.5",  # compatible public v4
    ],
)
def test_denied_reason_allows_public(address: str) -> None:
    assert denied_reason(address) is None


def test_denied_reason_extra_ranges() -> None:
    host = [ipaddress.ip_network("203.0.113.1/32"), ipaddress.ip_network("2001:db8::/64")]
    assert denied_reason("203.0.113.1", host) == "203.0.113.1/32 (host or gateway address)"
    assert denied_reason("::ffff:203.0.113.1", host) is not None
    assert denied_reason("2001:db8::5", host) is not None
    assert denied_reason("203.0.113.2", host) is None
    assert denied_reason("203.0.113.1", ["203.0.113.1"]) is not None


def test_denied_reason_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        denied_reason("example.com")


def test_embedded_ipv4() -> None:
    assert embedded_ipv4(ipaddress.IPv6Address("::ffff:1.2.3.4")) == ipaddress.IPv4Address(
        "1.2.3.4"
    )
    assert embedded_ipv4(ipaddress.IPv6Address("::1.2.3.4")) == ipaddress.IPv4Address("1.2.3.4")
    assert embedded_ipv4(ipaddress.IPv6Address("::1")) is None
    assert embedded_ipv4(ipaddress.IPv6Address("::")) is None
    assert embedded_ipv4(ipaddress.IPv6Address("2001:db8::1")) is None


def test_denied_networks_do_not_overlap() -> None:
    # Firewall sets refuse overlapping intervals; the nested ranges still get denied.
    for i, a in enumerate(DENIED_NETWORKS):
        for b in DENIED_NETWORKS[i + 1 :]:
            assert a.version != b.version or not a.overlaps(b), (a, b)  # type: ignore[arg-type]
    covered = [ipaddress.ip_address(a) for a in ("255.255.255.255", "fd00:ec2::254")]
    for address in covered:
        assert any(address in net for net in DENIED_NETWORKS if net.version == address.version)
    for net in ("203.0.113.0/24", "198.51.100.0/24"):
        assert ipaddress.ip_network(net) not in DENIED_NETWORKS
