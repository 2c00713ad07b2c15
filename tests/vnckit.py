"""The desktop's VNC WebSocket as a viewer meets it: the upgrade's status, and the start
of an RFB handshake through it (single host, security probes and cluster replicas)."""

from __future__ import annotations

import asyncio

import aiohttp

from agentbox.gateway.desktop_relay import BEARER_PROTOCOL


async def handshake_status(
    url: str, token: str, *, origin: str | None = None, how: str = "header"
) -> int:
    """The upgrade's HTTP status (101 when it opened) with ``token`` in the Authorization
    header (``how="header"``) or as the bearer subprotocol (``how="subprotocol"``)."""
    headers = {"Authorization": f"Bearer {token}"} if how == "header" else {}
    if origin:
        headers["Origin"] = origin
    protocols = ("binary", BEARER_PROTOCOL + token) if how == "subprotocol" else ()
    async with aiohttp.ClientSession() as session:
        try:
            async with session.ws_connect(url, headers=headers, protocols=protocols) as ws:
                await ws.close()
                return 101
        except aiohttp.WSServerHandshakeError as e:
            return e.status


async def rfb_handshake(url: str, token: str) -> tuple[bytes, bytes]:
    """The server's RFB version, then its security types after ours was sent."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        version = await asyncio.wait_for(ws.receive_bytes(), 60)
        await ws.send_bytes(b"RFB 003.008\n")
        security = await asyncio.wait_for(ws.receive_bytes(), 60)
        return version, security
