"""Reading what a client sends first, before deciding: a request head, a TLS ClientHello.

Every read here is bounded in size and time, and every failure is a :class:`Denied` with
the HTTP status to answer (0 when the client does not speak HTTP to us).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from agentbox.errors import InvalidRequest
from agentbox.network import clienthello, httphead, relay
from agentbox.network.decision import Denied, printable
from agentbox.network.names import normalize_host, parse_ip_literal


@contextlib.contextmanager
def bad_request(prefix: str = "") -> Iterator[None]:
    """Turn a parse error of the client's request into a 400 answer."""
    try:
        yield
    except InvalidRequest as e:
        raise Denied(prefix + e.message, 400) from None


async def read_head(reader: asyncio.StreamReader, initial: bytes) -> tuple[bytes, bytes]:
    """(head with its blank line, bytes read past it). InvalidRequest if none comes."""
    buf = bytearray(initial)
    scanned = 0
    while True:
        end = httphead.head_end(buf, scanned)
        if end > httphead.MAX_HEAD or (end < 0 and len(buf) > httphead.MAX_HEAD):
            raise InvalidRequest(f"head larger than {httphead.MAX_HEAD // 1024} KiB")
        if end > 0:
            return bytes(buf[:end]), bytes(buf[end:])
        scanned = len(buf)
        chunk = await reader.read(relay.CHUNK)
        if not chunk:
            raise InvalidRequest(
                "connection closed inside the head" if buf else "connection closed before a head"
            )
        buf += chunk


async def client_head(
    reader: asyncio.StreamReader, initial: bytes, timeout: float
) -> tuple[bytes, bytes]:
    """The client's request head (and what followed it), within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            return await read_head(reader, initial)
    except TimeoutError:
        raise Denied(f"no complete request head within {timeout:g} s", 408) from None
    except InvalidRequest as e:
        raise Denied(e.message, 400) from None


async def first_bytes(
    reader: asyncio.StreamReader, upstream: asyncio.StreamReader, timeout: float
) -> tuple[bytes, bytes]:
    """The first bytes of a tunnel from each side (b"" for a side that sent none yet).

    The client's are needed to check a ClientHello; when the server speaks first there
    is no ClientHello to check.
    """
    client = asyncio.ensure_future(reader.read(relay.CHUNK))
    server = asyncio.ensure_future(upstream.read(relay.CHUNK))
    try:
        await asyncio.wait({client, server}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        # A cancelled read consumes nothing: unread bytes stay in the reader.
        client.cancel()
        server.cancel()
        await asyncio.gather(client, server, return_exceptions=True)
    if client.cancelled() and server.cancelled():
        raise Denied(f"no data within {timeout:g} s of the tunnel opening", 0)
    try:
        return (
            b"" if client.cancelled() else client.result(),
            b"" if server.cancelled() else server.result(),
        )
    except OSError as e:
        raise Denied(f"connection failed at the tunnel opening: {e}", 0) from None


async def whole_record(reader: asyncio.StreamReader, data: bytes, timeout: float) -> bytes:
    """``data`` (the start of a TLS record) extended to the whole first record."""
    buf = bytearray(data)
    limit = clienthello.RECORD_HEADER + clienthello.MAX_RECORD
    try:
        async with asyncio.timeout(timeout):
            while True:
                size = clienthello.record_size(buf)
                if size is not None and len(buf) >= size:
                    return bytes(buf)
                if size is not None and size > limit:
                    raise Denied("TLS record too long for a ClientHello", 0)
                chunk = await reader.read(relay.CHUNK)
                if not chunk:
                    raise Denied("connection closed inside the TLS ClientHello", 0)
                buf += chunk
    except TimeoutError:
        raise Denied(f"incomplete TLS ClientHello after {timeout:g} s", 0) from None


def sni(data: bytes) -> str | None:
    """The normalised server name in the ClientHello in ``data`` (None: it has none)."""
    try:
        name = clienthello.server_name(data)
    except clienthello.NotClientHello as e:
        raise Denied(f"malformed TLS ClientHello: {e}", 0) from None
    if name is None:
        return None
    if parse_ip_literal(name) is not None:
        raise Denied(f"SNI {printable(name, 100)} is an IP literal; name a host", 0)
    try:
        return normalize_host(name)
    except InvalidRequest as e:
        raise Denied(f"invalid SNI: {e.message}", 0) from None
