"""A stand-in gateway on a unix socket: it answers the few REST calls a one-shot SDK
script makes (create, run, kill, get) with canned JSON, framed as uvicorn frames them, and
keeps the raw requests it got. For the client's own tests (framing, errors, the modules a
script loads), where a real gateway adds nothing; the real one: tests/integration/
test_gateway_socket.py."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

RECORD = {"id": "sb-fake", "state": "running", "template": "default", "created_at": 1.0}
RESULT = {"stdout": "hi\n", "stderr": "", "exit_code": 0, "timed_out": False,
          "truncated": False, "duration_ms": 1}  # fmt: skip
NOT_FOUND = {"error": {"code": "sandbox_not_found", "message": "sandbox sb-nope does not exist"}}


def answer(method: str, target: str) -> tuple[int, object]:
    if method == "POST" and target == "/v1/sandboxes":
        return 200, RECORD
    if method == "POST" and target.endswith("/commands"):
        return 200, RESULT
    if method == "DELETE":
        return 200, {"id": "sb-fake", "destroyed": True}
    if method == "GET" and target == "/v1/sandboxes/sb-fake":
        return 200, RECORD
    return 404, NOT_FOUND


class FakeGateway:
    def __init__(self, path: Path, chunked: bool = False) -> None:
        self.path = path
        self.chunked = chunked
        self.requests: list[bytes] = []
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        method, target = head.split(b" ")[:2]
        status, payload = answer(method.decode(), target.decode())
        text = json.dumps(payload).encode()
        reply = f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n".encode()
        if self.chunked:
            halves = (text[:5], text[5:])
            framed = b"".join(b"%x\r\n%s\r\n" % (len(h), h) for h in halves) + b"0\r\n\r\n"
            conn.sendall(reply + b"transfer-encoding: chunked\r\n\r\n" + framed)
        else:
            conn.sendall(reply + f"content-length: {len(text)}\r\n\r\n".encode() + text)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


@contextlib.contextmanager
def fake_gateway(path: Path, chunked: bool = False) -> Iterator[FakeGateway]:
    gateway = FakeGateway(path, chunked)
    try:
        yield gateway
    finally:
        gateway.close()
