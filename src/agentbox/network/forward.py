"""Forwarding one absolute-form HTTP request: exactly its body up, its response down.

One request per upstream connection (the request goes out with ``Connection: close``),
which keeps the proxy simple and safe: a pipelined second request, which could name
another Host, is never forwarded.
"""

from __future__ import annotations

import asyncio

from agentbox.errors import InvalidRequest
from agentbox.network import httphead, relay
from agentbox.network.credentials import Scrubber
from agentbox.network.decision import Conn, Denied
from agentbox.network.peek import read_head


async def request_body(
    client: relay.Streams,
    upstream: asyncio.StreamWriter,
    rest: bytes,
    length: int | None,
    traffic: relay.Traffic,
) -> None:
    """Forward exactly the body: ``length`` bytes, or the chunked body when None.
    ``rest`` is what was read past the head already."""
    if length is not None:
        first = rest[:length]
        relay.send(upstream, first, traffic, upward=True)
        await relay.copy_exactly(client[0], upstream, length - len(first), traffic, upward=True)
        return
    chunks = httphead.ChunkedBody()
    data = rest
    while True:
        relay.send(upstream, data[: chunks.feed(data)], traffic, upward=True)
        await upstream.drain()
        if chunks.done:
            return
        data = await client[0].read(relay.CHUNK)
        if not data:
            raise ConnectionError("client closed inside a chunked request body")


async def response(
    upstream: relay.Streams,
    client: relay.Streams,
    traffic: relay.Traffic,
    conn: Conn,
    *,
    zero_copy: bool = True,
    scrub: Scrubber | None = None,
) -> None:
    """The response, its head rewritten (``Connection: close``), then its body as is,
    until the upstream closes. With ``scrub``, every byte passes through it (an injected
    secret that the upstream echoes never reaches the client)."""
    writer = client[1]
    mask = scrub.whole if scrub is not None else bytes
    rest = b""
    while True:
        try:
            raw, rest = await read_head(upstream[0], rest)
            head = httphead.parse_response(raw)
        except InvalidRequest as e:
            raise Denied(f"bad response from upstream: {e.message}", 502) from None
        status = int(head.first[1])
        if not 100 <= status < 200 or status == 101:
            break
        relay.send(writer, mask(raw), traffic, upward=False)  # 100 Continue and friends
    conn.can_respond = False
    relay.send(writer, mask(httphead.rewrite_response(head)), traffic, upward=False)
    if scrub is None:
        relay.send(writer, rest, traffic, upward=False)
        await writer.drain()
        await relay.pump(upstream, client, traffic, upward=False, zero_copy=zero_copy)
        return
    relay.send(writer, scrub.feed(rest), traffic, upward=False)
    await writer.drain()
    while data := await upstream[0].read(relay.CHUNK):
        relay.send(writer, scrub.feed(data), traffic, upward=False)
        await writer.drain()
    relay.send(writer, scrub.flush(), traffic, upward=False)
    await writer.drain()
    relay.half_close(writer)
