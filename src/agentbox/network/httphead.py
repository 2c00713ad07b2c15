"""HTTP/1.x message heads for the egress proxy: strict parsing, authority splitting, and
the rewrites a forward proxy owes (origin-form, no hop-by-hop headers, one request per
connection).

Strict because the proxy decides on what it parses: a head another parser could read
differently (NUL, bare CR or LF, folded lines, two Host or Content-Length headers, both
Content-Length and Transfer-Encoding) is refused with :class:`InvalidRequest`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentbox.errors import InvalidRequest

MAX_HEAD = 64 * 1024
MAX_HEADERS = 256
_TCHARS = r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_REQUEST_LINE = re.compile(rf"^({_TCHARS}) ([\x21-\x7e]+) (HTTP/1\.[01])$")
_STATUS_LINE = re.compile(r"^(HTTP/1\.[01]) ([1-9][0-9]{2})(?: ([\t\x20-\x7e\x80-\xff]*))?$")
_HEADER = re.compile(rf"^({_TCHARS}):[ \t]*([\t\x20-\x7e\x80-\xff]*?)[ \t]*$")
_PORT = re.compile(r"^[0-9]{1,5}$")
_CHUNK_SIZE = re.compile(rb"^([0-9A-Fa-f]{1,16})[ \t]*(?:;[\t\x20-\x7e\x80-\xff]*)?$")
# Hop-by-hop headers (RFC 9110 7.6.1 and the proxy ones) never cross the proxy.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
# Never dropped because Connection lists them: they route and frame the message.
_END_TO_END = frozenset({"host", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class Head:
    """A parsed head: the three parts of its first line, and its header fields in order."""

    first: tuple[str, str, str]  # (method, target, version) or (version, status, reason)
    headers: tuple[tuple[str, str], ...]

    def get_all(self, name: str) -> list[str]:
        key = name.lower()
        return [v for k, v in self.headers if k.lower() == key]


def head_end(buf: bytes | bytearray, start: int = 0) -> int:
    """The index just past the blank line ending a head in ``buf``, or -1."""
    at = buf.find(b"\r\n\r\n", max(0, start - 3))
    return -1 if at < 0 else at + 4


def _lines(raw: bytes, what: str) -> list[str]:
    if len(raw) > MAX_HEAD:
        raise InvalidRequest(f"{what} head is larger than {MAX_HEAD // 1024} KiB")
    if not raw.endswith(b"\r\n\r\n"):
        raise InvalidRequest(f"{what} head does not end with a blank line")
    if b"\x00" in raw:
        raise InvalidRequest(f"{what} head contains a NUL byte")
    body = raw[:-4]
    if b"\r" in body.replace(b"\r\n", b"") or b"\n" in body.replace(b"\r\n", b""):
        raise InvalidRequest(f"{what} head has a bare CR or LF; lines must end with CRLF")
    return body.decode("latin-1").split("\r\n")


def _headers(lines: list[str], what: str) -> tuple[tuple[str, str], ...]:
    if len(lines) > MAX_HEADERS:
        raise InvalidRequest(f"{what} has more than {MAX_HEADERS} header fields")
    out = []
    for line in lines:
        m = _HEADER.match(line)
        if not m:
            raise InvalidRequest(f"{what} has a malformed header line {line[:80]!a}")
        out.append((m.group(1), m.group(2)))
    return tuple(out)


def parse_request(raw: bytes) -> Head:
    """The request head in ``raw`` (which ends with its blank line)."""
    lines = _lines(raw, "request")
    m = _REQUEST_LINE.match(lines[0])
    if not m:
        raise InvalidRequest(
            f"malformed request line {lines[0][:120]!a}: expected 'METHOD target HTTP/1.1'"
        )
    return Head((m.group(1), m.group(2), m.group(3)), _headers(lines[1:], "request"))


def parse_response(raw: bytes) -> Head:
    """The response head in ``raw`` (which ends with its blank line)."""
    lines = _lines(raw, "response")
    m = _STATUS_LINE.match(lines[0])
    if not m:
        raise InvalidRequest(f"malformed status line {lines[0][:120]!a}")
    return Head((m.group(1), m.group(2), m.group(3) or ""), _headers(lines[1:], "response"))


def split_authority(value: str, default_port: int | None) -> tuple[str, int]:
    """``host[:port]`` (host may be ``[v6]``) -> (host, port). The host is not checked."""
    if value.startswith("["):
        close = value.find("]")
        if close < 0:
            raise InvalidRequest(f"unterminated IPv6 literal in {value[:100]!a}")
        host, rest = value[: close + 1], value[close + 1 :]
        if rest and not rest.startswith(":"):
            raise InvalidRequest(f"junk after the IPv6 literal in {value[:100]!a}")
        port_text = rest[1:] if rest else None
    elif value.count(":") > 1:
        host, port_text = value, None  # a bare IPv6 literal; refused later as one
    elif ":" in value:
        host, port_text = value.split(":")
    else:
        host, port_text = value, None
    if port_text is None:
        if default_port is None:
            raise InvalidRequest(f"{value[:100]!a} has no port: use host:port")
        return host, default_port
    if not _PORT.match(port_text) or not 0 < int(port_text) < 65536:
        raise InvalidRequest(f"bad port in {value[:100]!a}")
    return host, int(port_text)


def split_absolute(target: str) -> tuple[str, int, str]:
    """``http://host[:port]/path?q`` -> (host, port, origin-form ``/path?q``)."""
    scheme, sep, rest = target.partition("://")
    if not sep or scheme.lower() != "http":
        if scheme.lower() == "https" and sep:
            raise InvalidRequest("https:// URLs go through the proxy with CONNECT")
        raise InvalidRequest(
            f"request target {target[:100]!a} is not an absolute http:// URL "
            "(a proxy needs the full URL, or CONNECT host:port)"
        )
    cut = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, path = rest[:cut], rest[cut:]
    if "@" in authority:
        raise InvalidRequest("user info in a proxied URL is refused (user@host)")
    if not authority:
        raise InvalidRequest(f"URL {target[:100]!a} has no host")
    host, port = split_authority(authority, 80)
    path = path.partition("#")[0]
    if not path.startswith("/"):
        path = "/" + path
    return host, port, path


