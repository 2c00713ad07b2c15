"""Connect RPC framing with the JSON codec, as the E2B SDKs speak it to envd.

* unary: ``POST /pkg.Service/Method``, ``Content-Type: application/json``, the message
  as the body; an error is an HTTP status with ``{"code": "not_found", "message": ...}``.
* server streaming: ``Content-Type: application/connect+json``; the request and each
  response message are envelopes (1 flag byte, 4-byte big-endian length, JSON); the last
  envelope has flag 0x02 and holds ``{}`` or ``{"error": {...}}``; the status stays 200.

Hand-framed (a few dozen lines) rather than a Connect server library: the SDKs use the
JSON codec only, without compression, and the messages are described in ``models``.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from starlette.responses import JSONResponse, Response

from agentbox.errors import (
    AgentboxError,
    CommandTimeout,
    Conflict,
    FileExists,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    SandboxNotRunning,
    Unauthenticated,
)

UNARY_TYPE = "application/json"
STREAM_TYPE = "application/connect+json"
END_STREAM = 0x02
_HEADER = struct.Struct(">BI")

# Connect codes and the HTTP status a unary error carries (connectrpc.com/docs/protocol).
HTTP_STATUS = {
    "canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
    "not_found": 404, "already_exists": 409, "permission_denied": 403,
    "resource_exhausted": 429, "failed_precondition": 400, "aborted": 409,
    "out_of_range": 400, "unimplemented": 501, "internal": 500, "unavailable": 503,
    "data_loss": 500, "unauthenticated": 401,
}  # fmt: skip


class ConnectError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def code_of(e: AgentboxError) -> str:
    """The Connect code for an agentbox error (the SDKs branch on not_found / already_exists)."""
    for kind, code in (
        (FileExists, "already_exists"),
        (NotFound, "not_found"),
        (InvalidRequest, "invalid_argument"),
        (Unauthenticated, "unauthenticated"),
        (PermissionDenied, "permission_denied"),
        (LimitExceeded, "resource_exhausted"),
        (CommandTimeout, "deadline_exceeded"),
        (SandboxNotRunning, "unavailable"),
        (Conflict, "failed_precondition"),
    ):
        if isinstance(e, kind):
            return code
    return "internal"


def as_connect(e: Exception) -> ConnectError:
    if isinstance(e, ConnectError):
        return e
    if isinstance(e, AgentboxError):
        # agentbox's own message (a policy denial names its rule) is what the SDK raises.
        return ConnectError(code_of(e), f"{e.code}: {e.message}")
    return ConnectError("internal", "internal error; see the gateway log")


def unary_error(e: Exception) -> Response:
    error = as_connect(e)
    return JSONResponse(
        {"code": error.code, "message": error.message}, status_code=HTTP_STATUS[error.code]
    )


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _HEADER.pack(flags, len(data)) + data


def end_stream(error: Exception | None = None) -> bytes:
    if error is None:
        return envelope({}, END_STREAM)
    e = as_connect(error)
    return envelope({"error": {"code": e.code, "message": e.message}}, END_STREAM)


def read_envelopes(body: bytes) -> list[dict[str, Any]]:
    """The messages of a (client- or server-streaming) request body."""
    messages, at = [], 0
    while at < len(body):
        if len(body) - at < _HEADER.size:
            raise ConnectError("invalid_argument", "truncated Connect envelope")
        flags, length = _HEADER.unpack_from(body, at)
        at += _HEADER.size
        if flags & 0x01:
            raise ConnectError("unimplemented", "compressed messages are not supported")
        chunk = body[at : at + length]
        at += length
        if not flags & END_STREAM:
            messages.append(parse(chunk))
    return messages


def parse(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data) if data else {}
    except ValueError as e:
        raise ConnectError("invalid_argument", f"the message is not JSON: {e}") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the message must be a JSON object")
    return message
