"""``/v1/sandboxes/{id}/desktop/vnc``: a person's VNC viewer on a sandbox's desktop.

A WebSocket whose binary messages carry RFB (what noVNC speaks; ``agentbox sandbox
desktop ID --vnc`` bridges a local TCP port onto it). The token comes in the
Authorization header, or from a browser (the console's ``/console/desktop.html``) as the
subprotocol ``agentbox.bearer.<token>`` beside ``binary``. The gateway connects to the Xvnc
inside the sandbox with a socket made in the sandbox's network namespace
(:mod:`agentbox.network.ports`): the VNC server is reachable through the gateway only.

Who may connect: a token for this sandbox (the operator's, or one issued for it) with the
``desktop_view`` scope; input (keys, pointer, clipboard) goes through only with
``?control=true`` and the ``desktop_control`` scope, else the gateway drops it
(:mod:`agentbox.desktop.rfb`). Each view and each takeover is audited at its start and
its end (duration, bytes, input dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from agentbox.desktop.rfb import ViewerStream
from agentbox.errors import AgentboxError, InsufficientScope

if TYPE_CHECKING:
    from collections.abc import Callable

    from agentbox.gateway.service import Gateway
    from agentbox.policy.principal import Principal

VIEW_SCOPE, CONTROL_SCOPE = "desktop_view", "desktop_control"
BEARER_PROTOCOL = "agentbox.bearer."  # the token, offered as a WebSocket subprotocol
_READ = 256 * 1024
# WebSocket close codes (4000-4999: the application's): what went wrong, for the viewer.
_CLOSE_AUTH, _CLOSE_ERROR = 4401, 4500


def authorize(p: Principal, sandbox_id: str, control: bool) -> None:
    """Raise unless ``p`` may view (and, with ``control``, drive) ``sandbox_id``'s desktop."""
    p.require_sandbox(sandbox_id)
    if not p.may_use(VIEW_SCOPE):
        raise InsufficientScope(
            f"this token may not view desktops; ask for a token with {VIEW_SCOPE}",
            scope=VIEW_SCOPE,
        )
    if control and not p.may_use(CONTROL_SCOPE):
        raise InsufficientScope(
            f"this token may only watch; taking control needs {CONTROL_SCOPE} (connect "
            "without control=true to watch)",
            scope=CONTROL_SCOPE,
        )


async def relay(
    ws: WebSocket,
    gateway: Gateway,
    principal_of: Callable[[str | None], Principal],
    sandbox_id: str,
) -> None:
    control = ws.query_params.get("control", "").lower() in ("1", "true", "yes")
    offered = [str(x) for x in ws.scope.get("subprotocols", [])]  # ASGI: parsed for us
    authorization = ws.headers.get("authorization")
    if authorization is None:  # a browser (the console's noVNC) cannot set the header
        tokens = [x.removeprefix(BEARER_PROTOCOL) for x in offered if x.startswith(BEARER_PROTOCOL)]
        authorization = f"Bearer {tokens[0]}" if tokens else None
    try:
        p = principal_of(authorization)
        authorize(p, sandbox_id, control)
        gateway.rate.check(p.actor)
        sock = await asyncio.to_thread(gateway.desktops.connect_vnc, sandbox_id)
    except AgentboxError as e:
        # Refused before the handshake completes: the viewer sees an HTTP error status.
        await ws.close(code=_CLOSE_AUTH, reason=f"{e.code}: {e.message}"[:120])
        return
    what = "desktop_control" if control else "desktop_view"
    # Never the token's protocol: the browser accepts any one it offered.
    await ws.accept(subprotocol="binary" if "binary" in offered else None)
    await gateway.audit_event(p, f"{what}_started", sandbox=sandbox_id, tool=what)
    started = time.monotonic()
    viewer = ViewerStream(control=control)
    counts = {"up": 0, "down": 0}
    reader, writer = await asyncio.open_connection(sock=sock)
    why = "closed"
    try:
        tasks = [
            asyncio.ensure_future(_viewer_to_sandbox(ws, viewer, writer, counts)),
            asyncio.ensure_future(_sandbox_to_viewer(ws, reader, counts)),
        ]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        for task in done:
            error = task.exception()
            if isinstance(error, AgentboxError):
                why = f"{error.code}: {error.message}"
                with contextlib.suppress(Exception):
                    await ws.close(code=_CLOSE_ERROR, reason=why[:120])
    finally:
        gateway.desktops.disconnected(sandbox_id)
        writer.close()
        with contextlib.suppress(Exception):
            await ws.close()
        await gateway.audit_event(
            p, f"{what}_ended", sandbox=sandbox_id, tool=what, ended_by=why,
            held_ms=round((time.monotonic() - started) * 1000),
            bytes_from_viewer=counts["up"], bytes_to_viewer=counts["down"],
            input_dropped=viewer.dropped,
        )  # fmt: skip


async def _viewer_to_sandbox(
    ws: WebSocket, viewer: ViewerStream, writer: asyncio.StreamWriter, counts: dict[str, Any]
) -> None:
    while True:
        try:
            message = await ws.receive_bytes()
        except (WebSocketDisconnect, RuntimeError, KeyError):
            return  # the viewer left (or sent text, which RFB never is)
        counts["up"] += len(message)
        data = viewer.feed(message)
        if data:
            writer.write(data)
            await writer.drain()


async def _sandbox_to_viewer(
    ws: WebSocket, reader: asyncio.StreamReader, counts: dict[str, Any]
) -> None:
    while True:
        data = await reader.read(_READ)
        if not data:
            return  # the desktop stopped
        counts["down"] += len(data)
        await ws.send_bytes(data)