def request_body(head: Head) -> int | None:
    """The request body's length from its head: bytes, or None for chunked."""
    encodings = head.get_all("transfer-encoding")
    lengths = head.get_all("content-length")
    if encodings:
        if lengths:
            raise InvalidRequest("both Content-Length and Transfer-Encoding: refused")
        if len(encodings) != 1 or encodings[0].strip().lower() != "chunked":
            raise InvalidRequest("only 'Transfer-Encoding: chunked' is supported")
        return None
    if not lengths:
        return 0
    if len(lengths) != 1 or not lengths[0].isdigit() or len(lengths[0]) > 18:
        raise InvalidRequest("bad or repeated Content-Length")
    return int(lengths[0])


def _forwardable(head: Head) -> list[tuple[str, str]]:
    listed = {
        token.strip().lower() for value in head.get_all("connection") for token in value.split(",")
    }
    drop = HOP_BY_HOP | (listed - _END_TO_END)
    return [(k, v) for k, v in head.headers if k.lower() not in drop]


def _render(first: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [first, *(f"{k}: {v}" for k, v in headers), "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def rewrite_request(
    head: Head, origin: str, authority: str, replace: Sequence[tuple[str, str]] = ()
) -> bytes:
    """The head to send upstream: origin-form, hop-by-hop headers gone, Host present,
    ``Connection: close`` (one request per upstream connection). Each header named in
    ``replace`` loses whatever value the client sent and gets the one given."""
    method, _, version = head.first
    headers = _forwardable(head)
    if not head.get_all("host"):
        headers.insert(0, ("Host", authority))
    if replace:
        names = {name.lower() for name, _ in replace}
        headers = [(k, v) for k, v in headers if k.lower() not in names] + list(replace)
    return _render(f"{method} {origin} {version}", headers)


def rewrite_response(head: Head) -> bytes:
    """The head to send the client: hop-by-hop headers gone, ``Connection: close``."""
    version, status, reason = head.first
    return _render(f"{version} {status} {reason}", _forwardable(head))


class ChunkedBody:
    """Finds where a chunked body ends, so exactly one request is forwarded."""

    MAX_LINE = 4096

    def __init__(self) -> None:
        self.done = False
        self._state = "size"  # size | data | crlf | trailer
        self._remaining = 0
        self._line = b""

    def feed(self, data: bytes) -> int:
        """How many leading bytes of ``data`` belong to the body (all, until it ends)."""
        i = 0
        while i < len(data) and not self.done:
            if self._state == "data":
                take = min(self._remaining, len(data) - i)
                i += take
                self._remaining -= take
                if not self._remaining:
                    self._state = "crlf"
                continue
            nl = data.find(b"\n", i)
            end = len(data) if nl < 0 else nl + 1
            self._line += data[i:end]
            i = end
            if len(self._line) > self.MAX_LINE:
                raise InvalidRequest("chunked body has an overlong line")
            if nl >= 0:
                self._on_line(self._line)
                self._line = b""
        return i

    def _on_line(self, line: bytes) -> None:
        if not line.endswith(b"\r\n"):
            raise InvalidRequest("chunked body has a line without CRLF")
        content = line[:-2]
        if self._state == "crlf":
            if content:
                raise InvalidRequest("chunk data is longer than its size")
            self._state = "size"
        elif self._state == "size":
            m = _CHUNK_SIZE.match(content)
            if not m:
                raise InvalidRequest("chunked body has a malformed chunk size")
            self._remaining = int(m.group(1), 16)
            self._state = "data" if self._remaining else "trailer"
        elif not content:  # trailer section ends with an empty line
            self.done = True
