"""The SDK's socket client (``client/unixhttp.py``): the URL's spellings, the token it
sends, HTTP framing both ways, typed errors, and what it says when no gateway answers."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentbox.client.remote import RemoteRuntime, connect
from agentbox.client.unixhttp import UnixGatewayClient, socket_path, token_for
from agentbox.errors import (
    AgentboxError,
    GatewayUnreachable,
    InvalidRequest,
    SandboxNotFound,
    Unauthenticated,
)
from fake_socket_gateway import fake_gateway


def test_url_spellings() -> None:
    assert socket_path("unix:///var/lib/agentbox/gateway.sock") == "/var/lib/agentbox/gateway.sock"
    assert socket_path("unix:/var/lib/agentbox/gateway.sock") == "/var/lib/agentbox/gateway.sock"
    assert socket_path("http://127.0.0.1:8848") is None
    with pytest.raises(InvalidRequest, match="absolute path"):
        socket_path("unix://gateway.sock")


def test_the_token_is_the_environments_else_the_one_beside_the_socket(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sock = str(tmp_path / "gateway.sock")
    monkeypatch.delenv("AGENTBOX_TOKEN", raising=False)
    assert token_for(sock) is None
    (tmp_path / "operator.token").write_text("from-the-home\n")
    assert token_for(sock) == "from-the-home"
    monkeypatch.setenv("AGENTBOX_TOKEN", "from-env")
    assert token_for(sock) == "from-env"


@pytest.mark.parametrize("chunked", [False, True])
def test_calls_are_framed_and_answers_read_either_way(tmp_path: Path, chunked: bool) -> None:
    path = tmp_path / "gateway.sock"
    with fake_gateway(path, chunked=chunked) as gateway:
        backend = RemoteRuntime(connect(f"unix://{path}", "tok-1"))
        record = backend.create({"template": "default"})
        assert record.id == "sb-fake" and record.state == "running"
        from agentbox.runtime.requests import RunRequest

        result = backend.commands(record.id).run(RunRequest(["echo", "hi"]))
        assert result.stdout == "hi\n" and result.exit_code == 0
        backend.destroy(record.id)
        with pytest.raises(SandboxNotFound, match="sb-nope does not exist"):
            backend.get("sb-nope")  # the gateway's code, as the class it names
    create = gateway.requests[0].decode()
    assert create.startswith("POST /v1/sandboxes HTTP/1.1\r\n")
    assert "Authorization: Bearer tok-1\r\n" in create and "Connection: close\r\n" in create
    head, _, body = create.partition("\r\n\r\n")
    assert f"Content-Length: {len(body.encode())}\r\n" in head + "\r\n"
    assert body == '{"template":"default"}'
    assert gateway.requests[2].decode().startswith("DELETE /v1/sandboxes/sb-fake HTTP/1.1")


@contextlib.contextmanager
def one_answer(path: Path, answer: bytes) -> Iterator[None]:
    """A socket at ``path`` that reads one request and sends ``answer`` (raw bytes)."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def reply() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    thread = threading.Thread(target=reply)
    thread.start()
    try:
        yield
    finally:
        thread.join(10)
        listener.close()


def test_an_answer_that_is_not_the_gateways_error_is_still_an_agentbox_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "gateway.sock"
    with (
        one_answer(path, b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 4\r\n\r\noops"),
        pytest.raises(AgentboxError, match="gateway answered 502: oops"),
    ):
        UnixGatewayClient(str(path), "t").request("GET", "/v1/sandboxes")


def test_no_gateway_and_a_dead_one_say_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sock"
    with pytest.raises(GatewayUnreachable, match=r"no gateway socket at .*agentbox serve"):
        UnixGatewayClient(str(path), "t").request("GET", "/v1/sandboxes")
    with pytest.raises(GatewayUnreachable, match="no gateway socket at"):  # before the token
        UnixGatewayClient(str(path), None)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(path))  # a socket file nobody listens on: its gateway is gone
    dead.close()
    with pytest.raises(GatewayUnreachable, match=r"refuses connections: the gateway .* is gone"):
        UnixGatewayClient(str(path), "t").request("GET", "/v1/sandboxes")


def test_a_gateway_that_hangs_up_mid_answer_is_lost(tmp_path: Path) -> None:
    path = tmp_path / "gateway.sock"
    with (
        one_answer(path, b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"),
        pytest.raises(GatewayUnreachable, match=r"lost the gateway .* ended after 1 of 100"),
    ):
        UnixGatewayClient(str(path), "t").request("GET", "/v1/sandboxes")


def test_nothing_reaches_the_request_line_raw(tmp_path: Path) -> None:
    """A sandbox id or path with spaces or line breaks is quoted, as httpx does; a token
    with them is refused: no header can be smuggled into a request."""
    path = tmp_path / "gateway.sock"
    with fake_gateway(path) as gateway:
        client = UnixGatewayClient(str(path), "t")
        with pytest.raises(SandboxNotFound):
            client.request("GET", "/v1/sandboxes/x y\r\nX-Evil: 1")
    line = gateway.requests[0].split(b"\r\n")[0]
    assert line == b"GET /v1/sandboxes/x%20y%0D%0AX-Evil:%201 HTTP/1.1"
    with pytest.raises(Unauthenticated, match="control characters"):
        UnixGatewayClient(str(path), "tok\r\nX-Evil: 1")
