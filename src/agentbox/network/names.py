"""Host names as the egress policy sees them: one canonical form, and IP literals told apart.

Policy matching is only as good as the name it compares, so every name goes through
:func:`normalize_host` first and anything ambiguous is refused instead of "cleaned up":

* control characters (NUL!), whitespace and invisible format characters are rejected, not
  stripped: ``evil.test\\x00.allowed.test`` must never turn into something that matches;
* one trailing dot (the DNS root) is dropped; a second one, or any empty label, is an error;
* ASCII labels must be LDH (letters, digits, inner hyphens). Hyphens in positions 3-4 are
  accepted in ASCII labels (``r3---sn-abc.googlevideo.com`` is a real host) except for
  ``xn--`` labels, which must be valid punycode in canonical form;
* Unicode is mapped with UTS-46 (case folding, full-width forms, ideographic dots) and
  converted to A-labels with the ``idna`` package; anything IDNA 2008 refuses is refused;
* a name whose last label is numeric (``1.2.3.4``, ``foo.0x7f``) is never a host name:
  resolvers would read it as an address, so it is refused here and
  :func:`parse_ip_literal` decides what address it names.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata

import idna

from agentbox.errors import InvalidRequest

MAX_NAME = 253
MAX_LABEL = 63
_LDH = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
# WHATWG URL: a last label of digits, or 0x-hex, makes the host an IPv4 address.
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")
# Unicode categories never allowed anywhere in a name: controls, format (invisible)
# characters, surrogates, private use, unassigned, and every kind of space.
_FORBIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _show(raw: str) -> str:
    """``raw`` quoted with escapes, short, safe to put in a message or a log line."""
    shown = ascii(raw[:100])
    return shown if len(raw) <= 100 else shown + "..."


def normalize_host(raw: str) -> str:
    """The canonical (lower-case, A-label, no trailing dot) form of the host name ``raw``.

    Raises :class:`InvalidRequest` for anything that is not a plain host name, including
    IP literals (see :func:`parse_ip_literal`).
    """
    if not isinstance(raw, str):
        raise InvalidRequest(f"host name must be a string, not {type(raw).__name__}")
    if not raw:
        raise InvalidRequest("host name is empty: name a host such as example.com")
    for ch in raw:
        if unicodedata.category(ch) in _FORBIDDEN_CATEGORIES:
            raise InvalidRequest(
                f"host name {_show(raw)} contains a control, format or space character "
                f"(U+{ord(ch):04X}); use a plain host name"
            )
    if len(raw) > 4 * MAX_NAME:
        raise InvalidRequest(f"host name {_show(raw)} is too long (max {MAX_NAME} characters)")
    if raw.isascii():
        mapped = raw.lower()
    else:
        try:
            mapped = idna.uts46_remap(raw, std3_rules=True, transitional=False)
        except idna.IDNAError as e:
            raise InvalidRequest(f"host name {_show(raw)} is not a valid IDNA name: {e}") from e
    if mapped.endswith("."):
        mapped = mapped[:-1]  # the DNS root, once; a second dot leaves an empty label
    labels = mapped.split(".")
    out = [_label(label, raw) for label in labels]
    name = ".".join(out)
    if len(name) > MAX_NAME:
        raise InvalidRequest(f"host name {_show(raw)} is longer than {MAX_NAME} characters")
    if _NUMERIC_LABEL.match(out[-1]):
        raise InvalidRequest(
            f"{_show(raw)} is an IP address or ends in a number, not a host name; "
            "name a host (its last label must not be numeric)"
        )
    return name


def _label(label: str, raw: str) -> str:
    if not label:
        raise InvalidRequest(
            f"host name {_show(raw)} has an empty label (a leading dot or '..'); "
            "use a name like example.com"
        )
    if not label.isascii():
        try:
            label = idna.alabel(label).decode("ascii")
        except (idna.IDNAError, UnicodeError) as e:
            raise InvalidRequest(
                f"host name {_show(raw)} has an invalid IDNA label {_show(label)}: {e}"
            ) from e
    if len(label) > MAX_LABEL:
        raise InvalidRequest(
            f"host name {_show(raw)} has a label longer than {MAX_LABEL} characters"
        )
    if not _LDH.match(label):
        raise InvalidRequest(
            f"host name {_show(raw)} has an invalid label {_show(label)}: only letters, "
            "digits and inner hyphens are allowed"
        )
    if label.startswith("xn--"):
        _check_punycode(label, raw)
    return label


def _check_punycode(label: str, raw: str) -> None:
    """An A-label must decode to a valid U-label and re-encode to itself."""
    try:
        ulabel = idna.ulabel(label)
        canonical = idna.alabel(ulabel).decode("ascii")
    except (idna.IDNAError, UnicodeError) as e:
        raise InvalidRequest(
            f"host name {_show(raw)} has an invalid punycode label {_show(label)}: {e}"
        ) from e
    if canonical != label:
        raise InvalidRequest(
            f"host name {_show(raw)} has a non-canonical punycode label {_show(label)} "
            f"(expected {canonical})"
        )


def parse_ip_literal(raw: str) -> IPAddress | None:
    """The address ``raw`` names if it is an IP literal in any form a resolver accepts.

    Recognises dotted quads, bare or bracketed IPv6 (with or without a zone), and the
    ``inet_aton`` forms: 1 to 4 parts, each decimal, octal (leading 0) or hex (0x), the
    last part filling the remaining bytes (``127.1``, ``2130706433``, ``0x7f.0.0.1``,
    ``0177.0.0.1``). A trailing dot is ignored, as resolvers do. None for anything else.
    """
    if not isinstance(raw, str) or not raw or not raw.isascii():
        return None
    text = raw
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
        return _ipv6(text)
    if ":" in text:
        return _ipv6(text)
    if text.endswith("."):
        text = text[:-1]
    return _inet_aton(text)


def _ipv6(text: str) -> ipaddress.IPv6Address | None:
    try:
        return ipaddress.IPv6Address(text)
    except ValueError:
        return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        value = _aton_part(part)
        if value is None:
            return None
        values.append(value)
    *head, last = values
    if any(v > 0xFF for v in head) or last >= 1 << (8 * (4 - len(head))):
        return None
    number = last
    for i, v in enumerate(head):
        number |= v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _aton_part(part: str) -> int | None:
    lower = part.lower()
    if lower.startswith("0x"):
        digits, base = lower[2:], 16
        if not digits:
            return 0  # glibc and WHATWG both read a bare "0x" as zero
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
    else:
        digits, base = part, 10
    allowed = "0123456789abcdef"[:base]
    if not digits or any(c not in allowed for c in digits):
        return None
    return int(digits, base)


def normalize_pattern(pattern: str) -> str:
    """A domain pattern in canonical form: a host name, or ``*.`` followed by one."""
    if not isinstance(pattern, str):
        raise InvalidRequest(f"domain pattern must be a string, not {type(pattern).__name__}")
    if pattern.startswith("*."):
        return "*." + normalize_host(pattern[2:])
    if "*" in pattern:
        raise InvalidRequest(
            f"domain pattern {_show(pattern)}: a wildcard is only allowed as a leading '*.' "
            "(e.g. *.example.com)"
        )
    return normalize_host(pattern)


def domain_matches(name: str, pattern: str) -> bool:
    """Whether host ``name`` matches ``pattern`` (both normalised here first).

    ``*.example.com`` matches every name strictly below example.com, not example.com
    itself; any other pattern matches exactly. Raises :class:`InvalidRequest` when either
    is not a valid name or pattern.
    """
    host = normalize_host(name)
    canonical = normalize_pattern(pattern)
    if canonical.startswith("*."):
        # Compare on a label boundary: "evilexample.com" is not below "example.com".
        return host.endswith(canonical[1:])
    return host == canonical
