"""Just enough TLS to read the server name a client asks for (SNI), and nothing more.

Strict on purpose: the proxy decides by this name, so anything a real TLS stack might
read differently (duplicate extensions, two host names, trailing bytes, a ClientHello
split over records) is refused rather than guessed at.
"""

from __future__ import annotations

RECORD_HEADER = 5
MAX_RECORD = 16384 + 2048  # TLSPlaintext limit plus slack, as TLS 1.2 allows
_HANDSHAKE = 22
_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0
_HOST_NAME = 0


class NotClientHello(ValueError):
    """The bytes claim to be a TLS ClientHello but are not a well-formed one."""


def looks_like_tls(data: bytes) -> bool:
    """Whether ``data`` starts like a TLS handshake record (content type 22).

    Decided on the first byte alone, on purpose: anything that starts like a handshake
    must then parse as a proper ClientHello, so a near-miss cannot slip through unchecked.
    """
    return data[:1] == bytes([_HANDSHAKE])


def record_size(data: bytes | bytearray) -> int | None:
    """The size of the whole first record once its header is in ``data``, else None."""
    if len(data) < RECORD_HEADER:
        return None
    return RECORD_HEADER + int.from_bytes(data[3:5], "big")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise NotClientHello("truncated ClientHello")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def num(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def vector(self, length_bytes: int) -> _Reader:
        return _Reader(self.take(self.num(length_bytes)))

    def done(self) -> bool:
        return self.pos == len(self.data)


def server_name(data: bytes) -> str | None:
    """The SNI host name in the ClientHello that starts ``data`` (None when it has none).

    ``data`` must hold at least the whole first record; bytes after it are ignored (they
    belong to later records). Raises :class:`NotClientHello` when malformed.
    """
    size = record_size(data)
    if size is None or len(data) < size:
        raise NotClientHello("incomplete TLS record")
    if data[0] != _HANDSHAKE or data[1] != 3:
        raise NotClientHello("not a TLS handshake record")
    if size - RECORD_HEADER > MAX_RECORD:
        raise NotClientHello("TLS record too long")
    record = _Reader(data[RECORD_HEADER:size])
    if record.num(1) != _CLIENT_HELLO:
        raise NotClientHello("first handshake message is not a ClientHello")
    body = record.vector(3)
    if not record.done():
        raise NotClientHello("extra data after the ClientHello in its record")
    body.take(2 + 32)  # legacy_version, random
    if len(body.vector(1).data) > 32:
        raise NotClientHello("session id longer than 32 bytes")
    suites = body.vector(2).data
    if not suites or len(suites) % 2:
        raise NotClientHello("bad cipher suite list")
    if not body.vector(1).data:
        raise NotClientHello("no compression methods")
    if body.done():
        return None  # no extensions at all
    extensions = body.vector(2)
    if not body.done():
        raise NotClientHello("extra data after the extensions")
    seen: set[int] = set()
    name: str | None = None
    while not extensions.done():
        kind = extensions.num(2)
        payload = extensions.vector(2)
        if kind in seen:
            raise NotClientHello(f"duplicate TLS extension {kind}")
        seen.add(kind)
        if kind == _EXT_SERVER_NAME:
            name = _host_name(payload)
    return name


def _host_name(ext: _Reader) -> str:
    names = ext.vector(2)
    if not ext.done():
        raise NotClientHello("extra data after the server_name list")
    found: str | None = None
    while not names.done():
        kind = names.num(1)
        value = names.vector(2).data
        if kind != _HOST_NAME:
            raise NotClientHello(f"unknown server_name type {kind}")
        if found is not None:
            raise NotClientHello("more than one host name in server_name")
        try:
            found = value.decode("ascii")
        except UnicodeDecodeError as e:
            raise NotClientHello("server_name is not ASCII") from e
    if not found:
        raise NotClientHello("empty server_name")
    return found
