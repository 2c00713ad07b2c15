"""Hostile input to the gateway over HTTP: every refusal is a clear 4xx with the typed
error body, answered once, with nothing in the server log (no traceback, no "response
already completed").

Covers JSON nested 100k deep (and 5,000 deep inside ``arguments``), lone surrogates in a
path, an environment key or value, argv and stdin text, integers past 64 bits, 1e999,
NaN and Infinity, on each way a body is parsed (the tool fast path, FastAPI's body
routes, the model endpoint, MCP before its SDK); integer query parameters and
``Last-Event-ID`` past 64 bits or negative; an oversized body without Content-Length on
every kind of route; and, for the class, that every body route decodes with the bounded
decoder and every integer parameter of the API has bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from agentbox.gateway.jsonbody import JsonRoute
from fakeproviders import FakeProvider
from gateway_harness import RunningGateway, ServerLog, running_gateway, server_log_handler

JSON = {"content-type": "application/json"}
MCP_HEADERS = {**JSON, "accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-11-25"}  # fmt: skip


@pytest.fixture(scope="module")
def server_log() -> Iterator[ServerLog]:
    with server_log_handler() as handler:
        yield handler


@pytest.fixture
def clean_log(server_log: ServerLog) -> Iterator[None]:
    server_log.records.clear()
    yield
    assert not server_log.records, server_log.lines()


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, agentbox_home: Path, host_ready: None,
       server_log: ServerLog) -> Iterator[RunningGateway]:  # fmt: skip
    with FakeProvider("openai") as fake:
        extra = f"""
providers:
  - name: fake
    kind: openai
    base_url: {fake.base_url}
    api_key_env: FAKE_OPENAI_KEY
    models: [fake-model]
    prices: {{fake-model: {{input_per_mtok: 1, output_per_mtok: 1}}}}
"""
        with running_gateway(agentbox_home, tmp_path_factory.mktemp("badinput"),
                             env={"FAKE_OPENAI_KEY": "k"}, extra_yaml=extra) as running:  # fmt: skip
            yield running


@pytest.fixture(scope="module")
def session(gw: RunningGateway) -> Iterator[tuple[str, str]]:
    with gw.operator() as op:
        sid = op.post("/v1/sandboxes", json={"memory": "64MiB", "disk": "32MiB"}).json()["id"]
        token = op.post("/v1/tokens", json={"sandbox": sid}).json()["token"]
        yield sid, token
        op.delete(f"/v1/sandboxes/{sid}")


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# (name, fragment, what the message names): each fragment is spliced into a body that is
# valid for its route where the marker @ stands.
HOSTILE = {
    "deep-100k": (deep(100_000), "nests deeper"),
    "deep-5000": (deep(5_000), "nests deeper"),
    "surrogate": ('"/workspace/\\ud800"', "surrogate"),
    "low-surrogate": ('"x\\udc80"', "surrogate"),
    "huge-int": ("9" * 30, "64 bits"),
    "digits-past-4300": ("9" * 5_000, "64 bits"),
    "inf": ("1e999", "out of range"),
    "nan": ("NaN", "NaN"),
    "infinity": ("-Infinity", "Infinity"),
}


def routes(sid: str) -> dict[str, tuple[str, str, str]]:
    """(method, path, body template with @ where the hostile fragment goes)."""
    return {
        "tool-path": ("POST", "/v1/tools/fs_read", '{"arguments": {"path": @}}'),
        "tool-env": ("POST", "/v1/tools/terminal_run",
                         '{"arguments": {"command": "true", "env": {"A": @}}}'),
        "rest-command": ("POST", f"/v1/sandboxes/{sid}/commands",
                         '{"command": "true", "env": {"A": "x"}, "stdin": @}'),
        "rest-write": ("PUT", f"/v1/sandboxes/{sid}/files",
                       '{"path": @, "content": "x"}'),
        "chat": ("POST", "/v1/chat/completions",
                 '{"model": "fake-model", "messages": [{"role": "user", "content": @}]}'),
        "messages": ("POST", "/v1/messages", '{"model": "fake-model", "max_tokens": 5, '
                     '"messages": [{"role": "user", "content": @}]}'),
    }  # fmt: skip


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
@pytest.mark.parametrize(
    "route", ["tool-path", "tool-env", "rest-command", "rest-write", "chat", "messages"]
)
def test_hostile_bodies_are_typed_400s(
    gw: RunningGateway, session: tuple[str, str], route: str, hostile: str
) -> None:
    sid, token = session
    method, path, template = routes(sid)[route]
    fragment, named = HOSTILE[hostile]
    with gw.client(token) as c:
        r = c.request(method, path, content=template.replace("@", fragment), headers=JSON)
    assert r.status_code == 400, (r.status_code, r.text[:500])
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and named in error["message"], error
    assert set(error) == {"code", "message", "details"}


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/v1/tools/fs_read", '{"arguments": {"path": "/x\\ud800"}}', "arguments.path"),
        ("POST", "/v1/tools/terminal_run",
         '{"arguments": {"command": "true", "env": {"\\ud800": "x"}}}', "arguments.env"),
        ("POST", "/v1/tools/terminal_run",
         '{"arguments": {"command": "true", "env": {"A": "\\udfff"}}}', "arguments.env.A"),
        ("POST", "/v1/tools/terminal_run", '{"arguments": {"command": "echo \\ud800"}}',
         "arguments.command"),
        ("POST", "/v1/tools/process_start",
         '{"arguments": {"command": "cat", "stdin": true, "cwd": "/\\ud800"}}',
         "arguments.cwd"),
        ("POST", "/v1/sandboxes/{sid}/commands", '{"command": "cat", "stdin": "\\ud800"}',
         "stdin"),
        ("POST", "/v1/sandboxes/{sid}/files/move",
         '{"path": "/workspace/a", "destination": "/workspace/\\ud800"}', "destination"),
    ],
)  # fmt: skip
def test_lone_surrogates_name_the_field(
    gw: RunningGateway, session: tuple[str, str], method: str, path: str, body: str, field: str
) -> None:
    sid, token = session
    with gw.client(token) as c:
        r = c.request(method, path.format(sid=sid), content=body, headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and error["details"]["field"] == field, error
    assert error["message"].startswith(f"{field}:"), error


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("hostile", sorted(HOSTILE))
def test_mcp_bodies_are_checked_before_the_sdk(
    gw: RunningGateway, session: tuple[str, str], hostile: str
) -> None:
    """A JSON-RPC parse error (what an MCP client understands) whose data is the typed
    error: the SDK's own decoder takes huge integers, inf and NaN."""
    fragment, named = HOSTILE[hostile]
    body = ('{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
            '{"name": "fs_read", "arguments": {"path": @}}}').replace("@", fragment)  # fmt: skip
    with gw.client(session[1]) as c:
        r = c.post("/mcp", content=body, headers=MCP_HEADERS)
    assert r.status_code == 400, r.text[:500]
    answer = r.json()
    assert answer["jsonrpc"] == "2.0" and answer["error"]["code"] == -32700, answer
    assert answer["error"]["data"]["code"] == "invalid_request", answer
    assert named in answer["error"]["data"]["message"], answer


