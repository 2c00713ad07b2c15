"""REST's one error mapping: every error answer of the HTTP API is built here, as
``{"error": {"code", "message", "details"}}`` with the error's HTTP status (or the one a
front door must answer with), ``WWW-Authenticate`` on 401/403 and ``Retry-After`` when
the error says when to come back. The SDK's ``client.remote.raise_for_error`` turns it
back into the same class.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi.responses import JSONResponse, Response

from agentbox.errors import (
    AgentboxError,
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    RateLimited,
    Unauthenticated,
)
from agentbox.gateway import jsonbody
from agentbox.gateway.auth import challenge

log = logging.getLogger(__name__)
INTERNAL_ERROR = {
    "error": {"code": "internal", "message": "internal error; see the gateway log", "details": {}}
}
# What an HTTP error raised by the framework itself (no route, wrong method, ...) is.
_BY_STATUS: dict[int, type[AgentboxError]] = {
    401: Unauthenticated,
    403: PermissionDenied,
    404: NotFound,
    413: LimitExceeded,
    429: RateLimited,
}


def error_response(e: AgentboxError, status: int | None = None) -> JSONResponse:
    """``e`` as the API answers it; ``status``: other than the error's own (a front door's
    421 or 413)."""
    headers = {}
    www_authenticate = challenge(e)
    if www_authenticate is not None:
        headers["WWW-Authenticate"] = www_authenticate
    retry = e.details.get("retry_after")
    if retry is not None:
        headers["Retry-After"] = str(max(1, int(retry + 0.999)))
    body = {"error": jsonbody.encodable(e.to_dict("rest"))}  # it may name a sandbox's file
    return JSONResponse(body, status_code=status or e.http_status, headers=headers)


def http_error_response(status: int, detail: Any) -> JSONResponse:
    """An HTTP error the framework raised (Starlette's HTTPException), typed."""
    error = _BY_STATUS.get(status, InvalidRequest)(str(detail))
    return JSONResponse({"error": error.to_dict("rest")}, status_code=status)


def internal_error_response() -> JSONResponse:
    """Anything but an AgentboxError: logged where it happened, never described."""
    return JSONResponse(INTERNAL_ERROR, status_code=500)


async def answer(make: Callable[[], Awaitable[Response]], what: str) -> Response:
    """``make()``'s response, or its failure as an error response (the routes the app's
    front door serves without FastAPI's exception handlers)."""
    try:
        return await make()
    except AgentboxError as e:
        return error_response(e)
    except Exception:
        log.exception("%s failed", what)
        return internal_error_response()
