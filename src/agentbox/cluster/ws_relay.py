"""WebSockets through a replica (today the desktop's VNC relay,
``/v1/sandboxes/ID/desktop/vnc``): the replica checks the token reaches ID, opens the same
WebSocket to ID's node over the cluster's mutual TLS, and passes messages both ways.

The node does every check of its own relay again (scopes, ``control``, the desktop) and
audits the view; the replica accepts the client's upgrade only once the node has accepted
its own, with the subprotocol the node chose, so a refusal reaches the viewer as one
(close code 4401 and the node's reason) before any RFB byte.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.types import Receive, Scope, Send

from agentbox.errors import AgentboxError
from agentbox.network.relay import first_of

BEARER_PROTOCOL = "agentbox.bearer."  # as gateway/desktop_relay.py
_CLOSE_AUTH, _CLOSE_ERROR, _CLOSE_POLICY = 4401, 4500, 1008


def bearer(scope: Scope) -> str | None:
    """The token from the Authorization header, else from a browser's subprotocol."""
    for key, value in scope["headers"]:
        if key.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    for offered in scope.get("subprotocols", []):
        if str(offered).startswith(BEARER_PROTOCOL):
            return str(offered).removeprefix(BEARER_PROTOCOL)
    return None


async def refuse(receive: Receive, send: Send, code: int, reason: str) -> None:
    await receive()  # websocket.connect
    await send({"type": "websocket.close", "code": code, "reason": reason[:120]})


class WebSocketRelay:
    def __init__(self, context: ssl.SSLContext) -> None:
        self.context = context
        self._session: Any = None  # aiohttp.ClientSession, made in the serving loop

    async def relay(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        address: str,
        on_end: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        import aiohttp  # only when a WebSocket comes (import weight of the CLI)

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        query = scope.get("query_string", b"").decode("latin-1")
        url = address.replace("https://", "wss://", 1) + scope["path"]
        url += ("?" + query) if query else ""
        headers = {}
        token = bearer(scope)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        # The token's subprotocol stays here: the node reads the header.
        protocols = [str(p) for p in scope.get("subprotocols", [])]
        protocols = [p for p in protocols if not p.startswith(BEARER_PROTOCOL)]
        try:
            upstream = await self._session.ws_connect(
                url, ssl=self.context, headers=headers, protocols=protocols, max_msg_size=0,
                autoping=True,
            )  # fmt: skip
        except aiohttp.WSServerHandshakeError as e:
            await refuse(receive, send, _CLOSE_AUTH, f"the node refused: HTTP {e.status}")
            return
        except (aiohttp.ClientError, OSError) as e:
            await refuse(receive, send, _CLOSE_ERROR, f"node_unreachable: {e}")
            return
        why = "closed"
        try:
            if (await receive())["type"] != "websocket.connect":
                return
            if upstream.closed:  # the node refused after its upgrade (its relay's checks)
                code = upstream.close_code or _CLOSE_POLICY
                await send({"type": "websocket.close", "code": code, "reason": ""})
                return
            accept: dict[str, Any] = {"type": "websocket.accept"}
            if upstream.protocol:
                accept["subprotocol"] = upstream.protocol
            await send(accept)
            why = await _pump(upstream, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await upstream.close()
            if on_end is not None:
                await on_end(why)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _pump(upstream: Any, receive: Receive, send: Send) -> str:
    import aiohttp

    async def up() -> str:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return "viewer left"
            if message.get("bytes") is not None:
                await upstream.send_bytes(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send_str(message["text"])

    async def down() -> str:
        async for message in upstream:
            if message.type == aiohttp.WSMsgType.BINARY:
                await send({"type": "websocket.send", "bytes": message.data})
            elif message.type == aiohttp.WSMsgType.TEXT:
                await send({"type": "websocket.send", "text": message.data})
            else:
                break
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": code, "reason": ""})
        return f"node closed ({code})"

    for task in await first_of(up(), down()):
        error = task.exception()
        if error is not None and not isinstance(error, AgentboxError | OSError):
            return f"error: {error}"
        if error is None:
            return str(task.result())
    return "closed"
