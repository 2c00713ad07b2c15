"""The SDK over a gateway maps failures in one place (``client.remote.gateway_errors`` and
``raise_for_error``): no gateway, or one that hangs up, is a typed GatewayUnreachable;
an error answer is the class the gateway raised. Real sockets on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from agentbox.client.remote import GatewayClient
from agentbox.errors import AgentboxError, GatewayUnreachable, SandboxNotFound


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def answering() -> Iterator[tuple[str, list[bytes]]]:
    """A one-connection-at-a-time HTTP server; each connection gets the next answer
    (b"": hang up without one)."""
    server = socket.create_server(("127.0.0.1", 0))
    answers: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                if answers and (answer := answers.pop(0)):
                    conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", answers
    stop.set()
    server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept() (close alone does not)
    server.close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_no_gateway_is_gateway_unreachable() -> None:
    client = GatewayClient(f"http://127.0.0.1:{_free_port()}", "token")
    with pytest.raises(GatewayUnreachable, match="is `agentbox serve` running"):
        client.request("GET", "/v1/sandboxes")
    with pytest.raises(GatewayUnreachable, match="lost the gateway"):
        list(client.events("GET", "/v1/events"))


def test_a_gateway_that_hangs_up_is_gateway_unreachable(
    answering: tuple[str, list[bytes]],
) -> None:
    url, answers = answering
    answers.append(b"")
    with pytest.raises(GatewayUnreachable) as info:
        GatewayClient(url, "token").request("GET", "/v1/sandboxes")
    assert info.value.code == "gateway_unreachable"


def _http(status: str, body: bytes, kind: str = "application/json") -> bytes:
    head = f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {len(body)}\r\n"
    return head.encode() + b"connection: close\r\n\r\n" + body


def test_an_error_answer_is_the_gateways_class(answering: tuple[str, list[bytes]]) -> None:
    url, answers = answering
    body = b'{"error": {"code": "sandbox_not_found", "message": "no sandbox sb-1", "details": {}}}'
    answers += [_http("404 Not Found", body), _http("502 Bad Gateway", b"<html>", "text/html")]
    client = GatewayClient(url, "token")
    with pytest.raises(SandboxNotFound, match="no sandbox sb-1"):
        client.request("GET", "/v1/sandboxes/sb-1")
    with pytest.raises(AgentboxError, match="gateway answered 502"):
        client.request("GET", "/v1/sandboxes/sb-1")


def test_the_stdio_relay_reports_a_lost_gateway_as_gateway_unreachable() -> None:
    """``agentbox mcp`` beside a gateway that went away: the client gets a JSON-RPC error
    whose data.code says so (was host_unsupported)."""
    import anyio
    import httpx2

    from agentbox.gateway.stdio import _Relay

    relay = _Relay(f"http://127.0.0.1:{_free_port()}", lambda: ("token", "tok-1"))

    async def post() -> dict[str, Any]:
        async with httpx2.AsyncClient() as http:
            message = {"jsonrpc": "2.0", "id": 7, "method": "tools/list"}
            return await relay._post(http, message)

    answer = anyio.run(post)
    assert answer["id"] == 7 and answer["error"]["data"]["code"] == "gateway_unreachable"
    assert "lost the gateway" in answer["error"]["message"]
