"""Invalid network specs, each with the field and the value its refusal must name: shared
by the unit tests of the spec and the security tests of every create surface."""

from __future__ import annotations

from typing import Any

# (network spec, the field the error must name, the value it must name)
INVALID: list[tuple[dict[str, Any], str, Any]] = [
    ({"allow": ["ok.test", "bad..name"]}, "allow.1", "bad..name"),
    ({"allow": ["evil.test\x00.ok.test"]}, "allow.0", "evil.test\x00.ok.test"),
    ({"allow": ["xn--a.test"]}, "allow.0", "xn--a.test"),  # invalid punycode
    ({"allow": ["xn--bcher-kva.test", "xn--.test"]}, "allow.1", "xn--.test"),
    ({"allow": ["example.com.."]}, "allow.0", "example.com.."),  # a second trailing dot
    ({"allow": [".example.com"]}, "allow.0", ".example.com"),
    ({"allow": ["*.*.example.com"]}, "allow.0", "*.*.example.com"),
    ({"allow": ["a*.example.com"]}, "allow.0", "a*.example.com"),
    ({"allow": ["*example.com"]}, "allow.0", "*example.com"),
    ({"allow": ["*"]}, "allow.0", "*"),
    ({"allow": ["1.2.3.4"]}, "allow.0", "1.2.3.4"),
    ({"allow": ["127.1"]}, "allow.0", "127.1"),
    ({"allow": ["[::1]"]}, "allow.0", "[::1]"),
    ({"allow": ["exa mple.com"]}, "allow.0", "exa mple.com"),
    ({"allow": ["a\u200b.test"]}, "allow.0", "a\u200b.test"),  # zero-width space
    ({"allow": ["-bad.test"]}, "allow.0", "-bad.test"),
    ({"allow": ["a" * 64 + ".test"]}, "allow.0", "a" * 64 + ".test"),
    ({"allow": [""]}, "allow.0", ""),
    ({"deny": ["ads..test"]}, "deny.0", "ads..test"),
    ({"deny": ["*.ads.test", "a*.test"]}, "deny.1", "a*.test"),
    ({"hosts": {"a.test": "not-an-ip"}}, "hosts.a.test", "not-an-ip"),
    ({"hosts": {"a.test": "2130706433"}}, "hosts.a.test", "2130706433"),
    ({"hosts": {"a.test": "127.1"}}, "hosts.a.test", "127.1"),
    ({"hosts": {"a.test": "0177.0.0.1"}}, "hosts.a.test", "0177.0.0.1"),
    ({"hosts": {"a.test": "fe80::1%lo"}}, "hosts.a.test", "fe80::1%lo"),
    ({"hosts": {"a.test": ""}}, "hosts.a.test", ""),
    ({"hosts": {"a.test": 5}}, "hosts.a.test", 5),
    ({"hosts": {"bad..name": "203.0.113.1"}}, "hosts.bad..name", "bad..name"),
    ({"hosts": {"*.a.test": "203.0.113.1"}}, "hosts.*.a.test", "*.a.test"),
    ({"hosts": {"1.2.3.4": "203.0.113.1"}}, "hosts.1.2.3.4", "1.2.3.4"),
    ({"hosts": {"a\x00.test": "203.0.113.1"}}, "hosts.a\x00.test", "a\x00.test"),
    ({"hosts": {"A.test": "203.0.113.1", "a.test.": "203.0.113.2"}}, "hosts.a.test.", "a.test."),
    ({"ports": [0]}, "ports.0", 0),
    ({"ports": [443, 65536]}, "ports.1", 65536),
    ({"ports": [-1]}, "ports.0", -1),
    ({"ports": [True]}, "ports.0", True),
    ({"ports": ["80"]}, "ports.0", "80"),
    ({"mode": "sometimes"}, "mode", "sometimes"),
]
BAD_CREDENTIALS = [
    {"domain": "*.api.test", "secret_env": "TOKEN"},
    {"domain": "1.2.3.4", "secret_env": "TOKEN"},
    {"domain": "api..test", "secret_env": "TOKEN"},
    {"domain": "api.test", "secret_env": "TOKEN", "header": "Host"},
    {"domain": "api.test", "secret_env": "TOKEN", "format": "Bearer"},
    {"domain": "api.test", "secret_env": "A-B"},
]
