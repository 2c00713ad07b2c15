"""A local VNC port forwarded through the gateway to a sandbox's desktop.

``agentbox sandbox desktop ID --vnc`` listens on 127.0.0.1 only; each VNC client that
connects gets its own WebSocket to the gateway's ``/v1/sandboxes/ID/desktop/vnc`` (the
token in the Authorization header), and RFB flows both ways unchanged. The gateway decides
what the viewer may do (watch, or take control) from the token and ``control``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from urllib.parse import quote

import aiohttp

from agentbox.network.relay import first_of

_READ = 64 * 1024


def vnc_url(gateway_url: str, sandbox_id: str, control: bool) -> str:
    base = gateway_url.rstrip("/")
    scheme = "wss" if base.startswith("https://") else "ws"
    rest = base.split("://", 1)[1]
    query = "?control=true" if control else ""
    return f"{scheme}://{rest}/v1/sandboxes/{quote(sandbox_id, safe='')}/desktop/vnc{query}"


async def serve(
    gateway_url: str,
    token: str,
    sandbox_id: str,
    *,
    control: bool = False,
    port: int = 0,
    ready: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Listen on 127.0.0.1:``port`` (0: any free port; ``ready`` gets the one bound) until
    ``stop`` is set (or forever)."""
    url = vnc_url(gateway_url, sandbox_id, control)
    headers = {"Authorization": f"Bearer {token}"}

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with (
                aiohttp.ClientSession() as session,
                session.ws_connect(url, headers=headers, max_msg_size=0) as ws,
            ):
                await _pipe(reader, writer, ws)
        except aiohttp.WSServerHandshakeError as e:
            sys.stderr.write(f"agentbox: the gateway refused the desktop ({e.status})\n")
        except (aiohttp.ClientError, OSError) as e:
            sys.stderr.write(f"agentbox: cannot reach the gateway: {e}\n")
        finally:
            writer.close()

    server = await asyncio.start_server(one, "127.0.0.1", port)
    bound = int(server.sockets[0].getsockname()[1])
    if ready is not None:
        ready(bound)
    async with server:
        if stop is None:
            await server.serve_forever()
        else:
            await stop.wait()


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    ws: aiohttp.ClientWebSocketResponse,
) -> None:
    async def up() -> None:
        while data := await reader.read(_READ):
            await ws.send_bytes(data)

    async def down() -> None:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY:
                return
            writer.write(message.data)
            await writer.drain()

    await first_of(up(), down())
    await ws.close()
