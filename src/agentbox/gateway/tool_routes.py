"""The REST routes of the tools whose JSON body is the tool's arguments (processes,
sessions, files): one table, one route shape.

A body is checked once, by the gateway, against the tool's argument model (its JSON
Schema is the route's request body in the OpenAPI document), so a bad argument gets the
same typed error here as through MCP. What the path names (``sandbox_id``, a process or
session id) is merged in and may not appear in the body too.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request

from agentbox.errors import InvalidRequest
from agentbox.gateway import jsonbody
from agentbox.gateway.auth import Principal
from agentbox.gateway.tools import TOOLS_BY_NAME

# (method, path below /sandboxes/{sandbox_id}, tool, status of a success)
BODY_ROUTES = (
    ("POST", "/processes", "process_start", 201),
    ("POST", "/processes/{process_id}/stdin", "process_write", 200),
    ("POST", "/processes/{process_id}/resize", "process_resize", 200),
    ("POST", "/processes/{process_id}/signal", "process_signal", 200),
    ("POST", "/sessions", "shell_create", 201),
    ("POST", "/sessions/{session_id}/run", "shell_run", 200),
    ("PUT", "/files", "fs_write", 200),
    ("POST", "/files/edit", "fs_edit", 200),
    ("POST", "/files/mkdir", "fs_mkdir", 200),
    ("POST", "/files/move", "fs_move", 200),
    ("POST", "/files/remove", "fs_remove", 200),
)
ToolCaller = Callable[[Principal, str, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def add_body_routes(api: APIRouter, call: ToolCaller, auth: Any) -> None:
    """Register BODY_ROUTES on ``api``; ``call(principal, tool, sandbox, args)`` runs one."""
    for method, path, name, status in BODY_ROUTES:
        ids = [part[1:-1] for part in path.split("/") if part.startswith("{")]
        api.add_api_route(
            "/sandboxes/{sandbox_id}" + path,
            _route(call, name, auth),
            methods=[method],
            status_code=status,
            tags=[path.split("/")[1]],
            operation_id=f"{name}_rest",
            openapi_extra=body(name, *ids),
        )


def _route(call: ToolCaller, name: str, auth: Any) -> Callable[..., Awaitable[Any]]:
    # A closure: the tool's name must not become a parameter a caller could set.
    async def route(sandbox_id: str, request: Request, p: Principal = auth) -> Any:
        ids = {k: v for k, v in request.path_params.items() if k != "sandbox_id"}
        return await call(p, name, sandbox_id, await tool_body(request, ids))

    return route


def body(tool: str, *from_path: str) -> dict[str, Any]:
    """``openapi_extra`` of a tool route: its request body is the tool's argument model
    (its JSON Schema, less ``sandbox_id`` and what the path names), and the path's ids."""
    schema = copy.deepcopy(TOOLS_BY_NAME[tool].input_schema)
    for name in ("sandbox_id", *from_path):
        del schema["properties"][name]
    schema["required"] = [r for r in schema["required"] if r not in from_path]
    content = {"application/json": {"schema": schema}}
    extra: dict[str, Any] = {
        "requestBody": {"required": bool(schema["required"]), "content": content}
    }
    if from_path:  # read from request.path_params, so FastAPI does not list them itself
        extra["parameters"] = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
            for n in from_path
        ]
    return extra


async def tool_body(request: Request, from_path: dict[str, str]) -> dict[str, Any]:
    """A tool route's JSON body with what the path names; a null means "not given" (as
    the SDK sends an unset option). The gateway checks the rest."""
    raw = await request.body()
    data = jsonbody.loads(raw) if raw else {}
    if not isinstance(data, dict):
        raise InvalidRequest("the body must be a JSON object of the tool's arguments")
    for name in ("sandbox_id", *from_path):
        if name in data:
            raise InvalidRequest(f"{name}: Extra inputs are not permitted (the path names it)")
    args = {k: v for k, v in data.items() if v is not None}
    return args | from_path
