"""The SDK's transport to its home's gateway over the gateway's unix socket.

``AGENTBOX_URL=unix:///var/lib/agentbox/gateway.sock`` (also ``unix:/var/...``): the SDK
sends each call to the gateway serving that home (``agentbox serve`` listens on
``$AGENTBOX_HOME/gateway.sock``, mode 0600, beside its TCP address), as docker's CLI talks
to dockerd. A one-shot script then pays for no runtime at all: no sqlite, no pydantic, no
mounts, no bubblewrap; the gateway's warm pool answers the create
(docs/design.md, "The SDK's transports").

What a plain call needs from HTTP/1.1 is small (one request with a ``Content-Length`` per
connection, ``Connection: close``, a response with a ``Content-Length``, chunked or read to
the end) and it is written here: the libraries that frame HTTP cost more to import than the
whole call (h11 loads typing, dataclasses and inspect: ~25 ms of a ~50 ms script; httpx2
~100 ms). The streaming routes (a command's output as server-sent events, a tar download)
go through the full client over the same socket (``client.remote.SocketGatewayClient``),
httpx2 imported on their first use.

Authentication is the gateway's, unchanged: the bearer token in ``AGENTBOX_TOKEN``, else
the operator token the gateway keeps beside its socket (``operator.token``, readable by
root only: the in-process SDK needs root as well).
"""

from __future__ import annotations

# The C module under ``socket``: socket.py adds enums of every constant and selectors
# (for sendfile), a tenth of the whole script; a connect, sendall and recv need neither.
import _socket
import json
import os

TYPE_CHECKING = False  # not typing's: the SDK's light path does without it
if TYPE_CHECKING:
    from typing import Any

# agentbox.gateway.auth.OPERATOR_TOKEN_FILE, which imports this one (no second spelling)
TOKEN_FILE = "operator.token"  # noqa: S105 (a file name)
DEFAULT_TIMEOUT_S = 600.0
_MAX_HEAD = 64 * 1024  # a response's status line and headers


def socket_path(url: str) -> str | None:
    """The socket a ``unix:`` URL names (``unix:///abs/path`` or ``unix:/abs/path``);
    None for any other URL."""
    if not url.startswith("unix:"):
        return None
    path = url[len("unix:") :]
    if path.startswith("//"):
        path = path[2:]
    if not path.startswith("/"):
        from agentbox.errors import InvalidRequest

        raise InvalidRequest(
            f"AGENTBOX_URL={url!r}: a unix socket needs an absolute path, as in "
            "unix:///var/lib/agentbox/gateway.sock"
        )
    return path


def token_for(path: str) -> str | None:
    """``AGENTBOX_TOKEN``, else the operator token of the home the socket is in."""
    token = os.environ.get("AGENTBOX_TOKEN")
    if token:
        return token
    try:
        with open(os.path.join(os.path.dirname(path), TOKEN_FILE)) as f:
            return f.read().strip() or None
    except OSError:
        return None


