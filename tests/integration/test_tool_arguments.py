"""One argument model per tool: a REST route and an MCP call with the same bad argument
get the same typed error (code and message), since both are checked once, by the
gateway, against the tool's model; the REST body published in OpenAPI is that model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentbox.gateway.tool_args import ARGS, input_schema
from agentbox.gateway.tools import TOOLS_BY_NAME, configured_schema
from gateway_harness import RunningGateway, running_gateway

MCP_HEADERS = {"content-type": "application/json",
               "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-11-25"}  # fmt: skip


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path,
       host_ready: None) -> Iterator[RunningGateway]:  # fmt: skip
    with running_gateway(agentbox_home, tmp_path_factory.mktemp("args")) as running:
        yield running


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[tuple[str, str]]:
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json={"memory": "256MiB", "disk": "128MiB"})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
        yield sid, token
        op.delete(f"/v1/sandboxes/{sid}")


# (tool, REST method, REST path under the sandbox, what the path names, bad arguments).
# Each was accepted or worded differently by the REST route's own body model before.
CASES = [
    ("fs_write", "PUT", "files", {}, {"path": "/workspace/a", "content": "x", "perms": 4096}),
    ("fs_edit", "POST", "files/edit", {}, {"path": "/workspace/a", "old": "", "new": "y"}),
    ("fs_remove", "POST", "files/remove", {}, {"path": "/workspace/a", "recursive": "yes"}),
    ("fs_mkdir", "POST", "files/mkdir", {}, {"path": ""}),
    ("terminal_run", "POST", "commands", {}, {"command": "true", "timeout_ms": "5"}),
    ("terminal_run", "POST", "commands", {}, {"command": "true", "cwd": ""}),
    ("shell_create", "POST", "sessions", {}, {"env": {"A": 1}}),
    ("process_signal", "POST", "processes/p-1/signal", {"process_id": "p-1"}, {"signal": 9}),
    ("process_resize", "POST", "processes/p-1/resize", {"process_id": "p-1"},
     {"cols": 0, "rows": 24}),
    ("process_start", "POST", "processes", {}, {"command": [], "stdin": False}),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{sorted(c[4])[-1]}")
def test_rest_and_mcp_give_the_same_error_for_the_same_bad_argument(
    gw: RunningGateway, session: tuple[str, str], case: tuple[Any, ...]
) -> None:
    tool, method, path, from_path, bad = case
    sid, token = session
    with gw.client(token) as c:
        rest = c.request(method, f"/v1/sandboxes/{sid}/{path}", json=bad)
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": tool, "arguments": {**bad, **from_path}}}  # fmt: skip
        mcp = c.post("/mcp", json=rpc, headers=MCP_HEADERS)
    assert rest.status_code == 400, rest.text
    error = rest.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(f"invalid arguments for {tool}: "), error
    result = mcp.json()["result"]
    assert result["isError"] is True
    assert result["content"][0]["text"] == f"invalid_request: {error['message']}"


# (tool, REST path under the sandbox (a GET), query, what the path names)
QUERY_CASES = [
    ("fs_read", "files", {"path": "/workspace/a", "offset": "-1"}, {}),
    ("fs_list", "files/list", {"path": "/workspace", "depth": "11"}, {}),
    ("fs_stat", "files/stat", {"path": ""}, {}),
    ("process_read", "processes/p-1/output", {"stream": "stdin"}, {"process_id": "p-1"}),
]


@pytest.mark.parametrize("case", QUERY_CASES, ids=lambda c: c[0])
def test_a_query_argument_is_checked_as_the_same_argument_through_mcp(
    gw: RunningGateway, session: tuple[str, str], case: tuple[Any, ...]
) -> None:
    """The query string is the tool's arguments too (typed as its model says): the same
    bad value, the same error."""
    tool, path, params, from_path = case
    sid, token = session
    arguments = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in params.items()}
    with gw.client(token) as c:
        rest = c.get(f"/v1/sandboxes/{sid}/{path}", params=params)
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": tool, "arguments": {**arguments, **from_path}}}  # fmt: skip
        mcp = c.post("/mcp", json=rpc, headers=MCP_HEADERS)
    assert rest.status_code == 400, rest.text
    error = rest.json()["error"]
    assert error["message"].startswith(f"invalid arguments for {tool}: "), error
    assert mcp.json()["result"]["content"][0]["text"] == f"invalid_request: {error['message']}"


def test_a_query_integer_is_bounded_as_a_64_bit_number(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    sid, token = session
    with gw.client(token) as c:
        r = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/x", "offset": str(2**64)})
        words = c.get(f"/v1/sandboxes/{sid}/files", params={"path": "/x", "offset": "ten"})
    for answer in (r, words):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["details"]["field"] == "offset", answer.text


def test_a_rest_body_may_not_name_what_its_path_names(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    sid, token = session
    with gw.client(token) as c:
        r = c.post(f"/v1/sandboxes/{sid}/sessions/s-1/run",
                   json={"command": "true", "session_id": "s-2"})  # fmt: skip
        other = c.post(f"/v1/sandboxes/{sid}/files/mkdir",
                       json={"path": "/workspace/d", "sandbox_id": "sb-other"})  # fmt: skip
    for answer, name in ((r, "session_id"), (other, "sandbox_id")):
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["message"].startswith(f"{name}: "), answer.text


def test_the_openapi_body_of_a_tool_route_is_the_tools_argument_model(
    gw: RunningGateway,
) -> None:
    paths = gw.app.openapi()["paths"]
    routes = {
        ("put", "/v1/sandboxes/{sandbox_id}/files"): ("fs_write", ()),
        ("post", "/v1/sandboxes/{sandbox_id}/commands"): ("terminal_run", ()),
        ("post", "/v1/sandboxes/{sandbox_id}/files/edit"): ("fs_edit", ()),
        ("post", "/v1/sandboxes/{sandbox_id}/sessions/{session_id}/run"):
            ("shell_run", ("session_id",)),
        ("post", "/v1/sandboxes/{sandbox_id}/processes/{process_id}/stdin"):
            ("process_write", ("process_id",)),
    }  # fmt: skip
    for (method, path), (tool, from_path) in routes.items():
        published = paths[path][method]["requestBody"]["content"]["application/json"]["schema"]
        model = TOOLS_BY_NAME[tool].input_schema
        leave_out = {"sandbox_id", *from_path}
        assert published["properties"] == {
            k: v for k, v in model["properties"].items() if k not in leave_out
        }, path
        assert published["additionalProperties"] is False
        assert published["required"] == [r for r in model["required"] if r not in leave_out]


def test_a_good_rest_call_still_works_through_the_shared_model(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    """The SDK sends an unset option as null: null means "not given" on REST."""
    sid, token = session
    with gw.client(token) as c:
        w = c.put(f"/v1/sandboxes/{sid}/files", json={"path": "/workspace/m.txt", "content": "hi"})
        r = c.post(f"/v1/sandboxes/{sid}/commands",
                   json={"command": ["cat", "/workspace/m.txt"], "cwd": None, "env": None})  # fmt: skip
        e = c.post(f"/v1/sandboxes/{sid}/files/edit",
                   json={"path": "/workspace/m.txt", "old": "hi", "new": "ho", "count": None})  # fmt: skip
    assert w.status_code == 200, w.text
    assert r.status_code == 200 and r.json()["stdout"] == "hi", r.text
    assert e.status_code == 200 and e.json()["replacements"] == 1, e.text


def test_mcp_clients_are_served_each_tools_model_schema(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    """tools/list over the wire: each inputSchema is the tool's argument model's schema,
    with this gateway's configured limits written over the configured arguments."""
    _, token = session
    limits = gw.app.state.parts.gateway.limits
    with gw.client(token) as c:
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        listed = c.post("/mcp", json=rpc, headers=MCP_HEADERS).json()["result"]["tools"]
    assert sorted(t["name"] for t in listed) == sorted(ARGS)
    for served in listed:
        model = configured_schema(input_schema(ARGS[served["name"]]), limits)
        assert served["inputSchema"] == model, served["name"]
