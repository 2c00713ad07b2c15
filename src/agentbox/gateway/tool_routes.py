"""The REST routes that are one tool call each (processes, sessions, files): one table,
one route shape.

Their arguments are the tool's argument model: a JSON body (``body``) or the query string
(``query``, converted by the model's types), plus what the path names (``sandbox_id``, a
process or session id), which a body may not repeat. The gateway checks them once,
against the model, so a bad argument gets the same typed error here as through MCP; the
OpenAPI document publishes the model's schema as the request body or the parameters.
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from fastapi import APIRouter, Request

from agentbox.errors import InvalidRequest
from agentbox.gateway import jsonbody
from agentbox.gateway.tools import TOOLS_BY_NAME
from agentbox.policy.principal import Principal

Carrier = Literal["body", "query"]
# (method, path below /sandboxes/{sandbox_id}, tool, status of a success, where the
# arguments are)
TOOL_ROUTES: tuple[tuple[str, str, str, int, Carrier], ...] = (
    ("POST", "/processes", "process_start", 201, "body"),
    ("GET", "/processes", "process_list", 200, "query"),
    ("GET", "/processes/{process_id}/output", "process_read", 200, "query"),
    ("POST", "/processes/{process_id}/stdin", "process_write", 200, "body"),
    ("POST", "/processes/{process_id}/resize", "process_resize", 200, "body"),
    ("POST", "/processes/{process_id}/signal", "process_signal", 200, "body"),
    ("POST", "/sessions", "shell_create", 201, "body"),
    ("POST", "/sessions/{session_id}/run", "shell_run", 200, "body"),
    ("DELETE", "/sessions/{session_id}", "shell_close", 200, "query"),
    ("GET", "/files", "fs_read", 200, "query"),
    ("PUT", "/files", "fs_write", 200, "body"),
    ("GET", "/files/list", "fs_list", 200, "query"),
    ("GET", "/files/stat", "fs_stat", 200, "query"),
    ("POST", "/files/edit", "fs_edit", 200, "body"),
    ("POST", "/files/mkdir", "fs_mkdir", 200, "body"),
    ("POST", "/files/move", "fs_move", 200, "body"),
    ("POST", "/files/remove", "fs_remove", 200, "body"),
)
ToolCaller = Callable[[Principal, str, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def add_tool_routes(api: APIRouter, call: ToolCaller, auth: Any) -> None:
    """Register TOOL_ROUTES on ``api``; ``call(principal, tool, sandbox, args)`` runs one."""
    for method, path, name, status, carrier in TOOL_ROUTES:
        ids = [part[1:-1] for part in path.split("/") if part.startswith("{")]
        api.add_api_route(
            "/sandboxes/{sandbox_id}" + path,
            _route(call, name, carrier, auth),
            methods=[method],
            status_code=status,
            tags=[path.split("/")[1]],
            operation_id=f"{name}_rest",
            openapi_extra=body(name, *ids) if carrier == "body" else query(name, *ids),
        )


def _route(
    call: ToolCaller, name: str, carrier: Carrier, auth: Any
) -> Callable[..., Awaitable[Any]]:
    # A closure: the tool's name must not become a parameter a caller could set.
    async def route(sandbox_id: str, request: Request, p: Principal = auth) -> Any:
        ids = {k: v for k, v in request.path_params.items() if k != "sandbox_id"}
        if carrier == "body":
            args = await tool_body(request, ids)
        else:
            args = query_args(request, name, ids)
        return await call(p, name, sandbox_id, args)

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
    if from_path:
        extra["parameters"] = _path_parameters(from_path)
    return extra


def query(tool: str, *from_path: str) -> dict[str, Any]:
    """``openapi_extra`` of a tool route taking its arguments in the query string: one
    parameter per argument of the model (an integer bounded to 64 bits, as parsed)."""
    schema = TOOLS_BY_NAME[tool].input_schema
    parameters = _path_parameters(from_path)
    for name, prop in schema["properties"].items():
        if name == "sandbox_id" or name in from_path:
            continue
        published = dict(prop)
        if prop.get("type") == "integer":
            published.setdefault("minimum", jsonbody.MIN_INT)
            published.setdefault("maximum", jsonbody.MAX_INT)
        required = name in schema["required"]
        description = prop.get("description", "")
        parameters.append({"name": name, "in": "query", "required": required,
                           "description": description, "schema": published})  # fmt: skip
    return {"parameters": parameters}


def _path_parameters(names: tuple[str, ...]) -> list[dict[str, Any]]:
    # Read from request.path_params, so FastAPI does not list them itself.
    return [
        {"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names
    ]


def query_args(request: Request, tool: str, from_path: dict[str, str]) -> dict[str, Any]:
    """A tool route's query string as the tool's arguments (typed as the model says),
    with what the path names. A parameter the tool does not take is ignored."""
    props = TOOLS_BY_NAME[tool].input_schema["properties"]
    args: dict[str, Any] = {}
    for name, value in request.query_params.items():
        if name in props and name != "sandbox_id" and name not in from_path:
            args[name] = _typed(name, value, props[name])
    return args | from_path


def _typed(name: str, value: str, prop: dict[str, Any]) -> Any:
    if prop.get("type") == "integer":
        return jsonbody.parse_int(value, name, jsonbody.MIN_INT, jsonbody.MAX_INT)
    if prop.get("type") == "boolean":
        if value not in ("true", "false"):
            raise InvalidRequest(f"{name} must be true or false, got {value[:40]!r}", field=name)
        return value == "true"
    return value


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