class Response:
    """A whole response: status, headers (lower-case names), body."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class UnixGatewayClient:
    """:class:`agentbox.client.remote.GatewayClient`'s calls over the home's socket."""

    def __init__(self, path: str, token: str | None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = path
        self.timeout = timeout
        if not token:
            self._connect().close()  # no gateway there at all: that is what to fix first
            from agentbox.errors import Unauthenticated

            raise Unauthenticated(
                f"AGENTBOX_URL names the gateway socket {path} but no token is at hand: "
                f"export AGENTBOX_TOKEN, or run as root with the gateway's "
                f"{os.path.join(os.path.dirname(path), TOKEN_FILE)} readable"
            )
        self.url = f"unix://{path}"
        if not _plain(token):
            from agentbox.errors import Unauthenticated

            raise Unauthenticated("the token holds control characters or spaces: not a token")
        self._token = token
        self._head = f"Host: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n"

    def close(self) -> None:
        """Nothing stays open between calls (one connection a request)."""

    def _connect(self) -> _socket.socket:
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise _unreachable(self.path, e) from None
        return sock

    def exchange(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """One request, one connection; the response read whole."""
        if params:
            from urllib.parse import urlencode  # only calls with a query pay for it

            query = {k: _param(v) for k, v in params.items() if v is not None}
            if query:
                path = f"{path}?{urlencode(query)}"
        if not _plain(path) or not path.isascii():  # what httpx does: quoted, never sent raw
            from urllib.parse import quote

            path = quote(path, safe="/?=&%:@!$'()*+,;-._~")
        body = content
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if json is not None:
            body = _dumps(json)
            head += "Content-Type: application/json\r\n"
        for name, value in (headers or {}).items():
            if not (_plain(name) and _plain(value.replace(" ", ""))):
                raise ValueError(f"header {name!r}: control characters")
            head += f"{name}: {value}\r\n"
        head += f"Content-Length: {len(body or b'')}\r\n\r\n"
        sock = self._connect()
        try:
            try:
                sock.sendall(head.encode("latin-1") + (body or b""))
                return _read_response(_Reader(sock), method)
            except OSError as e:  # timeouts included: whatever the call did may have happened
                from agentbox.errors import GatewayUnreachable

                raise GatewayUnreachable(f"lost the gateway at {self.url}: {e}") from None
        finally:
            sock.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """As ``GatewayClient.request``: the JSON answer (or the bytes of another), an error
        answer raised as the class the gateway raised."""
        response = self.exchange(method, path, **kwargs)
        if response.status >= 400:
            raise_error(response.status, response.body)
        if response.headers.get("content-type", "").startswith("application/json"):
            return json.loads(response.body)
        return response.body


def _plain(text: str) -> bool:
    """No control character and no space: safe on a request line or as a token."""
    return text.isprintable() and " " not in text


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _unreachable(path: str, error: OSError) -> Exception:
    from agentbox.errors import GatewayUnreachable

    home = os.path.dirname(path)
    if isinstance(error, FileNotFoundError):
        why = (
            f"no gateway socket at {path}: start the home's gateway "
            f"(AGENTBOX_HOME={home} agentbox serve), or set AGENTBOX_URL=inprocess to run "
            "in-process"
        )
    elif isinstance(error, ConnectionRefusedError):
        why = (
            f"the gateway socket {path} refuses connections: the gateway that made it is "
            f"gone; start it again (AGENTBOX_HOME={home} agentbox serve), or set "
            "AGENTBOX_URL=inprocess to run in-process"
        )
    elif isinstance(error, PermissionError):
        why = f"the gateway socket {path} is root's (mode 0600): run as root"
    else:
        why = f"cannot reach the gateway at unix://{path}: {error}; is `agentbox serve` running?"
    return GatewayUnreachable(why)


class _Reader:
    """Lines and sized reads over a connected socket (what ``makefile`` gives)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def _fill(self) -> bool:
        data = self._sock.recv(65536)
        self._buf += data
        return bool(data)

    def readline(self, limit: int) -> bytes:
        """Up to and with the next newline, at most ``limit`` bytes (less at the end)."""
        while True:
            end = self._buf.find(b"\n", 0, limit)
            if end >= 0 or len(self._buf) >= limit:
                return self._take(end + 1 if end >= 0 else limit)
            if not self._fill():
                return self._take(len(self._buf))

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes (fewer at the end); -1: to the end."""
        while (size < 0 or len(self._buf) < size) and self._fill():
            pass
        return self._take(len(self._buf) if size < 0 else min(size, len(self._buf)))

    def _take(self, size: int) -> bytes:
        data = bytes(self._buf[:size])
        del self._buf[:size]
        return data


def _read_response(reader: _Reader, method: str) -> Response:
    status_line = reader.readline(_MAX_HEAD)
    if not status_line:
        raise ConnectionResetError("the gateway closed the connection without an answer")
    parts = status_line.split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise ConnectionError(f"not an HTTP answer: {status_line[:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    size = len(status_line)
    while True:
        line = reader.readline(_MAX_HEAD)
        size += len(line)
        if size > _MAX_HEAD or not line.endswith(b"\n"):
            raise ConnectionError("the answer's headers are cut short or too long")
        if line in (b"\r\n", b"\n"):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return Response(status, headers, b"")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size_line = reader.readline(_MAX_HEAD)
            if not size_line:
                raise ConnectionResetError("the answer ended inside a chunk")
            length = int(size_line.split(b";", 1)[0], 16)
            if length == 0:
                while reader.readline(_MAX_HEAD) not in (b"\r\n", b"\n", b""):  # trailers
                    pass
                break
            chunks.append(_read_exactly(reader, length))
            reader.readline(_MAX_HEAD)  # the CRLF after each chunk
        return Response(status, headers, b"".join(chunks))
    if "content-length" in headers:
        return Response(status, headers, _read_exactly(reader, int(headers["content-length"])))
    return Response(status, headers, reader.read())  # Connection: close ends it


def _read_exactly(reader: _Reader, length: int) -> bytes:
    data = reader.read(length)
    if len(data) != length:
        raise ConnectionResetError(f"the answer ended after {len(data)} of {length} bytes")
    return data


def raise_error(status: int, body: bytes) -> None:
    """An error answer as the class the gateway raised (its ``code`` survives the wire)."""
    from agentbox.errors import AgentboxError

    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        text = body[:200].decode("utf-8", "replace")
        raise AgentboxError(f"gateway answered {status}: {text}") from None
    raise AgentboxError.from_dict(error)