@pytest.mark.usefixtures("clean_log")
def test_mcp_still_answers_a_valid_body(gw: RunningGateway, session: tuple[str, str]) -> None:
    body = '{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}}'
    with gw.client(session[1]) as c:
        r = c.post("/mcp", content=body, headers=MCP_HEADERS)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["id"] == 7 and r.json()["result"]["tools"], r.text[:500]


HUGE = "99999999999999999999999999"


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize("value", [HUGE.encode(), b"-1", b"1e3", b"\xb2", b"+5"])
def test_last_event_id_is_bounded(gw: RunningGateway, value: bytes) -> None:
    """Was 200 and then a stream cut by OverflowError."""
    with gw.operator() as op:
        r = op.get("/v1/events", params={"follow": "false"}, headers={"Last-Event-ID": value})
    assert r.status_code == 400, (r.status_code, r.text)
    error = r.json()["error"]
    assert error["code"] == "invalid_request" and "Last-Event-ID" in error["message"], error


@pytest.mark.usefixtures("clean_log")
def test_last_event_id_in_range_still_resumes(gw: RunningGateway) -> None:
    with gw.operator() as op:
        r = op.get("/v1/events", params={"follow": "false"}, headers={"Last-Event-ID": "0"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize(
    "path",
    [
        "/v1/events?follow=false&after={huge}",
        "/v1/events?follow=false&after=-1",
        "/v1/audit?since_seq={huge}",
        "/v1/audit?since_seq=-5",
        "/v1/audit?limit={huge}",
        "/v1/sandboxes/{sid}/files?path=/etc/hostname&offset={huge}",
        "/v1/sandboxes/{sid}/files?path=/etc/hostname&length={huge}",
        "/v1/sandboxes/{sid}/files?path=/etc/hostname&offset=-1",
        "/v1/sandboxes/{sid}/processes/p-0/output?offset={huge}",
        "/v1/sandboxes/{sid}/processes/p-0/output?limit={huge}",
        "/v1/sandboxes/{sid}/files/list?depth={huge}",
        "/v1/sandboxes/{sid}/ports/{huge}/x",
        "/v1/tasks?limit={huge}",
    ],
)
def test_integer_query_parameters_are_bounded(
    gw: RunningGateway, session: tuple[str, str], path: str
) -> None:
    with gw.operator() as op:
        r = op.get(path.format(sid=session[0], huge=HUGE))
    assert r.status_code == 400, (r.status_code, r.text)
    assert r.json()["error"]["code"] == "invalid_request"


def _chunks(total: int) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length), so only the streamed cap can stop it."""
    sent = 0
    while sent < total:
        yield b"x" * 8192
        sent += 8192


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize(
    ("method", "path", "operator"),
    [
        ("POST", "/v1/tools/fs_read", False),
        ("POST", "/v1/sandboxes/{sid}/commands", False),
        ("POST", "/v1/chat/completions", False),
        ("POST", "/mcp", False),
        ("POST", "/v1/sandboxes/{sid}/files/upload?dest=/workspace/up", False),
        ("POST", "/v1/sandboxes/{sid}/ports/8080/x", False),
        ("POST", "/v1/tasks", True),
        ("POST", "/v1/tokens", True),
    ],
)
def test_an_oversized_body_is_answered_413_once(
    gw: RunningGateway, session: tuple[str, str], method: str, path: str, operator: bool
) -> None:
    """Was 413 (or 400, or 500) plus "response already completed" in the log: the app's
    own answer to the refused read and the guard's 413 both went out."""
    sid, token = session
    headers = MCP_HEADERS if path == "/mcp" else JSON
    with gw.client(gw.operator_token if operator else token) as c:
        r = c.request(method, path.format(sid=sid), content=_chunks(9 << 20), headers=headers)
    assert r.status_code == 413, (r.status_code, r.text[:300])
    assert r.json()["error"]["code"] == "limit_exceeded"


def test_every_body_route_uses_the_bounded_decoder(gw: RunningGateway) -> None:
    """The class: a route added later with a JSON body cannot fall back to json.loads."""
    plain = [
        f"{sorted(r.methods)} {r.path}"
        for r in gw.app.routes
        if isinstance(r, APIRoute) and r.body_field is not None and not isinstance(r, JsonRoute)
    ]
    assert not plain, f"body routes outside JsonRoute: {plain}"


def test_every_integer_parameter_has_bounds(gw: RunningGateway) -> None:
    unbounded = []
    for path, operations in gw.app.openapi()["paths"].items():
        for method, operation in operations.items():
            for parameter in operation.get("parameters", []):
                schema: dict[str, Any] = parameter.get("schema", {})
                types = [schema, *schema.get("anyOf", [])]
                if any(t.get("type") == "integer" for t in types):
                    bounded = [t for t in types if "minimum" in t and "maximum" in t]
                    if not bounded:
                        unbounded.append(f"{method.upper()} {path} {parameter['name']}")
    assert not unbounded, f"integer parameters without minimum and maximum: {unbounded}"


@pytest.mark.usefixtures("clean_log")
def test_a_file_name_that_is_not_utf8_is_listed_not_a_500(
    gw: RunningGateway, session: tuple[str, str]
) -> None:
    """A name made inside the sandbox (byte 0xff) decodes with surrogateescape: the
    listing was a 500 (REST) or a connection cut mid-response (the tool path)."""
    sid, token = session
    with gw.client(token) as c:
        made = c.post("/v1/tools/terminal_run", json={"arguments": {
            "command": "mkdir -p /workspace/odd && printf x > /workspace/odd/$(printf '\\377')name"}})  # fmt: skip
        assert made.status_code == 200 and made.json()["exit_code"] == 0, made.text
        listed = [
            c.get(f"/v1/sandboxes/{sid}/files/list", params={"path": "/workspace/odd"}),
            c.post("/v1/tools/fs_list", json={"arguments": {"path": "/workspace/odd"}}),
        ]
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "fs_list", "arguments": {"path": "/workspace/odd"}}}  # fmt: skip
        mcp = c.post("/mcp", json=rpc, headers=MCP_HEADERS)
    for r in listed:
        assert r.status_code == 200, r.text[:300]
        assert [e["name"] for e in r.json()["entries"]] == ["\ufffdname"]
    assert mcp.status_code == 200 and "error" not in mcp.json(), mcp.text[:300]
    assert mcp.json()["result"]["structuredContent"]["entries"][0]["name"] == "\ufffdname"


@pytest.mark.usefixtures("clean_log")
@pytest.mark.parametrize(
    "spec",
    [{"disk": 2**63 - 1}, {"disk": "17TiB"}, {"memory": 2**63 - 1}, {"lifetime": 1e308},
     {"lifetime": "5000d"}, {"idle_timeout": 2**63 - 1}],
)  # fmt: skip
def test_sandbox_sizes_and_durations_are_bounded(gw: RunningGateway, spec: dict[str, Any]) -> None:
    """Were a 500 (mkfs or the sandbox init refused them) or a 503 capacity answer."""
    with gw.operator() as op:
        r = op.post("/v1/sandboxes", json=spec)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert r.json()["error"]["code"] == "invalid_request"
